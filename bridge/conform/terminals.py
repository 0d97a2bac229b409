"""The kit's client terminals (``terminal/*``, when the kit advertises ``terminal``): each command runs in a process
group of its own, its output (stdout and stderr together) kept up to the agent's ``outputByteLimit``, cut from the
start at a character boundary as the spec asks of a client. What the agent did with them is recorded for the checks:
which terminals it created (with the request), which it stopped and which it released.

Trio only; everything started is stopped by ``aclose`` (``open_agent`` calls it when the agent's run ends).
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

from bridge.acp.process import stop_process_group

__all__ = ["ClientTerminals", "Terminal", "chunks", "keep_last"]

DEFAULT_OUTPUT_LIMIT = 1024 * 1024  # when the agent gives no outputByteLimit
STOP_GRACE = 2.0


async def chunks(stream: trio.abc.ReceiveStream | None) -> AsyncIterator[bytes | bytearray]:
    """What a process's pipe gives, until it ends (a pipe broken or closed under us ends it too)."""
    assert stream is not None
    while True:
        try:
            data = await stream.receive_some(65536)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        if not data:
            return
        yield data


def keep_last(data: bytes, limit: int) -> tuple[bytes, bool]:
    """The last ``limit`` bytes of ``data`` at most, starting on a UTF-8 character boundary; whether any were cut."""
    if len(data) <= limit:
        return data, False
    kept = data[len(data) - limit :] if limit > 0 else b""
    start = 0
    while start < len(kept) and kept[start] & 0xC0 == 0x80:  # a continuation byte: part of a character cut in two
        start += 1
    return kept[start:], True


@dataclass
class Terminal:
    id: str
    session: str
    request: dict[str, Any]  # terminal/create's params, as the agent sent them
    process: trio.Process
    limit: int
    output: bytes = b""
    truncated: bool = False
    released: bool = False
    stopped: bool = False  # the agent asked for it to be killed (terminal/kill, or terminal/release)
    finished: trio.Event = field(default_factory=trio.Event)  # the process exited and its output was all read

    def exit_status(self) -> dict[str, Any] | None:
        code = self.process.returncode
        if code is None or not self.finished.is_set():
            return None
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = str(-code)
            return {"exitCode": None, "signal": name}
        return {"exitCode": code, "signal": None}


class ClientTerminals:
    """The terminals of one agent run. ``answer`` takes a ``terminal/*`` request and returns its reply."""

    def __init__(self, cwd: str | None = None, env: Mapping[str, str] | None = None) -> None:
        """``cwd``: where a command runs when the agent names none (the session's); ``env``: the environment
        commands start from (the agent's own, without what the kit keeps from it), then the agent's variables."""
        self.created: list[Terminal] = []  # in order, released ones included
        # Terminals being started: from the spawn until the terminal is in ``created`` its process may already run,
        # unlisted. What scans the machine's processes cannot tell it from anyone else's meanwhile.
        self.spawning = 0
        self._spawned = trio.Event()  # set (and replaced) whenever a start ends
        self._cwd = cwd
        self._env = dict(env if env is not None else os.environ)
        self._by_id: dict[str, Terminal] = {}
        self._nursery: trio.Nursery | None = None

    def attach(self, nursery: trio.Nursery) -> None:
        """Where the terminals' readers run (the agent's nursery)."""
        self._nursery = nursery

    async def answer(self, method: str, params: Any) -> dict[str, Any]:
        if not isinstance(params, dict):
            return _invalid("params must be an object")
        if method == "terminal/create":
            return await self._create(params)
        terminal = self._by_id.get(str(params.get("terminalId")))
        if terminal is None or terminal.released:
            return _invalid(f"no terminal {params.get('terminalId')!r} (unknown, or released)")
        if method == "terminal/output":
            result: dict[str, Any] = {"output": _text(terminal.output), "truncated": terminal.truncated}
            status = terminal.exit_status()
            if status is not None:
                result["exitStatus"] = status
            return {"result": result}
        if method == "terminal/wait_for_exit":
            await terminal.finished.wait()
            return {"result": terminal.exit_status()}
        if method in ("terminal/kill", "terminal/release"):
            _kill(terminal)
            terminal.stopped = True
            terminal.released = terminal.released or method == "terminal/release"
            return {"result": {}}
        return {"error": {"code": -32601, "message": f"method not found: {method}"}}

    async def _create(self, params: dict[str, Any]) -> dict[str, Any]:
        command, args, cwd = params.get("command"), params.get("args") or [], params.get("cwd")
        variables = params.get("env") or []
        if not isinstance(command, str) or not command or "\0" in command:
            return _invalid("command must be a non-empty string")
        if not isinstance(args, list) or not all(isinstance(a, str) and "\0" not in a for a in args):
            return _invalid("args must be a list of strings")
        if not isinstance(variables, list) or not all(_is_variable(v) for v in variables):
            return _invalid("env must be a list of {name, value} with names without '=' or NUL")
        if cwd is not None and (not isinstance(cwd, str) or not os.path.isabs(cwd)):
            return _invalid(f"cwd must be an absolute path, got {cwd!r}")
        env = {**self._env, **{v["name"]: v["value"] for v in variables}}
        limit = params.get("outputByteLimit")
        limit = limit if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0 else DEFAULT_OUTPUT_LIMIT
        self.spawning += 1
        try:
            process = await trio.lowlevel.open_process(
                [command, *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                cwd=cwd or self._cwd,
                env=env,
                start_new_session=True,
            )
        except (OSError, ValueError) as exc:
            message = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            return {"error": {"code": -32603, "message": f"cannot run {command!r}: {message}"}}
        finally:
            self.spawning -= 1  # (nothing below awaits before the terminal is in ``created``)
            self._spawned.set()
            self._spawned = trio.Event()
        terminal = Terminal(f"term-{uuid.uuid4().hex[:12]}", str(params.get("sessionId")), params, process, limit)
        self.created.append(terminal)
        self._by_id[terminal.id] = terminal
        assert self._nursery is not None, "attach() first"
        self._nursery.start_soon(self._read, terminal)
        return {"result": {"terminalId": terminal.id}}

    async def settled(self) -> None:
        """Return once no terminal is being started (``spawning`` is 0)."""
        while self.spawning:
            await self._spawned.wait()

    async def _read(self, terminal: Terminal) -> None:
        stdout = terminal.process.stdout
        try:
            async for data in chunks(stdout):
                terminal.output, cut = keep_last(terminal.output + data, terminal.limit)
                terminal.truncated = terminal.truncated or cut
            await terminal.process.wait()
        finally:
            terminal.finished.set()
            if stdout is not None:
                with trio.CancelScope(shield=True):
                    await stdout.aclose()

    async def aclose(self) -> None:
        """Stop every command still running."""
        with trio.CancelScope(shield=True):
            for terminal in self.created:  # (also sweeps what a command left running in its group)
                await stop_process_group(terminal.process, STOP_GRACE)


def _kill(terminal: Terminal) -> None:
    """SIGKILL the command's whole group: its leader may be gone while a child it left keeps the output open."""
    try:
        os.killpg(terminal.process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _is_variable(variable: Any) -> bool:
    if not isinstance(variable, dict):
        return False
    name, value = variable.get("name"), variable.get("value")
    return (
        isinstance(name, str) and bool(name) and "=" not in name and "\0" not in name
        and isinstance(value, str) and "\0" not in value
    )  # fmt: skip


def _text(output: bytes) -> str:
    return output.decode("utf-8", errors="replace")


def _invalid(message: str) -> dict[str, Any]:
    return {"error": {"code": -32602, "message": message}}
