"""The models lmbridge offers its clients, the same on every front: one entry per configured agent (its default
model), and one more per model the agent offers in its session options (``agent/model``) — or, for an agent on the
editor's models (``model_source``), per model an editor shares (``agent@model``) —, each with the options a client
may set per request and the agent's slash commands.

Owns building those entries from the agents' configuration and what the catalog learned of them
(``session.catalog``), and resolving a requested model id to an agent and the option values choosing it implies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bridge import __version__
from bridge.config import AgentConfig
from bridge.service.shared_models import SharedModel
from session.catalog import AgentCatalog, AgentOffer, Command
from session.options import ConfigOption
from wire.errors import UnknownModel

__all__ = ["ModelEntry", "model_entries", "resolve_model"]

SEPARATOR = "/"  # agent ids cannot contain it (bridge.config), model values can
ON = "@"  # ``agent@model``: the agent thinking with the editor's model ``model``; agent ids cannot contain it either


@dataclass(frozen=True, slots=True)
class ModelEntry:
    id: str
    name: str
    agent: AgentConfig
    settings: tuple[tuple[str, Any], ...] = ()  # the option values choosing this entry sets (its model)
    options: tuple[ConfigOption, ...] = ()  # what a client may set per request (``options.modelOptions``)
    commands: tuple[Command, ...] = ()
    thinks_with: str = ""  # "editor:<model id>": the editor's model this entry has the agent think with

    def describe(self) -> dict[str, Any]:
        """The entry as ``lm/models`` lists it (docs/protocol.md)."""
        agent = self.agent
        entry: dict[str, Any] = {
            "id": self.id,
            "name": self.name,
            "family": "acp",
            "version": __version__,
            "maxInputTokens": agent.max_input_tokens,
            "maxOutputTokens": agent.max_output_tokens,
            "capabilities": {"toolCalling": True, "imageInput": agent.image_input},
            "agent": agent.id,
        }
        if self.thinks_with:
            entry["editorModel"] = self.thinks_with.partition(":")[2]
        if self.options:
            entry["options"] = [_describe_option(option) for option in self.options]
        if self.commands:
            entry["commands"] = [_describe_command(command) for command in self.commands]
        return entry


def model_entries(
    agents: Mapping[str, AgentConfig], catalog: AgentCatalog, shared: Sequence[SharedModel] = ()
) -> list[ModelEntry]:
    """Every entry, agent by agent: its default entry first, then one per model it offers — or, for an agent on the
    editor's models, one per model of ``shared`` (what editors share; the agent's own choice of model would not
    change which model answers)."""
    entries: list[ModelEntry] = []
    for agent in agents.values():
        offer = catalog.offer(agent.id)
        entries.append(ModelEntry(agent.id, agent.name, agent, (), offer.options, offer.commands))
        if agent.model_source:
            entries += [_on_editor_model(agent, offer, model.id, model.name) for model in shared]
            continue
        model = offer.model_option
        for choice in model.choices if model is not None else ():
            entries.append(_model_entry(agent, offer, choice.value))
    return entries


def resolve_model(
    model_id: str, agents: Mapping[str, AgentConfig], catalog: AgentCatalog, shared: Sequence[SharedModel] = ()
) -> ModelEntry:
    """The entry a request's model id names. ``agent/model`` is accepted before the catalog knows the agent's
    models (a client that remembers it from an earlier run): the session then checks the value against what the
    agent offers; ``agent@model`` for an agent on the editor's models whatever is shared now (the agent's model
    request then says what is). ``UnknownModel`` lists the models otherwise."""
    agent = agents.get(model_id)
    if agent is not None:
        offer = catalog.offer(agent.id)
        return ModelEntry(agent.id, agent.name, agent, (), offer.options, offer.commands)
    on_id, on, editor_model = model_id.partition(ON)
    agent = agents.get(on_id)
    if agent is not None and on and editor_model and agent.model_source:
        name = next((model.name for model in shared if model.id == editor_model), editor_model)
        return _on_editor_model(agent, catalog.offer(agent.id), editor_model, name)
    agent_id, separator, value = model_id.partition(SEPARATOR)
    agent = agents.get(agent_id)
    if agent is not None and separator and value:
        offer = catalog.offer(agent_id)
        if offer.model_option is None or offer.model(value) is not None:
            return _model_entry(agent, offer, value)
    raise UnknownModel(model_id, [entry.id for entry in model_entries(agents, catalog, shared)])


def _on_editor_model(agent: AgentConfig, offer: AgentOffer, model_id: str, name: str) -> ModelEntry:
    """The entry having an agent on the editor's models think with the editor's model ``model_id``."""
    return ModelEntry(
        f"{agent.id}{ON}{model_id}",
        f"{agent.name} on {name}",
        agent,
        (),
        offer.options,
        offer.commands,
        thinks_with=f"editor:{model_id}",
    )


def _model_entry(agent: AgentConfig, offer: AgentOffer, value: str) -> ModelEntry:
    """The entry choosing model ``value`` of the agent (option ``model`` when the catalog does not know it yet)."""
    model = offer.model_option
    choice = offer.model(value)
    others = tuple(option for option in offer.options if option is not model)
    return ModelEntry(
        f"{agent.id}{SEPARATOR}{value}",
        f"{agent.name}: {choice.name if choice is not None else value}",
        agent,
        ((model.id if model is not None else "model", value),),
        others,
        offer.commands,
    )


def _describe_option(option: ConfigOption) -> dict[str, Any]:
    described: dict[str, Any] = {"id": option.id, "name": option.name, "type": option.kind}
    if option.category:
        described["category"] = option.category
    if option.description:
        described["description"] = option.description
    if option.current is not None:
        described["default"] = option.current
    if option.kind == "select":
        described["values"] = [
            {"value": c.value, "name": c.name, **({"description": c.description} if c.description else {})}
            for c in option.choices
        ]
    return described


def _describe_command(command: Command) -> dict[str, Any]:
    described: dict[str, Any] = {"name": command.name, "description": command.description}
    if command.hint:
        described["hint"] = command.hint
    return described
