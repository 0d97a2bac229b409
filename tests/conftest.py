"""Shared fixtures: a test agents file, a live ``lmbridge stdio`` subprocess driven like an editor, and a check
that no agent process outlives its bridge."""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from fakes import user

from bridge.editor.client import ChatResult, EditorClient, spawn_stdio

PYTHON = sys.executable
# Seconds: the bound on a wait that only a hung test reaches. Never a measure of speed — a test must pass on a machine
# busy with other work (speed goals live in the benchmarks, `make bench`).
HANG = 60.0


async def first_chat_with_initialize(
    config: Path,
    model: str,
    text: str,
    *,
    workspace: Path | None = None,
    timeout: float = 30,
    on_initialized: Callable[[], None] | None = None,
    after_answer: bool = False,
    extra_args: tuple[str, ...] = (),
) -> tuple[list[dict[str, Any]], str, int]:
    """Run ``lmbridge stdio`` and write ``initialize`` and an ``lm/chat`` in one write, as an editor woken by a chat
    does (``after_answer``: the chat once ``initialize`` is answered, as VS Code's extension does); read until the
    chat's answer, close stdin. Returns the messages read, lmbridge's stderr, its exit status. ``on_initialized``
    is called as soon as the answer to ``initialize`` has been read; ``extra_args``: more of lmbridge's options."""
    import json
    import subprocess

    from bridge.editor.client import lmbridge_command, stop_lmbridge

    initialize = {"protocolVersion": 1, "workspaceFolders": [str(workspace)] if workspace else []}
    chat = {"modelId": model, "messages": [user(text)]}
    first = [
        {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": initialize},
        {"jsonrpc": "2.0", "id": 1, "method": "lm/chat", "params": chat},
    ]
    process = await trio.lowlevel.open_process(
        lmbridge_command("stdio", "--config", str(config), *extra_args),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    messages: list[dict[str, Any]] = []
    err = bytearray()

    async def drain_stderr() -> None:
        assert process.stderr is not None
        while chunk := await process.stderr.receive_some():
            err.extend(chunk)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain_stderr)
            await process.stdin.send_all(
                "".join(json.dumps(m) + "\n" for m in first[: 1 if after_answer else 2]).encode()
            )
            buffered = b""
            with trio.fail_after(timeout):
                while not any(m.get("id") == 1 for m in messages):
                    data = await process.stdout.receive_some()
                    assert data, f"lmbridge closed stdout early: {bytes(err).decode(errors='replace')}"
                    *lines, buffered = (buffered + data).split(b"\n")
                    answered = any(m.get("id") == 0 for m in messages)
                    messages += [json.loads(line) for line in lines if line.strip()]
                    if not answered and any(m.get("id") == 0 for m in messages):
                        if on_initialized is not None:
                            on_initialized()
                        if after_answer:
                            await process.stdin.send_all(json.dumps(first[1]).encode() + b"\n")
            await stop_lmbridge(process, timeout)
    finally:
        await stop_lmbridge(process, timeout)  # a failed check leaves no lmbridge (nor its agent) behind
    assert process.returncode is not None
    return messages, bytes(err).decode(errors="replace"), process.returncode


def processes_with_marker(marker: str) -> list[int]:
    """Pids of live processes whose environment carries ``marker`` (every agent the tests start has one)."""
    needle = f"LMBRIDGE_TEST_MARKER={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                status = (entry / "status").read_text()
                if "\nState:\tZ" not in status:  # zombies are already dead
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def gone_after_kill(marker: str, timeout: float = 10.0) -> list[int]:
    """``processes_with_marker`` once the processes a SIGKILL was just sent to are gone: a process killed with its
    group dies asynchronously (the group leader is reaped at once, another member may still be exiting). Returns
    what is left after ``timeout`` — ``[]`` unless something survived."""
    deadline = time.monotonic() + timeout
    while (left := processes_with_marker(marker)) and time.monotonic() < deadline:
        time.sleep(0.01)  # polling an outside condition (a process's exit), bounded: not a synchronisation
    return left


@pytest.fixture
def marker() -> str:
    return uuid.uuid4().hex


@pytest.fixture
def agents_toml(tmp_path: Path, marker: str) -> Path:
    path = tmp_path / "agents.toml"
    path.write_text(f"""
[agents.scripted]
name = "Scripted test agent"
command = "{PYTHON}"
args = ["-m", "bridge.demo"]
env = {{ LMBRIDGE_TEST_MARKER = "{marker}" }}

[agents.missing]
command = "/nonexistent/lmbridge-test-agent"

[agents.failing]
command = "{PYTHON}"
args = ["-c", "import sys; sys.stderr.write('fatal: no credentials configured\\\\n'); sys.exit(3)"]

[agents.silent]
command = "{PYTHON}"
args = ["-c", "import time; time.sleep(120)"]
env = {{ LMBRIDGE_TEST_MARKER = "{marker}" }}
initialize_timeout = 1

[sessions]
stop_grace = 2
# Parallel tool calls go out together however slow the machine: the demo agent reports its calls as being made,
# and lmbridge waits for every reported call (up to this window), closing the batch as soon as all have come.
tool_batch_window = 30
""")
    return path


class Bridge:
    """A live ``lmbridge stdio`` with an initialized editor client."""

    def __init__(self, client: EditorClient, process: trio.Process, stderr_path: Path) -> None:
        self.client = client
        self.process = process
        self.stderr_path = stderr_path

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    async def chat(self, messages: list[dict[str, Any]] | str, model: str = "scripted", **kwargs: Any) -> ChatResult:
        if isinstance(messages, str):
            messages = [user(messages)]
        with trio.fail_after(30):
            return await self.client.chat(model, messages, **kwargs)


@asynccontextmanager
async def open_bridge(
    tmp_path: Path,
    config: Path | None,
    *extra: str,
    initialize: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    serve: Any = None,
) -> AsyncIterator[Bridge]:
    """``serve``: how the editor answers ``editor/chat`` (``EditorClient.serve_models``), for an editor that shares
    models (``initialize={"editorModels": [...]}``)."""
    stderr_path = tmp_path / f"bridge-{uuid.uuid4().hex[:6]}.stderr"
    args = ["--log-level", "debug", *extra]
    if config is not None:
        args += ["--config", str(config)]
    with open(stderr_path, "wb") as stderr:
        async with spawn_stdio(args, stderr=stderr, env=env) as (client, process):
            if serve is not None:
                client.serve_models(serve)
            with trio.fail_after(30):
                await client.initialize(**(initialize or {}))
            yield Bridge(client, process, stderr_path)


@pytest.fixture
async def bridge(tmp_path: Path, agents_toml: Path, marker: str) -> AsyncIterator[Bridge]:
    async with open_bridge(tmp_path, agents_toml) as live:
        yield live
    assert live.process.returncode == 0, live.stderr[-3000:]
    assert processes_with_marker(marker) == [], "an agent process outlived the bridge"


@pytest.fixture(scope="session", autouse=True)
def _private_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The same for the whole session, first: module-scoped fixtures start their lmbridge before any test's own
    environment is set (else the fuzz suites' bridges would remember the demo agent in the developer's state file)."""
    patch = pytest.MonkeyPatch()
    base = tmp_path_factory.mktemp("session-xdg")
    patch.setenv("XDG_CONFIG_HOME", str(base / "config"))
    patch.setenv("XDG_STATE_HOME", str(base / "state"))
    patch.delenv("LMBRIDGE_CONFIG", raising=False)
    yield
    patch.undo()


@pytest.fixture(autouse=True)
def _quiet_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Tests never read the developer's own config or state.
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))
    monkeypatch.delenv("LMBRIDGE_CONFIG", raising=False)
    os.environ.pop("LMBRIDGE_LOG_LEVEL", None)
