"""A session's options (session.options): what an agent offers, checking a client's choices, the requests to send."""

from __future__ import annotations

import pytest

from session.options import SessionOptions, request_label
from wire.errors import InvalidParams

# As Claude Code's adapter 0.49 answers session/new (shortened), plus a boolean and a grouped select.
OPENED = {
    "sessionId": "s1",
    "modes": {"currentModeId": "default", "availableModes": [{"id": "default"}, {"id": "plan"}]},
    "configOptions": [
        {
            "id": "mode",
            "category": "mode",
            "type": "select",
            "currentValue": "default",
            "options": [{"value": "default", "name": "Default"}, {"value": "plan", "name": "Plan"}],
        },
        {
            "id": "model",
            "category": "model",
            "type": "select",
            "currentValue": "default",
            "options": [
                {"group": "anthropic", "name": "Anthropic", "options": [{"value": "default"}, {"value": "sonnet"}]}
            ],
        },
        {"id": "fast", "type": "boolean", "currentValue": False},
        {"id": "future", "type": "slider", "currentValue": 3},  # a kind lmbridge does not know: not settable
    ],
}


def test_only_the_choices_that_differ_become_requests_in_order() -> None:
    options = SessionOptions.from_session(OPENED)
    assert options.requests("s1", {"mode": "default", "model": "sonnet", "fast": True}) == [
        ("session/set_config_option", {"sessionId": "s1", "configId": "model", "value": "sonnet"}),
        ("session/set_config_option", {"sessionId": "s1", "configId": "fast", "value": True, "type": "boolean"}),
    ]
    assert options.requests("s1", {}) == []


def test_an_answered_request_moves_the_current_value_and_takes_the_agents_new_list() -> None:
    options = SessionOptions.from_session(OPENED)
    (request,) = options.requests("s1", {"model": "sonnet"})
    options.answered(*request, {"configOptions": OPENED["configOptions"][:1]})  # the agent now offers mode only
    assert options.current() == {"mode": "default"}
    options = SessionOptions.from_session(OPENED)
    options.answered(*request, None)
    assert options.current()["model"] == "sonnet" and options.requests("s1", {"model": "sonnet"}) == []


@pytest.mark.parametrize(
    ("wanted", "field", "says"),
    [
        (
            {"effort": "high"},
            "options.modelOptions.effort",
            "the agent offers no such option; it offers: mode (default",
        ),
        ({"model": "gpt"}, "options.modelOptions.model", "must be one of default, sonnet"),
        ({"fast": "yes"}, "options.modelOptions.fast", "must be true or false"),
        ({"future": 4}, "options.modelOptions.future", "no such option"),
    ],
)
def test_a_choice_the_agent_does_not_offer_names_the_option_and_what_is_offered(
    wanted: dict[str, object], field: str, says: str
) -> None:
    with pytest.raises(InvalidParams) as error:
        SessionOptions.from_session(OPENED).requests("s1", wanted)
    assert error.value.field == field and says in error.value.problem


def test_an_agent_with_modes_only_gets_set_mode() -> None:
    gemini = {
        "sessionId": "g",
        "modes": {"currentModeId": "default", "availableModes": [{"id": "default"}, {"id": "yolo"}]},
    }
    options = SessionOptions.from_session(gemini)
    assert options.requests("g", {"mode": "yolo"}) == [("session/set_mode", {"sessionId": "g", "modeId": "yolo"})]
    options.answered("session/set_mode", {"sessionId": "g", "modeId": "yolo"}, {})
    assert options.requests("g", {"mode": "yolo"}) == [] and options.current() == {"mode": "yolo"}
    with pytest.raises(InvalidParams, match="must be one of default, yolo"):
        options.requests("g", {"mode": "plan"})


def test_the_agents_updates_are_followed() -> None:
    options = SessionOptions.from_session(OPENED)
    options.observe({"sessionUpdate": "current_mode_update", "currentModeId": "plan"})
    assert options.current()["mode"] == "plan" and options.requests("s1", {"mode": "plan"}) == []
    changed = [{**OPENED["configOptions"][1], "currentValue": "sonnet"}]
    options.observe({"sessionUpdate": "config_option_update", "configOptions": changed})
    assert options.current() == {"model": "sonnet", "mode": "plan"}  # (its modes remain)
    options.observe({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "x"}})
    assert options.current() == {"model": "sonnet", "mode": "plan"}


def test_an_agent_without_options_says_so() -> None:
    with pytest.raises(InvalidParams, match="it offers none"):
        SessionOptions.from_session({"sessionId": "x"}).requests("x", {"model": "a"})
    assert SessionOptions.from_session("not an object").current() == {}


def test_an_agent_with_unstable_models_gets_set_model() -> None:
    """Gemini CLI offers its models as the unstable ``models`` (``session/set_model``), not as a config option."""
    opened = {
        "sessionId": "g",
        "modes": {"currentModeId": "default", "availableModes": [{"id": "default"}, {"id": "plan"}]},
        "models": {
            "currentModelId": "gemini-2.5-flash",  # given on its command line: not among the listed ones
            "availableModels": [{"modelId": "auto", "name": "Auto"}, {"modelId": "gemini-2.5-pro", "name": "Pro"}],
        },
    }
    options = SessionOptions.from_session(opened)
    assert options.requests("g", {"model": "gemini-2.5-flash"}) == []
    assert options.requests("g", {"model": "gemini-2.5-pro", "mode": "plan"}) == [
        ("session/set_model", {"sessionId": "g", "modelId": "gemini-2.5-pro"}),
        ("session/set_mode", {"sessionId": "g", "modeId": "plan"}),
    ]
    options.answered("session/set_model", {"sessionId": "g", "modelId": "gemini-2.5-pro"}, {})
    assert options.current() == {"mode": "default", "model": "gemini-2.5-pro"}
    with pytest.raises(InvalidParams) as error:
        options.requests("g", {"model": "gpt-5"})
    assert str(error.value).endswith("options.modelOptions.model: must be one of auto, gemini-2.5-pro")
    assert "model (auto, gemini-2.5-pro)" in options.describe()


def test_a_request_is_named_by_its_option_and_value() -> None:
    assert request_label("session/set_config_option", {"configId": "effort", "value": "high"}) == (
        "session/set_config_option (effort = 'high')"
    )
    assert request_label("session/set_mode", {"modeId": "plan"}) == "session/set_mode (mode = 'plan')"
    assert request_label("session/set_model", {"modelId": "pro"}) == "session/set_model (model = 'pro')"
