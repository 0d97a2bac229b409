"""What each agent offers its clients, learned from its sessions (sans-IO): the options of its ACP ``configOptions``
(model, mode, effort, booleans; or its older ``modes``) and its slash commands (``available_commands_update``).

Owns one ``AgentOffer`` per agent id and deciding when it changed. Agents say what they offer per session, not per
process, and only once a session exists; so the catalog keeps the last offer seen from any session of the agent:
options as a new session starts with them (a session's own later changes are not the agent's defaults), commands
as last announced. The fronts turn an offer into model entries (``agent/model``) and option lists; the service
persists offers so a restarted lmbridge lists them before its first session.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .options import SET_CONFIG_OPTION, Choice, ConfigOption, offered_options, read_config_options, with_config

__all__ = ["AgentCatalog", "AgentOffer", "Command"]


@dataclass(frozen=True, slots=True)
class Command:
    """A slash command the agent accepts as the start of a prompt (ACP ``AvailableCommand``)."""

    name: str
    description: str
    hint: str | None = None  # what to type after the name, when the command takes input


@dataclass(frozen=True, slots=True)
class AgentOffer:
    options: tuple[ConfigOption, ...] = ()  # ``current``: the value a new session starts with
    commands: tuple[Command, ...] = ()

    @property
    def model_option(self) -> ConfigOption | None:
        """The select that chooses the model (category ``model``; an uncategorised option with id ``model``)."""
        for option in self.options:
            if option.kind == "select" and (
                option.category == "model" or (option.category is None and option.id == "model")
            ):
                return option
        return None

    def model(self, value: str) -> Choice | None:
        """The model choice ``value``, when the agent offers it."""
        option = self.model_option
        return next((c for c in option.choices if c.value == value), None) if option is not None else None

    def to_json(self) -> dict[str, Any]:
        return {
            "options": [
                {
                    "id": o.id,
                    "name": o.name,
                    "type": o.kind,
                    "category": o.category,
                    "description": o.description,
                    "currentValue": o.current,
                    "options": [{"value": c.value, "name": c.name, "description": c.description} for c in o.choices],
                }
                for o in self.options
            ],
            "commands": [{"name": c.name, "description": c.description, "input": c.hint} for c in self.commands],
        }

    @classmethod
    def from_json(cls, data: Any) -> AgentOffer:
        """The inverse of ``to_json`` (what does not read is left out)."""
        if not isinstance(data, dict):
            return cls()
        options = read_config_options(data.get("options"))
        commands = _read_commands(
            [
                {**c, "input": {"hint": c["input"]} if isinstance(c.get("input"), str) else None}
                for c in data.get("commands") or ()
                if isinstance(c, dict)
            ]
        )
        return cls(tuple(options), commands)


class AgentCatalog:
    """Agent id → ``AgentOffer``. The ``learn_*`` methods answer whether the offer changed."""

    def __init__(
        self, offers: Mapping[str, AgentOffer] | None = None, *, on_change: Callable[[str], None] | None = None
    ) -> None:
        """``on_change(agent_id)`` is called after an agent's offer changed."""
        self._offers: dict[str, AgentOffer] = dict(offers or {})
        self._on_change = on_change

    def offer(self, agent_id: str) -> AgentOffer:
        return self._offers.get(agent_id) or AgentOffer()

    def seed(self, agent_id: str, offer: AgentOffer) -> None:
        """Take an offer remembered from an earlier run (no change is reported)."""
        self._offers[agent_id] = offer

    def learn_session(self, agent_id: str, opened: Any) -> bool:
        """From the answer that opened a session (``session/new``, ``/load``, ``/resume``)."""
        if not isinstance(opened, dict):
            return False
        options = offered_options(opened)
        return self._set(agent_id, AgentOffer(tuple(options), self.offer(agent_id).commands))

    def learn_update(self, agent_id: str, update: Mapping[str, Any]) -> bool:
        """From a ``session/update``'s update: ``config_option_update`` (what can be set; the values a session was
        set to are not taken as defaults) or ``available_commands_update``. Other updates change nothing."""
        kind = update.get("sessionUpdate")
        before = self.offer(agent_id)
        if kind == "available_commands_update":
            return self._set(agent_id, AgentOffer(before.options, _read_commands(update.get("availableCommands"))))
        if kind == "config_option_update" and isinstance(update.get("configOptions"), list):
            defaults = {option.id: option.current for option in before.options}
            fallbacks = [o for o in before.options if o.setter != SET_CONFIG_OPTION]  # from modes / models
            options = tuple(
                option.holding(defaults[option.id]) if option.id in defaults else option
                for option in with_config(fallbacks, update["configOptions"])
            )
            return self._set(agent_id, AgentOffer(options, before.commands))
        return False

    def _set(self, agent_id: str, offer: AgentOffer) -> bool:
        if self.offer(agent_id) == offer:
            return False
        self._offers[agent_id] = offer
        if self._on_change is not None:
            self._on_change(agent_id)
        return True


def _read_commands(raw: Any) -> tuple[Command, ...]:
    commands: list[Command] = []
    for item in raw if isinstance(raw, list) else ():
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            continue
        description = item.get("description")
        given = item.get("input")
        hint = given.get("hint") if isinstance(given, dict) else None
        commands.append(
            Command(
                item["name"],
                description if isinstance(description, str) else "",
                hint if isinstance(hint, str) else None,
            )
        )
    return tuple(commands)
