"""Starting an agent before Trio runs (``bridge.acp.spawn``) and the pool adopting it."""

from __future__ import annotations

import json
import sys
import time

import pytest
import trio
from conftest import HANG, gone_after_kill, processes_with_marker

from bridge.acp.pool import AgentPool
from bridge.acp.spawn import EarlyAgent, first_chat_agent, spawn_agent, start_early
from bridge.config import AgentConfig
from wire.observe.logs import get_logger

pytestmark = pytest.mark.wire  # lmbridge and its agents as processes: make test, not make check

SHARED = AgentConfig(id="claude", name="Claude", command=sys.executable)
OWN = AgentConfig(id="own", name="Own", command=sys.executable, isolation="session")
AGENTS = {"claude": SHARED, "own": OWN}


def chat(model: object, method: str = "lm/chat") -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": {"modelId": model}}).encode()


@pytest.mark.parametrize("model", ["claude", "claude/sonnet"])
def test_the_agent_of_a_chat_is_its_model_id_or_the_part_before_the_slash(model: str) -> None:
    assert first_chat_agent(chat(model), AGENTS) is SHARED


@pytest.mark.parametrize(
    "line",
    [
        chat("nobody"),
        chat("own"),  # a process per session: nothing to start before the session exists
        chat(7),
        chat("claude", method="lm/countTokens"),
        b'{"jsonrpc":"2.0","id":1,"method":"lm/chat"',
        b"[1]",
        chat("claude") + b" " * (1024 * 1024),
    ],
    ids=["unknown", "isolated", "not-a-string", "other-method", "truncated", "not-an-object", "too-long"],
)
def test_anything_else_starts_nothing(line: bytes) -> None:
    assert first_chat_agent(line, AGENTS) is None


def test_only_a_complete_first_line_is_read() -> None:
    assert start_early(AGENTS, chat("claude")) is None  # no newline yet: the request may be cut


def test_an_agent_that_cannot_run_is_not_started_early() -> None:
    missing = AgentConfig(id="gone", name="Gone", command="/nonexistent/agent")
    assert start_early({"gone": missing}, chat("gone") + b"\n") is None


def test_an_early_agent_is_sent_initialize_and_one_gone_already_leaves_nothing_to_flush() -> None:
    """The initialize an early agent is sent goes straight to its pipe: an agent that closed its stdin (it exited at
    once: a missing key) makes the write fail, and nothing is left buffered for whoever closes the pipe later —
    where a pending flush would raise BrokenPipeError and hide the agent's own reason behind it."""
    echo = AgentConfig(
        id="echo", name="Echo", command=sys.executable, args=("-c", "import sys; print(sys.stdin.readline(), end='')")
    )
    early = EarlyAgent(echo, spawn_agent(echo))
    early.send_initialize()
    assert early.process.stdout is not None and early.initialize_id == 0
    sent = json.loads(early.process.stdout.readline())
    assert (sent["id"], sent["method"], sent["params"]["protocolVersion"]) == (0, "initialize", 1)
    early.abandon()

    closed = AgentConfig(
        id="closed",
        name="Closed",
        command=sys.executable,
        args=("-c", "import os, sys, time; os.close(0); print('closed', flush=True); time.sleep(30)"),
    )
    early = EarlyAgent(closed, spawn_agent(closed))
    assert early.process.stdout is not None and early.process.stdout.readline() == b"closed\n"
    early.send_initialize()
    assert early.initialize_id is None and early.initialize_line is None  # the pool asks, and learns why
    assert early.process.stdin is not None
    early.process.stdin.close()  # nothing pending to flush into the closed pipe
    early.abandon()


def _sleeper(marker: str) -> AgentConfig:
    """An agent whose process starts a child in its group, says so on stdout, then sleeps."""
    script = (
        "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "print('ready', flush=True); time.sleep(60)"
    )
    return AgentConfig(
        id="sleeper", name="Sleeper", command=sys.executable, args=("-c", script), env={"LMBRIDGE_TEST_MARKER": marker}
    )


def _started(marker: str) -> EarlyAgent:
    early = EarlyAgent(_sleeper(marker), spawn_agent(_sleeper(marker)))
    assert early.process.stdout is not None and early.process.stdout.readline() == b"ready\n"
    # Both processes of the group, as /proc shows them (a loaded machine may show the child a moment later).
    deadline = time.monotonic() + HANG
    while len(processes_with_marker(marker)) < 2:
        assert time.monotonic() < deadline, processes_with_marker(marker)
        time.sleep(0.05)
    return early


def test_abandoning_an_early_agent_stops_its_whole_process_group(marker: str) -> None:
    early = _started(marker)
    early.abandon()
    early.abandon()  # once is enough; twice is harmless
    assert early.process.returncode is not None
    assert gone_after_kill(marker) == []


async def test_a_pool_that_cannot_take_an_early_agent_stops_it(marker: str) -> None:
    pool = AgentPool({}, log=get_logger())  # never run: it cannot adopt anything
    early = _started(marker)
    pool.adopt(early)
    assert early.adopted and early.process.returncode is not None
    assert gone_after_kill(marker) == []


async def test_shutting_down_before_an_adopted_agent_ran_stops_it(marker: str) -> None:
    pool = AgentPool({}, log=get_logger(), stop_grace=1)
    early = _started(marker)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        pool.adopt(early)
        nursery.cancel_scope.cancel()  # before the start task ran: the pool's nursery is cancelled with it
    assert early.process.poll() is not None
    assert gone_after_kill(marker) == []
