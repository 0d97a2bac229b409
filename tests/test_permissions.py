"""Permission bridging through the real wire: the demo agent's ``/permission`` becomes a tool call of the
permission tool, and the editor's answer — an option id, words, a skip, nonsense, or silence — becomes the
agent's outcome. Policies answer without asking. An agent's questions (``/elicit``, ``/visit``: ACP elicitation)
take the same path, their answers read against the form's schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import HANG, PYTHON, Bridge, open_bridge, processes_with_marker
from fakes import user

from session.permissions import PermissionQuestions, reply_option

pytestmark = pytest.mark.wire  # lmbridge and its agents as processes: make test, not make check

PERMISSION_TOOL = {
    "name": "acp_agent_action",
    "description": "Approve an agent action",
    "inputSchema": {"type": "object"},
}
CLOCK = {"name": "get_time", "description": "The time", "inputSchema": {"type": "object"}}


@pytest.fixture
def policies_toml(tmp_path: Path, marker: str) -> Path:
    agent = f'command = "{PYTHON}"\nargs = ["-m", "bridge.demo"]\nenv = {{ LMBRIDGE_TEST_MARKER = "{marker}" }}\n'
    path = tmp_path / "policies.toml"
    path.write_text(
        "".join(
            f"[agents.{name}]\n{agent}" + (f'permission_policy = "{policy}"\n' if policy else "") + "\n"
            for name, policy in [
                ("asks", None),
                ("trusting", "allow_all"),
                ("strict", "deny"),
                ("reader", "allow_reads"),
            ]
        )
        + "[sessions]\ntool_batch_window = 3\n"
    )
    return path


@pytest.fixture
async def live(tmp_path: Path, policies_toml: Path, marker: str):
    async with open_bridge(tmp_path, policies_toml) as bridge:
        yield bridge
    assert bridge.process.returncode == 0
    assert processes_with_marker(marker) == []


def answer(call: dict[str, Any], text: str, *, error: bool = False) -> dict[str, Any]:
    return {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "callId": call["callId"],
                "isError": error,
                "content": [{"type": "text", "value": text}],
            }
        ],
    }


async def ask(
    bridge: Bridge,
    text: str = "/permission rm -rf build",
    model: str = "asks",
    tools: list[dict[str, Any]] | None = None,
) -> tuple[list[dict[str, Any]], Any]:
    history = [user(text)]
    reply = await bridge.chat(history, model=model, tools=[PERMISSION_TOOL] if tools is None else tools)
    assert reply.error is None, reply.error
    history.append(reply.assistant_message())
    return history, reply


@pytest.mark.parametrize(
    ("said", "outcome"),
    [
        ("allow-once", "allow-once"),
        ("reject-once", "reject-once"),
        ("Allow", "allow-once"),
        ("yes, go ahead", "allow-once"),
        ("always", "allow-always"),
        ("Allow always", "allow-always"),
        ("no", "reject-once"),
        ("Don't allow it", "reject-once"),
        ("The user chose to skip the tool call.", "reject-once"),
    ],
)
async def test_the_editors_answer_becomes_the_agents_outcome(live: Bridge, said: str, outcome: str) -> None:
    history, reply = await ask(live)
    assert reply.stop_reason == "tool_calls"
    (call,) = reply.tool_calls
    assert call["name"] == "acp_agent_action"
    assert call["input"]["title"] == "rm -rf build" and call["input"]["kind"] == "execute"
    assert call["input"]["command"] == "rm -rf build"
    assert [o["optionId"] for o in call["input"]["options"]] == ["allow-once", "allow-always", "reject-once"]
    final = await live.chat(history + [answer(call, said)], model="asks", tools=[PERMISSION_TOOL])
    assert final.text == f"permission outcome: {outcome}\n"


async def test_an_unreadable_answer_rejects_and_is_logged(live: Bridge) -> None:
    history, reply = await ask(live)
    final = await live.chat(
        history + [answer(reply.tool_calls[0], "maybe later?")], model="asks", tools=[PERMISSION_TOOL]
    )
    assert final.text == "permission outcome: reject-once\n"
    assert "could not read the editor's answer to a permission request" in live.stderr


async def test_an_error_result_rejects(live: Bridge) -> None:
    history, reply = await ask(live)
    final = await live.chat(
        history + [answer(reply.tool_calls[0], "tool crashed", error=True)], model="asks", tools=[PERMISSION_TOOL]
    )
    assert final.text == "permission outcome: reject-once\n"


@pytest.mark.smoke
async def test_moving_on_cancels_the_request_and_the_prompt(live: Bridge) -> None:
    history, _reply = await ask(live, "/permission deploy\n/say deployed")
    history.append(user("/say never mind that"))
    final = await live.chat(history, model="asks", tools=[PERMISSION_TOOL])
    assert final.text == "never mind that\n" and "deployed" not in final.text


async def test_cancel_while_awaiting_the_answer_answers_cancelled(live: Bridge) -> None:
    turn = await live.client.start_chat(
        "asks", [user("/permission format disk\n/say formatted")], tools=[PERMISSION_TOOL]
    )
    with trio.fail_after(30):
        await turn.first_part.wait()  # the permission tool call; the 3 s batching window keeps the turn open
    assert turn.parts[0]["type"] == "tool_call"
    with trio.fail_after(HANG):
        turn.cancel()
        result = await turn.result()
    assert result.stop_reason == "cancelled"
    after = await live.chat(
        [user("/permission format disk\n/say formatted"), result.assistant_message(), user("/say fine")],
        model="asks",
        tools=[PERMISSION_TOOL],
    )
    assert after.text == "fine\n"


async def test_two_requests_at_once_go_out_together(live: Bridge) -> None:
    history, reply = await ask(live, "/permissions delete a | delete b")
    assert sorted(c["input"]["title"] for c in reply.tool_calls) == ["delete a", "delete b"]
    by_title = {c["input"]["title"]: c for c in reply.tool_calls}
    history.append(
        {
            "role": "user",
            "content": [
                answer(by_title["delete a"], "allow-once")["content"][0],
                answer(by_title["delete b"], "reject-once")["content"][0],
            ],
        }
    )
    final = await live.chat(history, model="asks", tools=[PERMISSION_TOOL])
    assert final.text == "permission outcome for delete a: allow-once\npermission outcome for delete b: reject-once\n"


@pytest.mark.parametrize(
    ("model", "directive", "outcome"),
    [
        ("trusting", "/permission rm -rf build", "allow-once"),
        ("strict", "/permission kind=read notes.txt", "reject-once"),
        ("reader", "/permission kind=read notes.txt", "allow-once"),
        ("reader", "/permission kind=search TODO", "allow-once"),
    ],
)
async def test_policies_answer_without_asking(live: Bridge, model: str, directive: str, outcome: str) -> None:
    _history, reply = await ask(live, directive, model=model)
    assert reply.tool_calls == [] and reply.text == f"permission outcome: {outcome}\n"


async def test_allow_reads_still_asks_for_other_kinds(live: Bridge) -> None:
    _history, reply = await ask(live, "/permission kind=edit main.py", model="reader")
    assert [c["name"] for c in reply.tool_calls] == ["acp_agent_action"]


async def test_without_the_permission_tool_ask_means_reject(live: Bridge) -> None:
    _history, reply = await ask(live, tools=[CLOCK])
    assert reply.tool_calls == [] and reply.text == "permission outcome: reject-once\n"


async def test_requests_about_the_editors_own_tools_are_allowed_without_asking(live: Bridge) -> None:
    # The shapes real agents use when asking about a tool of the MCP server named "editor".
    for title in ("mcp__editor__get_time", "get_time (editor MCP Server)"):
        _history, reply = await ask(live, f"/permission {title}", tools=[PERMISSION_TOOL, CLOCK])
        assert reply.tool_calls == [] and reply.text == "permission outcome: allow-once\n"


# -- permission requests asked in words (HTTP clients without the permission tool) ----------------------------------

_OPTIONS = [
    {"optionId": "allow-once", "name": "Allow once", "kind": "allow_once"},
    {"optionId": "allow-always", "name": "Allow always", "kind": "allow_always"},
    {"optionId": "reject-once", "name": "Reject", "kind": "reject_once"},
]


@pytest.mark.parametrize(
    ("reply", "chosen"),
    [
        ("1", "allow-once"),
        ("2", "allow-always"),
        (" 3. ", "reject-once"),
        ("4", None),
        ("0", None),
        ("allow", "allow-once"),
        ("Always!", "allow-always"),
        ("yes please", "allow-once"),
        ("no", "reject-once"),
        ("never", "reject-once"),  # no reject_always option: the nearest kind
        ("allow-always", "allow-always"),
        ("Allow always", "allow-always"),
        ("please refactor the parser instead of that", None),  # the user said something else
        ("", None),
    ],
)
def test_short_replies_choose_an_option(reply: str, chosen: str | None) -> None:
    assert reply_option(reply, _OPTIONS) == chosen


def test_a_question_is_restored_to_the_call_and_its_answer_to_the_result() -> None:
    questions = PermissionQuestions()
    call = {
        "type": "tool_call",
        "callId": "lmb_1",
        "name": "acp_agent_action",
        "input": {"title": "Run tests", "kind": "execute", "command": "make test", "options": _OPTIONS},
    }
    text = questions.ask(call)
    assert text.startswith("The agent asks for permission: Run tests\n  command: make test\n")
    assert "  2. Allow always (always)\n" in text
    history = [
        {"role": "user", "content": [{"type": "text", "value": "go"}]},
        {"role": "assistant", "content": [{"type": "text", "value": "Let me check.\n\n" + text}]},
        {"role": "user", "content": [{"type": "text", "value": "2"}]},
    ]
    restored = questions.restore(history)
    assert restored[0] is history[0]
    assert restored[1]["content"] == [{"type": "text", "value": "Let me check.\n\n"}, call]
    assert restored[2]["content"] == [
        {"type": "tool_result", "callId": "lmb_1", "content": [{"type": "text", "value": "allow-always"}]}
    ]
    # Something other than an answer stays the user's words: the session sees the user moving on.
    other = [*history[:2], {"role": "user", "content": [{"type": "text", "value": "do something else entirely now"}]}]
    assert questions.restore(other)[2] is other[2]
    # A question this bridge did not ask (or no longer remembers) is only text.
    forged = text.replace(text[-9:-1], "00000000")
    assert (
        questions.restore([{"role": "assistant", "content": [{"type": "text", "value": forged}]}])[0]["content"][0][
            "value"
        ]
        == forged
    )


# -- an agent's questions (ACP elicitation, unstable) take the same path --------------------------------------------


def elicited(text: str) -> dict[str, Any]:
    """What the demo agent says it got back from an elicitation."""
    prefix = "elicitation: "
    assert text.startswith(prefix), text
    return json.loads(text[len(prefix) :])


async def test_a_single_choice_form_offers_its_values(live: Bridge) -> None:
    history, reply = await ask(live, "/elicit colour:red/green | Which colour?")
    (call,) = reply.tool_calls
    assert call["name"] == "acp_agent_action" and call["input"]["kind"] == "elicitation"
    assert call["input"]["title"] == "Which colour?"
    assert [o["optionId"] for o in call["input"]["options"]] == ["red", "green", "decline"]
    final = await live.chat(history + [answer(call, "green")], model="asks", tools=[PERMISSION_TOOL])
    assert elicited(final.text) == {"action": "accept", "content": {"colour": "green"}}


@pytest.mark.parametrize(
    ("reply", "outcome"),
    [
        ('{"name": "Ada", "age": "36", "extra": 1}', {"action": "accept", "content": {"name": "Ada", "age": 36}}),
        ('```json\n{"name": "Ada", "age": 36}\n```', {"action": "accept", "content": {"name": "Ada", "age": 36}}),
        ('{"name": "Ada"}', {"action": "decline"}),  # a required field is missing
        ("decline", {"action": "decline"}),
        ("whatever", {"action": "decline"}),
    ],
)
async def test_a_form_is_answered_with_a_json_object_read_against_its_schema(
    live: Bridge, reply: str, outcome: dict[str, Any]
) -> None:
    history, first = await ask(live, "/elicit name:string age:integer | Who are you?")
    (call,) = first.tool_calls
    assert call["input"]["details"]["form"]["required"] == ["name", "age"]
    assert [o["optionId"] for o in call["input"]["options"]] == ["accept", "decline"]
    final = await live.chat(history + [answer(call, reply)], model="asks", tools=[PERMISSION_TOOL])
    assert elicited(final.text) == outcome


async def test_a_url_is_shown_and_done_accepts(live: Bridge) -> None:
    history, reply = await ask(live, "/visit https://example.com/login Sign in to continue")
    (call,) = reply.tool_calls
    assert call["input"]["title"] == "Sign in to continue — open https://example.com/login"
    assert call["input"]["details"] == {"url": "https://example.com/login"}
    final = await live.chat(history + [answer(call, "Done")], model="asks", tools=[PERMISSION_TOOL])
    assert elicited(final.text) == {"action": "accept"}


@pytest.mark.parametrize(("model", "tools"), [("asks", []), ("trusting", None), ("strict", None)])
async def test_nobody_to_ask_declines(live: Bridge, model: str, tools: list[Any] | None) -> None:
    _, reply = await ask(live, "/elicit ok:boolean | Proceed?", model=model, tools=tools)
    assert elicited(reply.text) == {"action": "decline"}


async def test_cancelling_the_turn_cancels_the_question(live: Bridge) -> None:
    history, _ = await ask(live, "/elicit ok:boolean | Proceed?")
    moved_on = [*history, user("/say moved on")]  # a new message instead of an answer
    final = await live.chat(moved_on, model="asks", tools=[PERMISSION_TOOL])
    assert final.text.endswith("moved on\n"), final.text
