"""Hardening, each on the real wire: a trace directory open to others, secrets in agent stderr,
a repeated Origin header, socket directories of killed daemons, and agent processes that outlived a SIGKILLed
lmbridge."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import trio
import trio_websocket
from conftest import HANG, PYTHON, open_bridge, processes_with_marker
from test_serve import serving
from test_stdio import _gone_soon

from mcp_synthetic.wiring import _remove_stale_runtime_dirs

pytestmark = pytest.mark.wire  # lmbridge and its agents as processes: make test, not make check


async def test_a_trace_directory_open_to_others_is_made_private(tmp_path: Path, agents_toml: Path) -> None:
    traces = tmp_path / "traces"
    traces.mkdir(mode=0o755)
    os.chmod(traces, 0o755)
    async with open_bridge(tmp_path, agents_toml, "--trace-dir", str(traces)):
        pass
    assert stat.S_IMODE(traces.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in traces.iterdir())


async def test_secrets_in_agent_stderr_are_masked_in_the_log_and_in_error_data(tmp_path: Path) -> None:
    leaky = (
        "import os, sys; sys.stderr.write('using ' + os.environ['LEAKY_API_KEY'] + "
        "' and sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123\\n'); sys.exit(3)"
    )
    config = tmp_path / "leaky.toml"
    config.write_text(
        f"[agents.leaky]\ncommand = {json.dumps(PYTHON)}\nargs = ['-c', {json.dumps(leaky)}]\n"
        'env = { LEAKY_API_KEY = "hunter2-super-secret" }\n'
    )
    async with open_bridge(tmp_path, config) as live:
        result = await live.chat("hi", model="leaky")
        assert result.error is not None and result.error.code == -32001
        shown = json.dumps(result.error.to_dict())
        assert "using *** and ***" in result.error.data["stderr"]
        log = live.stderr
    for text in (shown, log):
        assert "hunter2-super-secret" not in text and "sk-ant-api03" not in text


async def test_more_than_one_origin_header_is_refused(tmp_path: Path, agents_toml: Path) -> None:
    options = ("--allow-origin", "https://good.example", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0")
    async with serving(tmp_path, agents_toml, *options) as live:
        headers = [
            (b"authorization", f"Bearer {live.token}".encode()),
            (b"origin", b"https://evil.example"),
            (b"origin", b"https://good.example"),  # the last one must not win
        ]
        with pytest.raises(trio_websocket.HandshakeError) as refused:
            async with trio_websocket.open_websocket_url(live.url, extra_headers=headers):
                pass
        assert refused.value.status_code == 400  # type: ignore[attr-defined]
        http_url = live.http_url
        assert http_url is not None
        host, port = http_url.removeprefix("http://").rsplit(":", 1)
        stream = await trio.open_tcp_stream(host, int(port))
        request = (
            f"GET /v1/models HTTP/1.1\r\nhost: {host}\r\nauthorization: Bearer {live.token}\r\n"
            "origin: https://evil.example\r\norigin: https://good.example\r\nconnection: close\r\n\r\n"
        )
        await stream.send_all(request.encode())
        reply = b""
        with trio.fail_after(HANG):
            while chunk := await stream.receive_some():
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 400"), reply[:200]


def test_socket_directories_of_lmbridges_that_are_gone_are_removed(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    stale = tmp_path / f"lmbridge-{int(dead.stdout)}"
    live = tmp_path / f"lmbridge-{os.getpid()}-efgh"
    other = tmp_path / "lmbridge-notapid-x"
    for directory in (stale, live, other):
        directory.mkdir()
        (directory / "s.sock").write_text("")
    _remove_stale_runtime_dirs(tmp_path)
    assert not stale.exists() and live.exists() and other.exists()


async def test_sigkill_of_lmbridge_leaves_no_agent_process_behind(tmp_path: Path, marker: str) -> None:
    # A launcher whose child never reads stdin: the agent's EOF alone does not stop it.
    launcher = f"{PYTHON} -c 'import time; time.sleep(300)' & exec {PYTHON} -m bridge.demo"
    config = tmp_path / "launcher.toml"
    config.write_text(
        f"[agents.launched]\ncommand = 'sh'\nargs = ['-c', {json.dumps(launcher)}]\n"
        f'env = {{ LMBRIDGE_TEST_MARKER = "{marker}" }}\n'
    )
    async with open_bridge(tmp_path, config) as live:
        result = await live.chat("/say up", model="launched")
        assert result.text == "up\n"
        assert len(processes_with_marker(marker)) == 2  # the demo agent and the sleeper
        live.process.send_signal(signal.SIGKILL)
        with trio.fail_after(HANG):
            await live.process.wait()
        assert await _gone_soon(marker)
