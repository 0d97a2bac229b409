"""More conversations at once than ``[sessions] max_sessions``, over the real wire: the cap closes idle sessions to
make room, and no turn is ever lost to it — every turn of every conversation ends as it should (never ``cancelled``
when nobody cancelled it), with its own conversation's text; a conversation whose session was closed is told its
history again in a new one. On both fronts (the editor protocol over WebSocket, the HTTP API through the official
``openai`` SDK), and for an agent that runs a process per session (closing a session stops a process there)."""

from __future__ import annotations

import json
import re
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import openai
import pytest
import trio
from conftest import processes_with_marker
from fakes import user
from http_daemon import http_daemon, write_config
from test_serve import serving

from bridge.editor.client import EditorClient

pytestmark = pytest.mark.wire  # lmbridge and its agents as processes: make test, not make check

ECHO = {
    "name": "echo",
    "description": "Echoes its text",
    "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
}
ECHO_FUNCTION = {
    "type": "function",
    "function": {"name": ECHO["name"], "description": ECHO["description"], "parameters": ECHO["inputSchema"]},
}


def with_sessions(agents_toml: Path, sessions: str, agent: str = "") -> Path:
    text = agents_toml.read_text().replace("[sessions]\n", f"[sessions]\n{sessions}\n", 1)
    text = text.replace("[agents.scripted]\n", f"[agents.scripted]\n{agent}\n", 1)
    agents_toml.write_text(text)
    return agents_toml


def opening(n: int) -> str:
    return f"/say c{n:03d} opens"


def tool_prompt(n: int) -> str:
    return f'/tool echo {{"text": "c{n:03d}"}}'


def check_recall(n: int, text: str) -> str:
    """The fourth turn's ``/recall``: the session's earlier prompts — the conversation's own if it kept its session
    all along, else (it was told its history again in a new session at some turn) what that session was told since.
    Either way, nothing of another conversation."""
    assert text.startswith("earlier prompts: ") and text.endswith("\n"), (n, text)
    prompts = json.loads(text.removeprefix("earlier prompts: "))
    assert set(re.findall(r"c\d{3}", text)) <= {f"c{n:03d}"}, (n, text)
    if prompts == [opening(n), tool_prompt(n)]:
        return "kept"
    assert prompts == [] or "The conversation so far" in prompts[0], (n, text)
    return "told again"


@pytest.fixture
async def capped(tmp_path: Path, agents_toml: Path, marker: str) -> AsyncIterator[Any]:
    async with serving(tmp_path, with_sessions(agents_toml, "max_sessions = 8")) as live:
        yield live
    assert live.process.returncode == 0, live.stderr[-2000:]
    assert processes_with_marker(marker) == []


async def converse(client: EditorClient, n: int, seen: Counter[str]) -> None:
    """Four turns: text, a tool call, its result, ``/recall`` — the editor's tools offered in each (as editors do)."""
    history = [user(opening(n))]
    first = await client.chat("scripted", history, tools=[ECHO])
    assert (first.stop_reason, first.text, first.error) == ("end_turn", f"c{n:03d} opens\n", None), (n, first)
    history += [first.assistant_message(), user(tool_prompt(n))]
    second = await client.chat("scripted", history, tools=[ECHO])
    assert second.stop_reason == "tool_calls", (n, second)
    (call,) = second.tool_calls
    assert call["input"] == {"text": f"c{n:03d}"}
    result = {"type": "tool_result", "callId": call["callId"], "content": [{"type": "text", "value": f"r{n:03d}"}]}
    history += [second.assistant_message(), {"role": "user", "content": [result]}]
    third = await client.chat("scripted", history, tools=[ECHO])
    assert (third.stop_reason, third.text) == ("end_turn", f"tool echo returned: r{n:03d}\n"), (n, third)
    history += [third.assistant_message(), user("/recall")]
    fourth = await client.chat("scripted", history, tools=[ECHO])
    assert fourth.stop_reason == "end_turn", (n, fourth)
    seen[check_recall(n, fourth.text)] += 1


async def many_conversations(daemon: Any, conversations: int, connections: int) -> Counter[str]:
    seen: Counter[str] = Counter()
    async with AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(daemon.client()) for _ in range(connections)]
        with trio.fail_after(240):  # a bound for a broken daemon, far above what the turns take
            async with trio.open_nursery() as nursery:
                for n in range(conversations):
                    nursery.start_soon(converse, clients[n % connections], n, seen)
        status = await clients[0].request("daemon/status", {})
    assert sum(seen.values()) == conversations
    seen.update({f"cap.{key}": value for key, value in status["cap"].items() if isinstance(value, int)})
    return seen


async def test_forty_conversations_over_a_cap_of_eight_lose_no_turn(capped: Any) -> None:
    seen = await many_conversations(capped, 40, 4)
    # The cap did close sessions between turns (else this test would prove nothing), and said so in the status.
    assert seen["cap.closedForCap"] > 0 and seen["cap.maxSessions"] == 8
    assert seen["told again"] > 0
    assert seen["cap.cameBack"] > 0


async def test_an_agent_with_a_process_per_session_loses_no_turn_over_the_cap(
    tmp_path: Path, agents_toml: Path, marker: str
) -> None:
    config = with_sessions(agents_toml, "max_sessions = 3", 'isolation = "session"')
    async with serving(tmp_path, config) as live:
        seen = await many_conversations(live, 12, 3)
    assert live.process.returncode == 0, live.stderr[-2000:]
    assert seen["cap.closedForCap"] > 0
    assert processes_with_marker(marker) == []


def test_forty_sdk_clients_over_a_cap_of_eight_lose_no_turn(tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    config = write_config(tmp_path / "config.toml", marker, "max_sessions = 8\n[serve]\nmax_turns = 64")
    with http_daemon(tmp_path, config) as live:
        client = openai.OpenAI(base_url=live.url + "/v1", api_key=live.token, max_retries=0, timeout=120)

        def converse_over_http(n: int) -> str:
            def ask(messages: list[Any]) -> Any:
                return client.chat.completions.create(model="scripted", messages=messages, tools=[ECHO_FUNCTION])

            messages: list[Any] = [{"role": "user", "content": opening(n)}]
            first = ask(messages).choices[0]
            assert (first.finish_reason, first.message.content) == ("stop", f"c{n:03d} opens\n"), (n, first)
            messages += [first.message.model_dump(exclude_none=True), {"role": "user", "content": tool_prompt(n)}]
            second = ask(messages).choices[0]
            assert second.finish_reason == "tool_calls", (n, second)
            (call,) = second.message.tool_calls or []
            assert json.loads(call.function.arguments) == {"text": f"c{n:03d}"}
            messages += [
                second.message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": f"r{n:03d}"},
            ]
            third = ask(messages).choices[0]
            assert (third.finish_reason, third.message.content) == ("stop", f"tool echo returned: r{n:03d}\n"), n
            messages += [third.message.model_dump(exclude_none=True), {"role": "user", "content": "/recall"}]
            fourth = ask(messages).choices[0]
            assert fourth.finish_reason == "stop", (n, fourth)
            return check_recall(n, fourth.message.content or "")

        with ThreadPoolExecutor(max_workers=40) as pool:
            seen = Counter(pool.map(converse_over_http, range(40)))
    assert sum(seen.values()) == 40 and seen["told again"] > 0
    assert live.process.returncode == 0, live.stderr[-2000:]
    assert processes_with_marker(marker) == []
