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

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from bridge.errors import InvalidParams

__all__ = [
    "Choice",
    "ConfigOption",
    "SessionOptions",
    "read_choices",
    "read_config_options",
    "read_models",
    "read_modes",
    "request_label",
]

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

    @property
    def values(self) -> tuple[str, ...]:
        return tuple(choice.value for choice in self.choices)

    def holding(self, value: Any) -> ConfigOption:
        return replace(self, current=value)


class SessionOptions:
    """What one ACP session can be set to, and what it is set to now."""

    def __init__(self) -> None:
        self._options: dict[str, ConfigOption] = {}
        self._mode: str | None = None  # the session's current mode (ACP ``modes``), when it has modes
        self._modes: tuple[str, ...] = ()
        self._model: str | None = None  # the same for the unstable ``models`` (``session/set_model``)
        self._models: tuple[str, ...] = ()

    @classmethod
    def from_session(cls, result: Any) -> SessionOptions:
        """From the answer to ``session/new`` (or ``/load``, ``/resume``)."""
        options = cls()
        if isinstance(result, dict):
            options._take_config(result.get("configOptions"))
            options._mode, modes = read_modes(result.get("modes"))
            options._modes = tuple(choice.value for choice in modes)
            options._model, models = read_models(result.get("models"))
            options._models = tuple(choice.value for choice in models)
        return options

    def observe(self, update: Mapping[str, Any]) -> None:
        """Follow an agent's ``config_option_update`` or ``current_mode_update``; other updates are ignored."""
        kind = update.get("sessionUpdate")
        if kind == "config_option_update":
            self._take_config(update.get("configOptions"))
        elif kind == "current_mode_update" and isinstance(update.get("currentModeId"), str):
            self._mode = update["currentModeId"]
            mode = self._options.get("mode")
            if mode is not None and mode.kind == "select" and self._mode in mode.values:
                self._options["mode"] = mode.holding(self._mode)

    def answered(self, method: str, params: Mapping[str, Any], result: Any) -> None:
        """Take the agent's answer to a request ``requests`` made: the option now holds the value asked for (and
        ``session/set_config_option`` answers with the full set of options, which may have changed with it)."""
        if method == "session/set_mode":
            self._mode = params["modeId"]
            return
        if method == "session/set_model":
            self._model = params["modelId"]
            return
        option = self._options.get(params["configId"])
        if option is not None:
            self._options[option.id] = option.holding(params["value"])
        if isinstance(result, dict) and isinstance(result.get("configOptions"), list):
            self._take_config(result["configOptions"])

    def requests(self, session_id: str, wanted: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """The requests that make the session hold ``wanted`` (option id → value), in order; none for values it
        already holds. ``InvalidParams`` naming the option when the agent does not offer it or that value."""
        out: list[tuple[str, dict[str, Any]]] = []
        for key, value in wanted.items():
            option = self._options.get(key)
            if option is not None:
                self._check(option, value)
                if value != option.current:
                    params: dict[str, Any] = {"sessionId": session_id, "configId": key, "value": value}
                    if option.kind == "boolean":
                        params["type"] = "boolean"
                    out.append(("session/set_config_option", params))
            elif key == "mode" and self._modes:
                if value not in self._modes:
                    raise InvalidParams(f"{_FIELD}.mode", f"must be one of {', '.join(self._modes)}")
                if value != self._mode:
                    out.append(("session/set_mode", {"sessionId": session_id, "modeId": value}))
            elif key == "model" and self._models:
                if value not in self._models and value != self._model:
                    raise InvalidParams(f"{_FIELD}.model", f"must be one of {', '.join(self._models)}")
                if value != self._model:
                    out.append(("session/set_model", {"sessionId": session_id, "modelId": value}))
            else:
                raise InvalidParams(f"{_FIELD}.{key}", f"the agent offers no such option; {self.describe()}")
        return out

    def describe(self) -> str:
        """What the agent offers, for error messages."""
        pieces = [
            f"{o.id} ({', '.join(o.values)})" if o.kind == "select" else f"{o.id} (true, false)"
            for o in self._options.values()
        ]
        if self._modes and "mode" not in self._options:
            pieces.append(f"mode ({', '.join(self._modes)})")
        if self._models and "model" not in self._options:
            pieces.append(f"model ({', '.join(self._models)})")
        return "it offers: " + "; ".join(pieces) if pieces else "it offers none"

    def current(self) -> dict[str, Any]:
        """Option id → current value (``mode`` included when the agent has modes only)."""
        values = {o.id: o.current for o in self._options.values()}
        if self._modes and "mode" not in values and self._mode is not None:
            values["mode"] = self._mode
        if self._models and "model" not in values and self._model is not None:
            values["model"] = self._model
        return values

    # -- reading ------------------------------------------------------------------------------------------------

    def _take_config(self, config: Any) -> None:
        if isinstance(config, list):
            self._options = {option.id: option for option in read_config_options(config)}

    @staticmethod
    def _check(option: ConfigOption, value: Any) -> None:
        where = f"{_FIELD}.{option.id}"
        if option.kind == "boolean":
            if not isinstance(value, bool):
                raise InvalidParams(where, "must be true or false")
        elif not isinstance(value, str) or value not in option.values:
            raise InvalidParams(where, f"must be one of {', '.join(option.values)}")


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
