"""Headless Chromium driven over the DevTools pipe (``--remote-debugging-pipe``): no port, no websocket, no package.

Owns: starting Chromium with the pipe on its fds 3 (commands in) and 4 (replies and events out), the NUL-framed
JSON messages on it, matching replies to commands, keeping events until someone asks for them, and stopping
Chromium (SIGTERM, then SIGKILL). Blocking and single-threaded: the runner has one page and waits for one thing at a
time.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import subprocess
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-background-timer-throttling",
    "--disable-renderer-backgrounding",
    "--window-size=1400,900",
    "--remote-debugging-pipe",
)


class DevToolsError(RuntimeError):
    """Chromium answered a command with an error, went away, or did not answer in time."""


class Chromium:
    def __init__(self, binary: Path, profile: Path, log_path: Path) -> None:
        commands_read, commands_write = os.pipe()
        replies_read, replies_write = os.pipe()
        log = open(log_path, "ab")  # noqa: SIM115 - owned by the process, closed in stop()
        self._log = log
        # Chromium reads commands on fd 3 and writes replies on fd 4.
        self.process = subprocess.Popen(
            [str(binary), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            pass_fds=(3, 4),
            preexec_fn=lambda: _pipe_onto_3_and_4(commands_read, replies_write),  # noqa: PLW1509
            start_new_session=True,
        )
        os.close(commands_read)
        os.close(replies_write)
        self._out = commands_write
        self._in = replies_read
        self._buffer = b""
        self._next_id = 0
        self._events: deque[dict[str, Any]] = deque()

    def call(
        self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None, timeout: float = 30.0
    ) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise DevToolsError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._events.append(reply)

    def wait_event(
        self,
        accept: Callable[[dict[str, Any]], bool],
        timeout: float,
        on_event: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """The first event ``accept`` takes; every event seen on the way is passed to ``on_event``."""
        deadline = time.monotonic() + timeout
        while True:
            event = self._events.popleft() if self._events else self._read(deadline)
            if on_event is not None:
                on_event(event)
            if accept(event):
                return event

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DevToolsError("Chromium did not answer in time")
            ready, _, _ = select.select([self._in], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(self._in, 1 << 20)
            if not chunk:
                raise DevToolsError(f"Chromium closed the DevTools pipe (exit status {self.process.poll()})")
            self._buffer += chunk
        frame, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(frame)

    def stop(self) -> None:
        for fd in (self._out, self._in):
            try:
                os.close(fd)
            except OSError:
                pass
        stop_process_group(self.process)
        self._log.close()


def _pipe_onto_3_and_4(commands: int, replies: int) -> None:
    # In the child, before exec: move both ends out of the way first, as either may already be 3 or 4.
    high_commands = fcntl.fcntl(commands, fcntl.F_DUPFD, 10)
    high_replies = fcntl.fcntl(replies, fcntl.F_DUPFD, 10)
    os.dup2(high_commands, 3)
    os.dup2(high_replies, 4)


def stop_process_group(process: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """SIGTERM to the process's group (it was started in a session of its own), then SIGKILL after ``grace``."""
    if process.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, grace)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue
