"""What agents offer (session.catalog) and the model entries built from it (bridge.service.models)."""

from __future__ import annotations

import pytest

from bridge.config import AgentConfig
from bridge.service.models import model_entries, resolve_model
from session.catalog import AgentCatalog, AgentOffer, Command
from wire.errors import UnknownModel

OPENED = {
    "sessionId": "s1",
    "configOptions": [
        {
            "id": "model",
            "name": "Model",
            "category": "model",
            "type": "select",
            "currentValue": "default",
            "options": [
                {"value": "default", "name": "Default (recommended)", "description": "Opus for planning"},
                {"value": "sonnet", "name": "Sonnet"},
            ],
        },
        {
            "id": "mode",
            "name": "Mode",
            "category": "mode",
            "type": "select",
            "currentValue": "default",
            "options": [{"value": "default", "name": "Default"}, {"value": "plan", "name": "Plan"}],
        },
        {"id": "fast", "name": "Fast", "type": "boolean", "currentValue": False},
    ],
}
COMMANDS = {
    "sessionUpdate": "available_commands_update",
    "availableCommands": [
        {"name": "review", "description": "Review the changes", "input": {"hint": "what to focus on"}},
        {"name": "compact", "description": "Compact the conversation"},
        {"description": "no name: skipped"},
    ],
}
CLAUDE = AgentConfig(id="claude", name="Claude Code", command="claude-agent-acp")


def learned() -> tuple[AgentCatalog, list[str]]:
    changed: list[str] = []
    catalog = AgentCatalog(on_change=changed.append)
    assert catalog.learn_session("claude", OPENED)
    assert catalog.learn_update("claude", COMMANDS)
    return catalog, changed


def test_a_session_teaches_the_options_and_its_commands_the_commands() -> None:
    catalog, changed = learned()
    offer = catalog.offer("claude")
    assert [o.id for o in offer.options] == ["model", "mode", "fast"]
    assert offer.model_option is not None and offer.model_option.values == ("default", "sonnet")
    assert offer.commands == (
        Command("review", "Review the changes", "what to focus on"),
        Command("compact", "Compact the conversation"),
    )
    assert changed == ["claude", "claude"]
    # The same again changes nothing, and says so.
    assert not catalog.learn_session("claude", OPENED)
    assert not catalog.learn_update("claude", COMMANDS)
    assert not catalog.learn_update("claude", {"sessionUpdate": "agent_message_chunk"})
    assert changed == ["claude", "claude"]


def test_a_sessions_own_changes_are_not_the_agents_defaults() -> None:
    catalog, changed = learned()
    update = {"sessionUpdate": "config_option_update", "configOptions": [
        {**OPENED["configOptions"][0], "currentValue": "sonnet"}, *OPENED["configOptions"][1:]]}  # fmt: skip
    assert not catalog.learn_update("claude", update)  # only the current value moved: same offer
    assert catalog.offer("claude").model_option.current == "default"  # type: ignore[union-attr]
    grown = {**update, "configOptions": [*update["configOptions"], {"id": "effort", "name": "Effort",
             "type": "select", "currentValue": "high", "options": [{"value": "high", "name": "High"}]}]}  # fmt: skip
    assert catalog.learn_update("claude", grown)  # a new option: the list changed
    assert [o.id for o in catalog.offer("claude").options] == ["model", "mode", "fast", "effort"]
    assert changed[-1] == "claude"


def test_an_agent_with_modes_only_offers_a_mode_option() -> None:
    catalog = AgentCatalog()
    opened = {"sessionId": "g", "modes": {"currentModeId": "default", "availableModes": [
        {"id": "default", "name": "Default"}, {"id": "plan", "name": "Plan", "description": "Read only"}]}}  # fmt: skip
    assert catalog.learn_session("gemini", opened)
    (mode,) = catalog.offer("gemini").options
    assert (mode.id, mode.category, mode.current, mode.values) == ("mode", "mode", "default", ("default", "plan"))
    assert mode.choices[1].description == "Read only"
    assert catalog.offer("gemini").model_option is None


def test_an_offer_survives_its_json_form() -> None:
    catalog, _ = learned()
    offer = catalog.offer("claude")
    assert AgentOffer.from_json(offer.to_json()) == offer
    assert AgentOffer.from_json("garbage") == AgentOffer()
    assert AgentOffer.from_json({"options": [{"id": 3}], "commands": [7, {"name": ""}]}) == AgentOffer()


def test_model_entries_one_per_agent_then_one_per_model() -> None:
    catalog, _ = learned()
    agents = {"claude": CLAUDE, "codex": AgentConfig(id="codex", name="Codex", command="codex-acp")}
    entries = model_entries(agents, catalog)
    assert [(e.id, e.name) for e in entries] == [
        ("claude", "Claude Code"),
        ("claude/default", "Claude Code: Default (recommended)"),
        ("claude/sonnet", "Claude Code: Sonnet"),
        ("codex", "Codex"),
    ]
    default, _, sonnet, codex = entries
    assert [o.id for o in default.options] == ["model", "mode", "fast"]
    assert sonnet.settings == (("model", "sonnet"),) and [o.id for o in sonnet.options] == ["mode", "fast"]
    described = sonnet.describe()
    assert described["agent"] == "claude" and [c["name"] for c in described["commands"]] == ["review", "compact"]
    assert described["commands"][0]["hint"] == "what to focus on"
    values = [{"value": "default", "name": "Default"}, {"value": "plan", "name": "Plan"}]
    mode = {"id": "mode", "name": "Mode", "type": "select", "category": "mode", "default": "default", "values": values}
    assert described["options"][0] == mode
    assert described["options"][1] == {"id": "fast", "name": "Fast", "type": "boolean", "default": False}
    assert "options" not in codex.describe() and "commands" not in codex.describe()


def test_resolving_a_model_id() -> None:
    catalog, _ = learned()
    agents = {"claude": CLAUDE, "codex": AgentConfig(id="codex", name="Codex", command="codex-acp")}
    assert resolve_model("claude", agents, catalog).settings == ()
    assert resolve_model("claude/sonnet", agents, catalog).settings == (("model", "sonnet"),)
    # Before the catalog knows an agent's models, agent/model is taken on trust (the session checks it).
    assert resolve_model("codex/gpt-5/high", agents, catalog).settings == (("model", "gpt-5/high"),)
    for unknown in ("claude/opus", "nobody", "nobody/sonnet", "claude/"):
        with pytest.raises(UnknownModel) as error:
            resolve_model(unknown, agents, catalog)
        assert "claude/sonnet" in str(error.value)


def test_an_agent_with_unstable_models_offers_them_as_its_model_option() -> None:
    catalog = AgentCatalog()
    opened = {"sessionId": "g", "models": {"currentModelId": "gemini-2.5-flash", "availableModels": [
        {"modelId": "auto", "name": "Auto"}, {"modelId": "gemini-2.5-pro", "name": "gemini-2.5-pro"}]}}  # fmt: skip
    assert catalog.learn_session("gemini", opened)
    gemini = AgentConfig(id="gemini", name="Gemini CLI", command="gemini")
    ids = [entry.id for entry in model_entries({"gemini": gemini}, catalog)]
    assert ids == ["gemini", "gemini/auto", "gemini/gemini-2.5-pro"]
    # A config update (it lists no model) keeps the model option read from ``models``.
    assert not catalog.learn_update("gemini", {"sessionUpdate": "config_option_update", "configOptions": []})
    assert catalog.offer("gemini").model_option is not None
