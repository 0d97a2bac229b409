"""An agent's questions (ACP elicitation, unstable), sans-IO: a request as permission params and the answer back
(session.elicitation), and the question in words for an HTTP client. Through the wire: tests/test_permissions.py."""

from __future__ import annotations

from session.elicitation import as_permission, elicitation_answer
from session.permissions import PermissionPolicy, PermissionQuestions


def test_the_translation_both_ways() -> None:
    request = {"sessionId": "s", "mode": "form", "message": "Ready?",
               "requestedSchema": {"type": "object", "properties": {"go": {"type": "boolean"}}}}  # fmt: skip
    permission = as_permission(request)
    assert permission is not None and [o["optionId"] for o in permission["options"]] == ["true", "false", "decline"]
    chosen = {"outcome": {"outcome": "selected", "optionId": "false"}}
    assert elicitation_answer(permission, chosen) == {"action": "accept", "content": {"go": False}}
    assert elicitation_answer(permission, {"outcome": {"outcome": "cancelled"}}) == {"action": "cancel"}
    assert as_permission({**request, "mode": "_custom"}) is None


def test_an_http_client_is_asked_in_words_and_answers_with_json() -> None:
    form = {
        "type": "object",
        "properties": {"name": {"type": "string", "description": "your name"}},
        "required": ["name"],
    }
    request = {"sessionId": "s", "mode": "form", "message": "Who are you?", "requestedSchema": form}
    permission = as_permission(request)
    assert permission is not None
    tool_input = PermissionPolicy().tool_input(permission)
    questions = PermissionQuestions()
    call = {"type": "tool_call", "callId": "c1", "name": "acp_agent_action", "input": tool_input}
    text = questions.ask(call)
    assert text.startswith("The agent asks: Who are you?\n  name (string, required): your name\n")
    history = [
        {"role": "assistant", "content": [{"type": "text", "value": text}]},
        {"role": "user", "content": [{"type": "text", "value": '{"name": "Ada"}'}]},
    ]
    restored = questions.restore(history)
    result = restored[1]["content"][0]
    assert result["type"] == "tool_result" and result["content"][0]["value"] == '{"name": "Ada"}'


def test_a_generic_yes_never_picks_one_of_a_forms_values() -> None:
    """VS Code's permission tool answers "allow" after Continue: that cannot choose a colour for the user."""
    colour = {"type": "string", "enum": ["red", "blue"]}
    form = {"type": "object", "properties": {"c": colour}}
    request = {"sessionId": "s", "mode": "form", "message": "Colour?", "requestedSchema": form}
    permission = as_permission(request)
    assert permission is not None
    policy = PermissionPolicy()

    def reply(text: str) -> dict[str, object]:
        outcome, _ = policy.outcome_for_result(permission, {"content": [{"type": "text", "value": text}]})
        return elicitation_answer(permission, outcome)

    assert reply("allow") == {"action": "decline"}
    assert reply("Blue") == {"action": "accept", "content": {"c": "blue"}}
    url = as_permission({"sessionId": "s", "mode": "url", "message": "Sign in", "url": "https://x.example"})
    assert url is not None
    outcome, understood = policy.outcome_for_result(url, {"content": [{"type": "text", "value": "allow"}]})
    assert understood and elicitation_answer(url, outcome) == {"action": "accept"}
