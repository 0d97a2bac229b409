"""A session's configurable options as the agent announced them, and what to send so that a request's choices hold
before its prompt starts (sans-IO).

Owns reading the agent's ``configOptions`` (ACP ``SessionConfigOption``: select or boolean, from ``session/new``,
``/load``, ``/resume``, the answer to ``session/set_config_option`` and ``config_option_update``), its older
``modes`` (``current_mode_update``) and the unstable ``models`` (Gemini CLI), checking a client's choices against
them (an unknown option or value is an ``InvalidParams`` that lists what the agent offers), and turning the choices
that differ from the current values into the ACP requests to send: ``session/set_config_option``, or
``session/set_mode`` / ``session/set_model`` for a ``mode`` / ``model`` the agent only offers that way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from wire.errors import InvalidParams

__all__ = [
    "Choice",
    "ConfigOption",
    "SessionOptions",
    "fallback_options",
    "offered_options",
    "read_choices",
    "read_config_options",
    "read_models",
    "read_modes",
    "request_label",
    "with_config",
]

SET_CONFIG_OPTION, SET_MODE, SET_MODEL = "session/set_config_option", "session/set_mode", "session/set_model"

_FIELD = "options.modelOptions"  # where a client's choices are, for error messages


@dataclass(frozen=True, slots=True)
class Choice:
    """One value a select option (or the agent's modes) can take."""

    value: str
    name: str
    description: str | None = None


@dataclass(frozen=True, slots=True)
class ConfigOption:
    """One of the agent's ACP ``SessionConfigOption``, as lmbridge can set it."""

    id: str
    kind: str  # "select" or "boolean"
    current: Any
    choices: tuple[Choice, ...] = ()  # the select's values (flattened from groups); () for a boolean
    name: str = ""
    category: str | None = None  # ACP's UX hint: "model", "mode", "thought_level", "model_config", "_custom"…
    description: str | None = None
    # How it is set: a config option, or the agent's ``modes`` / unstable ``models`` (not part of what it offers).
    setter: str = field(default=SET_CONFIG_OPTION, compare=False)

    @property
    def values(self) -> tuple[str, ...]:
        return tuple(choice.value for choice in self.choices)

    def holding(self, value: Any) -> ConfigOption:
        return replace(self, current=value)


class SessionOptions:
    """What one ACP session can be set to, and what it is set to now."""

    def __init__(self, options: Iterable[ConfigOption] = (), fallbacks: Iterable[ConfigOption] = ()) -> None:
        """``fallbacks``: the session's modes / models, for when its config options do not list ``mode``/``model``."""
        self._options: dict[str, ConfigOption] = {option.id: option for option in options}
        self._fallbacks: dict[str, ConfigOption] = {option.id: option for option in fallbacks}

    @classmethod
    def from_session(cls, result: Any) -> SessionOptions:
        """From the answer to ``session/new`` (or ``/load``, ``/resume``)."""
        fallbacks = fallback_options(result)
        config = result.get("configOptions") if isinstance(result, dict) else None
        return cls(with_config(fallbacks, config), fallbacks)

    def observe(self, update: Mapping[str, Any]) -> None:
        """Follow an agent's ``config_option_update`` or ``current_mode_update``; other updates are ignored."""
        kind = update.get("sessionUpdate")
        if kind == "config_option_update":
            self._take_config(update.get("configOptions"))
        elif kind == "current_mode_update" and isinstance(update.get("currentModeId"), str):
            self._hold("mode", update["currentModeId"], only_offered=True)

    def answered(self, method: str, params: Mapping[str, Any], result: Any) -> None:
        """Take the agent's answer to a request ``requests`` made: the option now holds the value asked for (and
        ``session/set_config_option`` answers with the full set of options, which may have changed with it)."""
        if method == SET_MODE:
            self._hold("mode", params["modeId"])
        elif method == SET_MODEL:
            self._hold("model", params["modelId"])
        else:
            self._hold(params["configId"], params["value"])
            if isinstance(result, dict):
                self._take_config(result.get("configOptions"))

    def requests(self, session_id: str, wanted: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """The requests that make the session hold ``wanted`` (option id → value), in order; none for values it
        already holds. ``InvalidParams`` naming the option when the agent does not offer it or that value."""
        out: list[tuple[str, dict[str, Any]]] = []
        for key, value in wanted.items():
            option = self._options.get(key)
            if option is None:
                raise InvalidParams(f"{_FIELD}.{key}", f"the agent offers no such option; {self.describe()}")
            self._check(option, value)
            if value == option.current:
                continue
            params: dict[str, Any] = {"sessionId": session_id}
            if option.setter == SET_MODE:
                params["modeId"] = value
            elif option.setter == SET_MODEL:
                params["modelId"] = value
            else:
                params.update(configId=key, value=value)
                if option.kind == "boolean":
                    params["type"] = "boolean"
            out.append((option.setter, params))
        return out

    def describe(self) -> str:
        """What the agent offers, for error messages."""
        pieces = [
            f"{o.id} ({', '.join(o.values)})" if o.kind == "select" else f"{o.id} (true, false)"
            for o in self._options.values()
        ]
        return "it offers: " + "; ".join(pieces) if pieces else "it offers none"

    def current(self) -> dict[str, Any]:
        """Option id → current value."""
        return {o.id: o.current for o in self._options.values() if o.current is not None}

    # -- reading ------------------------------------------------------------------------------------------------

    def _take_config(self, config: Any) -> None:
        if isinstance(config, list):
            self._options = {option.id: option for option in with_config(self._fallbacks.values(), config)}

    def _hold(self, option_id: str, value: Any, *, only_offered: bool = False) -> None:
        fallback = self._fallbacks.get(option_id)
        if fallback is not None:  # the agent's mode (or model) holds it, whether a config option also shows it
            self._fallbacks[option_id] = fallback.holding(value)
        option = self._options.get(option_id)
        if option is not None and (not only_offered or option is fallback or value in option.values):
            self._options[option_id] = option.holding(value)

    @staticmethod
    def _check(option: ConfigOption, value: Any) -> None:
        where = f"{_FIELD}.{option.id}"
        if option.kind == "boolean":
            if not isinstance(value, bool):
                raise InvalidParams(where, "must be true or false")
        # The current value is accepted even when not listed (Gemini CLI's model given on its command line).
        elif not isinstance(value, str) or (value not in option.values and value != option.current):
            raise InvalidParams(where, f"must be one of {', '.join(option.values)}")


def offered_options(opened: Any) -> list[ConfigOption]:
    """What a session can be set to, from the answer that opened it: its ``configOptions``, then a ``mode`` from its
    ``modes`` and a ``model`` from its unstable ``models`` when the config options have none."""
    config = opened.get("configOptions") if isinstance(opened, dict) else None
    return with_config(fallback_options(opened), config)


def fallback_options(opened: Any) -> list[ConfigOption]:
    """A session's ``modes`` as a ``mode`` option, its unstable ``models`` as a ``model`` option."""
    if not isinstance(opened, dict):
        return []
    options = []
    current_mode, modes = read_modes(opened.get("modes"))
    if modes:
        options.append(ConfigOption("mode", "select", current_mode, modes, "Mode", "mode", setter=SET_MODE))
    current_model, models = read_models(opened.get("models"))
    if models:
        options.append(ConfigOption("model", "select", current_model, models, "Model", "model", setter=SET_MODEL))
    return options


def with_config(fallbacks: Iterable[ConfigOption], config: Any) -> list[ConfigOption]:
    """A ``configOptions`` list's options, then the fallbacks (modes / models, which a config list does not carry)
    whose id it does not have."""
    options = read_config_options(config)
    ids = {option.id for option in options}
    return options + [o for o in fallbacks if o.id not in ids]


def read_choices(value: Any, where: str) -> tuple[tuple[str, Any], ...]:
    """A client's choices of session options (option id → a string or a boolean), as a front received them at
    ``where``; checked against what the agent offers when the session's next prompt starts."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise InvalidParams(where, "must be an object")
    if len(value) > 64:
        raise InvalidParams(where, "has more than 64 options")
    for key, choice in value.items():
        if not key or len(key) > 128:
            raise InvalidParams(where, "option ids are 1 to 128 characters")
        if not isinstance(choice, str | bool):
            raise InvalidParams(f"{where}.{key}", "must be a string or a boolean")
    return tuple(value.items())


def read_config_options(config: Any) -> list[ConfigOption]:
    """The options of an ACP ``configOptions`` list that lmbridge can set (kinds it does not know are skipped)."""
    if not isinstance(config, list):
        return []
    return [option for option in map(_read_option, config) if option is not None]


def read_modes(modes: Any) -> tuple[str | None, tuple[Choice, ...]]:
    """An ACP ``modes`` object (``SessionModeState``): the current mode id and the modes offered."""
    if not isinstance(modes, dict):
        return None, ()
    choices = []
    for mode in modes.get("availableModes") or ():
        if isinstance(mode, dict) and isinstance(mode.get("id"), str):
            choices.append(_choice(mode["id"], mode))
    current = modes.get("currentModeId")
    return (current if isinstance(current, str) else None), tuple(choices)


def read_models(models: Any) -> tuple[str | None, tuple[Choice, ...]]:
    """The unstable ACP ``models`` object (``availableModels``, ``currentModelId``; Gemini CLI): the current model id
    and the models offered."""
    if not isinstance(models, dict):
        return None, ()
    choices = []
    for model in models.get("availableModels") or ():
        if isinstance(model, dict) and isinstance(model.get("modelId"), str):
            choices.append(_choice(model["modelId"], model))
    current = models.get("currentModelId")
    return (current if isinstance(current, str) else None), tuple(choices)


def request_label(method: str, params: dict[str, Any]) -> str:
    """A request ``requests`` made, as error messages name it: ``session/set_mode (mode = 'plan')``."""
    for key, name in (("configId", None), ("modeId", "mode"), ("modelId", "model")):
        if key in params:
            option = params[key] if name is None else name
            value = params["value"] if name is None else params[key]
            return f"{method} ({option} = {value!r})"
    return method


def _choice(value: str, raw: dict[str, Any]) -> Choice:
    name = raw.get("name")
    description = raw.get("description")
    return Choice(
        value, name if isinstance(name, str) else value, description if isinstance(description, str) else None
    )


def _read_option(item: Any) -> ConfigOption | None:
    if not isinstance(item, dict) or not isinstance(item.get("id"), str):
        return None
    name = item["name"] if isinstance(item.get("name"), str) else item["id"]
    category = item["category"] if isinstance(item.get("category"), str) else None
    description = item["description"] if isinstance(item.get("description"), str) else None
    if item.get("type") == "boolean":
        current = item.get("currentValue")
        return ConfigOption(
            item["id"], "boolean", current if isinstance(current, bool) else None, (), name, category, description
        )
    if item.get("type") != "select":
        return None  # a kind this version does not know: not settable through lmbridge
    choices: list[Choice] = []
    for entry in item.get("options") or ():
        if not isinstance(entry, dict):
            continue
        if isinstance(entry.get("value"), str):
            choices.append(_choice(entry["value"], entry))
        for grouped in entry.get("options") or ():  # SessionConfigSelectGroup
            if isinstance(grouped, dict) and isinstance(grouped.get("value"), str):
                choices.append(_choice(grouped["value"], grouped))
    return ConfigOption(item["id"], "select", item.get("currentValue"), tuple(choices), name, category, description)
