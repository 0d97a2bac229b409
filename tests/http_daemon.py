"""A live ``lmbridge serve --http`` subprocess for tests that drive it with the official SDKs (which block: the
daemon runs in a process of its own, as users run it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PYTHON = sys.executable


class HttpDaemon:
    def __init__(self, process: subprocess.Popen[bytes], ready: dict[str, str], stderr_path: Path) -> None:
        self.process = process
        self.url = ready["http"]
        self.ready = ready
        self.token = Path(ready["tokenFile"]).read_text().strip()
        self.stderr_path = stderr_path

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def wait_for_log(self, needle: str, *, after: int = 0, timeout: float = 20.0) -> str:
        """The daemon's log from offset ``after`` once it holds ``needle`` (it is an event in another process:
        polled, with a deadline that only a broken daemon reaches)."""
        deadline = time.monotonic() + timeout
        while True:
            log = self.stderr[after:]
            if needle in log:
                return log
            if time.monotonic() > deadline:
                raise AssertionError(f"{needle!r} not logged within {timeout} s:\n{log[-3000:]}")
            time.sleep(0.02)


def write_config(path: Path, marker: str, extra: str = "") -> Path:
    path.write_text(f"""
[agents.scripted]
name = "Scripted test agent"
command = "{PYTHON}"
args = ["-m", "bridge.demo"]
env = {{ LMBRIDGE_TEST_MARKER = "{marker}" }}

[agents.missing]
command = "/nonexistent/lmbridge-test-agent"

[sessions]
stop_grace = 2
tool_batch_window = 30  # parallel calls together however slow the machine (tests/conftest.py says why)
{extra}
""")
    return path


@contextmanager
def http_daemon(directory: Path, config: Path, *args: str) -> Iterator[HttpDaemon]:
    directory.mkdir(parents=True, exist_ok=True)
    stderr_path = directory / "serve.stderr"
    env = {
        **os.environ,
        "XDG_CONFIG_HOME": str(directory / "xdg-config"),
        "XDG_STATE_HOME": str(directory / "xdg-state"),
    }
    env.pop("LMBRIDGE_CONFIG", None)
    command = [PYTHON, "-m", "bridge", "serve", "--config", str(config), "--token-file", str(directory / "token")]
    with open(stderr_path, "wb") as stderr:
        process = subprocess.Popen(
            [*command, "--log-level", "debug", "--http", "127.0.0.1:0", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
        )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line, f"lmbridge serve exited: {stderr_path.read_text()}"
        yield HttpDaemon(process, json.loads(line), stderr_path)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout is not None:
            process.stdout.close()
