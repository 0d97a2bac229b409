"""Sessions across turns through the real wire (``lmbridge stdio`` + the demo agent): continuation, re-rendered
history, output between turns, interleaved conversations, superseding requests, and a new bridge that has never
seen the conversation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
from conftest import HANG, PYTHON, Bridge, open_bridge, processes_with_marker
from fakes import user

pytestmark = pytest.mark.wire  # lmbridge and its agents as processes: make test, not make check


def rerender(message: dict) -> dict:
    """What an editor may send back: text split differently, trailing whitespace trimmed, a cache-control part."""
    text = "".join(p["value"] for p in message["content"] if p["type"] == "text").rstrip()
    middle = len(text) // 2
    return {
        "role": "assistant",
        "content": [
            {"type": "text", "value": text[:middle]},
            {"type": "text", "value": text[middle:]},
            {"type": "data", "mimeType": "cache_control", "data": "ZXBoZW1lcmFs"},
        ],
    }


async def test_rerendered_history_continues_the_same_session(bridge: Bridge) -> None:
    history = [user("/say one two three four")]
    first = await bridge.chat(history)
    history += [rerender(first.assistant_message()), user("/recall")]
    second = await bridge.chat(history)
    assert second.text == 'earlier prompts: ["/say one two three four"]\n'
    assert bridge.stderr.count("session opened") == 1


async def test_output_after_a_turn_ended_arrives_first_in_the_next_turn(bridge: Bridge) -> None:
    history = [user("/say first\n/later 0 late news")]
    first = await bridge.chat(history)
    assert first.text == "first\n" and first.stop_reason == "end_turn"
    history += [first.assistant_message(), user("/flush\n/say second")]
    second = await bridge.chat(history)
    assert second.text == "late newssecond\n"


async def test_interleaved_conversations_stay_apart(bridge: Bridge) -> None:
    async def converse(name: str, results: dict) -> None:
        history = [user(f"conversation {name}")]
        for turn in range(3):
            reply = await bridge.chat(history)
            history += [reply.assistant_message(), user(f"{name} turn {turn}")]
        history[-1] = user("/recall")
        results[name] = (await bridge.chat(history)).text

    results: dict[str, str] = {}
    async with trio.open_nursery() as nursery:
        for name in ("alpha", "beta", "gamma"):
            nursery.start_soon(converse, name, results)
    for name in ("alpha", "beta", "gamma"):
        recalled = json.loads(results[name].removeprefix("earlier prompts: "))
        assert recalled == [f"conversation {name}", f"{name} turn 0", f"{name} turn 1"]
    assert bridge.stderr.count("session opened") == 3


async def test_a_newer_request_for_the_conversation_supersedes_the_running_one(bridge: Bridge) -> None:
    history = [user("hello")]
    first = await bridge.chat(history)
    history.append(first.assistant_message())
    running = await bridge.client.start_chat("scripted", history + [user("/stream 2\n/sleep 600000")])
    with trio.fail_after(HANG):
        await running.first_part.wait()
    # The user edits the message whose answer is still streaming: the old turn ends, the new one is answered.
    with trio.fail_after(HANG):
        edited = await bridge.chat(history + [user("/say edited instead\n/recall")])
        superseded = await running.result()
    assert superseded.stop_reason == "cancelled"
    assert edited.stop_reason == "end_turn"
    assert edited.text.startswith("edited instead\n")
    assert bridge.stderr.count("session opened") == 1


async def test_the_same_request_sent_twice_asks_again(bridge: Bridge) -> None:
    history = [user("hello")]
    first = await bridge.chat(history)
    history += [first.assistant_message(), user("/say ask me again")]
    once = await bridge.chat(history)
    again = await bridge.chat(history)
    assert once.text == again.text == "ask me again\n"
    assert bridge.stderr.count("session opened") == 1


async def test_a_bridge_that_never_saw_the_conversation_seeds_a_new_session(tmp_path: Path, agents_toml: Path) -> None:
    history = [user("/say my name is Ada")]
    async with open_bridge(tmp_path, agents_toml) as first_bridge:
        reply = await first_bridge.chat(history)
    history += [reply.assistant_message(), user("/say what did I say?")]
    async with open_bridge(tmp_path, agents_toml) as second_bridge:
        answer = await second_bridge.chat(history)
        history += [answer.assistant_message(), user("/recall")]
        recalled = await second_bridge.chat(history)
    # The directive in the transcript was not executed again; only the new message was.
    assert answer.text == "what did I say?\n"
    (seed,) = json.loads(recalled.text.removeprefix("earlier prompts: "))
    transcript, new_message = seed.rsplit("\n", 1)
    assert transcript.startswith("[lmbridge] The conversation so far")
    assert "User: /say my name is Ada" in transcript and "Assistant: my name is Ada" in transcript
    assert new_message == "/say what did I say?"


async def test_a_restarted_bridge_resumes_the_stored_session(tmp_path: Path, marker: str) -> None:
    """With an agent that keeps its sessions, the state file lets a new bridge resume instead of re-telling."""
    config = tmp_path / "persistent.toml"
    config.write_text(f"""
[agents.keeper]
command = "{PYTHON}"
args = ["-m", "bridge.demo"]
env = {{ LMBRIDGE_DEMO_STATE_DIR = "{tmp_path / "agent-state"}", LMBRIDGE_TEST_MARKER = "{marker}" }}

[sessions]
state_file = "{tmp_path / "state" / "sessions.json"}"
""")
    history = [user("remember the milk")]
    async with open_bridge(tmp_path, config) as first_bridge:
        reply = await first_bridge.chat(history, model="keeper")
        history += [reply.assistant_message(), user("and the eggs")]
        reply = await first_bridge.chat(history, model="keeper")
    state = tmp_path / "state" / "sessions.json"
    assert oct(state.stat().st_mode & 0o777) == "0o600"
    assert processes_with_marker(marker) == []
    history += [reply.assistant_message(), user("/recall")]
    async with open_bridge(tmp_path, config) as second_bridge:
        recalled = await second_bridge.chat(history, model="keeper")
        assert "stored session reopened" in second_bridge.stderr and "session/resume" in second_bridge.stderr
    assert json.loads(recalled.text.removeprefix("earlier prompts: ")) == ["remember the milk", "and the eggs"]


async def test_two_conversations_run_at_the_same_time(bridge: Bridge) -> None:
    # Each waits at the barrier until the other got there too: run one after the other, neither would finish.
    answers: dict[str, str] = {}

    async def conversation(name: str) -> None:
        reply = await bridge.client.chat("scripted", [user(f"/say {name} starts\n/barrier pair 2\n/say {name} ends")])
        answers[name] = reply.text

    with trio.fail_after(HANG):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conversation, "alpha")
            nursery.start_soon(conversation, "beta")
    assert answers == {"alpha": "alpha starts\nalpha ends\n", "beta": "beta starts\nbeta ends\n"}
