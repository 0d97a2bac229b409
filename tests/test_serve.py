"""``lmbridge serve`` over real sockets on 127.0.0.1: authentication, origins, limits, many editors at once,
reconnecting to a running conversation, and an orderly stop."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio_websocket
from conftest import HANG, processes_with_marker
from fakes import user

from bridge.editor.client import EditorClient, connect_daemon

pytestmark = pytest.mark.wire  # lmbridge and its agents as processes: make test, not make check


class Daemon:
    def __init__(
        self, process: trio.Process, url: str, token_file: Path, stderr_path: Path, http_url: str | None = None
    ) -> None:
        self.process = process
        self.url = url
        self.http_url = http_url
        self.token_file = token_file
        self.token = token_file.read_text().strip()
        self.stderr_path = stderr_path

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    @asynccontextmanager
    async def client(self, **initialize: Any) -> AsyncIterator[EditorClient]:
        async with connect_daemon(self.url, self.token) as client:
            with trio.fail_after(30):
                await client.initialize(**initialize)
            yield client


@asynccontextmanager
async def serving(tmp_path: Path, config: Path, *args: str) -> AsyncIterator[Daemon]:
    token_file = tmp_path / "state" / "token"
    stderr_path = tmp_path / "serve.stderr"
    with open(stderr_path, "wb") as stderr:
        process = await trio.lowlevel.open_process(
            [
                sys.executable,
                "-m",
                "bridge",
                "serve",
                "--config",
                str(config),
                "--token-file",
                str(token_file),
                "--log-level",
                "debug",
                *args,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
        try:
            ready = b""
            with trio.fail_after(HANG):
                while b"\n" not in ready:
                    chunk = await process.stdout.receive_some()
                    assert chunk, f"lmbridge serve exited: {stderr_path.read_text()}"
                    ready += chunk
            line = json.loads(ready)
            yield Daemon(process, line["listening"], Path(line["tokenFile"]), stderr_path, line.get("http"))
        finally:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
                with trio.move_on_after(20):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
                    await process.wait()


@pytest.fixture
async def daemon(tmp_path: Path, agents_toml: Path, marker: str) -> AsyncIterator[Daemon]:
    async with serving(tmp_path, agents_toml) as live:
        yield live
    assert live.process.returncode == 0, live.stderr[-2000:]
    assert processes_with_marker(marker) == []


@pytest.mark.smoke
async def test_ready_line_and_a_private_token_file(daemon: Daemon) -> None:
    assert daemon.url.startswith("ws://127.0.0.1:")
    assert stat.S_IMODE(daemon.token_file.stat().st_mode) == 0o600 and len(daemon.token) >= 32
    async with daemon.client() as client:
        reply = await client.chat("scripted", [user("/say over a websocket")])
    assert reply.text == "over a websocket\n"


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ([], 401),
        ([(b"authorization", b"Bearer wrong-token")], 401),
        ([(b"authorization", b"Basic dXNlcjpwYXNz")], 401),
    ],
)
async def test_missing_or_wrong_tokens_are_refused_before_any_method(daemon: Daemon, headers, status) -> None:
    with pytest.raises(trio_websocket.HandshakeError) as refused:
        async with trio_websocket.open_websocket_url(daemon.url, extra_headers=headers):
            pass
    assert refused.value.status_code == status
    assert b"token" in refused.value.body


async def test_browser_origins_are_refused_unless_allowed(tmp_path: Path, agents_toml: Path) -> None:
    async with serving(tmp_path, agents_toml, "--allow-origin", "vscode-webview://trusted") as live:
        auth = (b"authorization", f"Bearer {live.token}".encode())
        with pytest.raises(trio_websocket.HandshakeError) as refused:
            async with trio_websocket.open_websocket_url(
                live.url, extra_headers=[auth, (b"origin", b"https://evil.example")]
            ):
                pass
        assert refused.value.status_code == 403 and b"https://evil.example" in refused.value.body
        async with trio_websocket.open_websocket_url(
            live.url, extra_headers=[auth, (b"origin", b"vscode-webview://trusted")]
        ) as ws:
            await ws.send_message(
                json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}})
            )
            assert json.loads(await ws.get_message())["result"]["protocolVersion"] == 1


async def test_a_token_file_readable_by_others_is_refused(tmp_path: Path, agents_toml: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("x" * 40)
    token_file.chmod(0o644)
    done = await trio.run_process(
        [sys.executable, "-m", "bridge", "serve", "--config", str(agents_toml), "--token-file", str(token_file)],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert done.returncode == 2 and done.stdout == b""
    assert f"chmod 600 {token_file}".encode() in done.stderr


async def test_non_loopback_addresses_need_allow_remote_and_tls(tmp_path: Path, agents_toml: Path) -> None:
    for extra, words in (
        (["--listen", "0.0.0.0:0"], b"--allow-remote"),
        (["--listen", "0.0.0.0:0", "--allow-remote"], b"needs TLS"),
    ):
        done = await trio.run_process(
            [
                sys.executable,
                "-m",
                "bridge",
                "serve",
                "--config",
                str(agents_toml),
                "--token-file",
                str(tmp_path / "t"),
                *extra,
            ],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        assert done.returncode == 2 and words in done.stderr


async def test_two_editors_at_once(daemon: Daemon) -> None:
    results: dict[str, str] = {}

    async def editor(name: str) -> None:
        async with daemon.client() as client:
            history = [user(f"/stream 50\n/say {name} done")]
            results[name] = (await client.chat("scripted", history)).text

    async with trio.open_nursery() as nursery:
        nursery.start_soon(editor, "first")
        nursery.start_soon(editor, "second")
    numbers = " ".join(str(n) for n in range(1, 51)) + " "
    assert results == {"first": numbers + "first done\n", "second": numbers + "second done\n"}


async def test_an_editor_that_reconnects_gets_the_answer_it_lost(daemon: Daemon) -> None:
    history = [user("/say before\n/sleep 1500\n/say after the pause")]
    async with daemon.client() as client:
        turn = await client.start_chat("scripted", history)
        with trio.fail_after(30):
            await turn.first_part.wait()
    # The connection is gone mid-turn. A new one sends the same request: the running answer continues.
    async with daemon.client() as client:
        with trio.fail_after(30):
            again = await client.chat("scripted", history)
    assert again.stop_reason == "end_turn"
    assert again.text == "before\nafter the pause\n"
    assert daemon.stderr.count("session opened") == 1


async def test_malformed_binary_and_oversized_frames(tmp_path: Path, agents_toml: Path) -> None:
    async with serving(tmp_path, agents_toml, "--max-message-bytes", "2000") as live:
        auth = [(b"authorization", f"Bearer {live.token}".encode())]
        async with trio_websocket.open_websocket_url(live.url, extra_headers=auth) as ws:
            await ws.send_message("{not json")
            assert json.loads(await ws.get_message())["error"]["code"] == -32700
            await ws.send_message(b'{"jsonrpc":"2.0","id":1,"method":"initialize"}')
            reply = json.loads(await ws.get_message())
            assert reply["error"]["code"] == -32600 and "binary frames" in reply["error"]["message"]
            await ws.send_message(
                json.dumps({"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": {"protocolVersion": 1}})
            )
            assert json.loads(await ws.get_message())["id"] == 2
            await ws.send_message("x" * 5000)
            with pytest.raises(trio_websocket.ConnectionClosed) as closed:
                await ws.get_message()
            assert closed.value.reason.code == 1009


async def test_limits_on_connections_and_requests_in_flight(tmp_path: Path, agents_toml: Path) -> None:
    async with (
        serving(tmp_path, agents_toml, "--max-connections", "1", "--max-requests", "1") as live,
        live.client() as client,
    ):
        with pytest.raises(trio_websocket.HandshakeError) as refused:
            async with trio_websocket.open_websocket_url(
                live.url, extra_headers=[(b"authorization", f"Bearer {live.token}".encode())]
            ):
                pass
        assert refused.value.status_code == 503 and b"too many connections" in refused.value.body
        slow = await client.start_chat("scripted", [user("/sleep 600000")])  # in flight until cancelled
        with pytest.raises(Exception) as busy:
            await client.request("lm/models", {})
        assert getattr(busy.value, "code", None) == -32004 and "limit is 1" in busy.value.message
        slow.cancel()
        with trio.fail_after(HANG):
            assert (await slow.result()).stop_reason == "cancelled"


async def test_idle_connections_are_closed(tmp_path: Path, agents_toml: Path) -> None:
    async with serving(tmp_path, agents_toml, "--idle-timeout", "0.5") as live:
        auth = [(b"authorization", f"Bearer {live.token}".encode())]
        async with trio_websocket.open_websocket_url(live.url, extra_headers=auth) as ws:
            with trio.fail_after(HANG), pytest.raises(trio_websocket.ConnectionClosed):
                await ws.get_message()
        assert "closing an idle connection" in live.stderr


async def test_status_reports_connections_sessions_and_agents(daemon: Daemon) -> None:
    async with daemon.client() as client:
        await client.chat("scripted", [user("hello")])
        status = await client.request("daemon/status", {})
    assert status["connections"] == 1 and status["sessions"] == {"scripted": 1}
    assert [a["id"] for a in status["agents"]] == ["scripted"] and status["agents"][0]["sessions"] == 1
    assert status["uptimeSeconds"] > 0


async def test_a_unix_socket(tmp_path: Path, agents_toml: Path) -> None:
    path = tmp_path / "lmbridge.sock"
    async with serving(tmp_path, agents_toml, "--unix", str(path)) as live:
        assert live.url == f"ws+unix://{path}" and stat.S_IMODE(path.stat().st_mode) == 0o600
        async with live.client() as client:
            assert (await client.chat("scripted", [user("/say via unix")])).text == "via unix\n"


async def test_tls(tmp_path: Path, agents_toml: Path) -> None:
    import ssl

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    made = await trio.run_process(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    if made.returncode != 0:
        pytest.skip("openssl could not make a test certificate")
    async with serving(tmp_path, agents_toml, "--tls-cert", str(cert), "--tls-key", str(key)) as live:
        assert live.url.startswith("wss://127.0.0.1:")
        context = ssl.create_default_context(cafile=str(cert))
        async with trio_websocket.open_websocket_url(
            live.url, context, extra_headers=[(b"authorization", f"Bearer {live.token}".encode())]
        ) as ws:
            await ws.send_message(
                json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}})
            )
            assert json.loads(await ws.get_message())["result"]["serverInfo"]["name"] == "lmbridge"


async def test_sigterm_cancels_turns_and_leaves_no_agent_process(
    tmp_path: Path, agents_toml: Path, marker: str
) -> None:
    async with serving(tmp_path, agents_toml) as live, live.client() as client:
        turn = await client.start_chat("scripted", [user("/stream 1\n/sleep 600000")])
        with trio.fail_after(30):
            await turn.first_part.wait()
        live.process.send_signal(signal.SIGTERM)
        with trio.fail_after(HANG):
            result = await turn.result()
            assert await live.process.wait() == 0
    assert result.stop_reason == "cancelled"
    assert processes_with_marker(marker) == []


async def test_fifty_concurrent_conversations_lose_nothing(daemon: Daemon) -> None:
    results: dict[int, tuple[str, str]] = {}

    async def conversation(client: EditorClient, n: int) -> None:
        history = [user(f"/say conversation {n}\n/stream 20")]
        first = await client.chat("scripted", history)
        history += [first.assistant_message(), user("/recall")]
        results[n] = (first.text, (await client.chat("scripted", history)).text)

    async with daemon.client() as one, daemon.client() as two, daemon.client() as three:
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                for n in range(50):
                    nursery.start_soon(conversation, (one, two, three)[n % 3], n)
    stream = " ".join(str(i) for i in range(1, 21)) + " "
    for n in range(50):
        first, recalled = results[n]
        assert first == f"conversation {n}\n{stream}"
        assert json.loads(recalled.removeprefix("earlier prompts: ")) == [f"/say conversation {n}\n/stream 20"]


async def test_a_new_message_after_a_drop_cancels_the_old_turn_and_never_gets_its_output(daemon: Daemon) -> None:
    # The new message's answer must not begin with the abandoned turn's output, nor that turn run to its end.
    first = user("/say before\n/sleep 600000\n/say after the pause")
    async with daemon.client() as client:
        turn = await client.start_chat("scripted", [first])
        with trio.fail_after(30):
            await turn.first_part.wait()
    async with daemon.client() as client:
        with trio.fail_after(HANG):  # well before the abandoned prompt's 20 s would end
            again = await client.chat("scripted", [first, user("/say something else")])
    assert again.text == "something else\n" and again.stop_reason == "end_turn"
    assert daemon.stderr.count("session opened") == 1


async def test_same_opening_conversations_of_two_workspaces_never_share_a_session(
    daemon: Daemon, tmp_path: Path
) -> None:
    # Conversations are keyed by who asks (client and workspace), not by the connection.
    opening = [user("/say hello")]
    answers: dict[str, str] = {}
    histories: dict[str, list[dict[str, Any]]] = {}
    async with AsyncExitStack() as stack:
        clients = {}
        for workspace in ("one", "two"):  # both open alike before either goes on
            folder = tmp_path / workspace
            folder.mkdir()
            clients[workspace] = client = await stack.enter_async_context(daemon.client(workspaceFolders=[str(folder)]))
            reply = await client.chat("scripted", opening)
            histories[workspace] = [*opening, reply.assistant_message()]
        for workspace, client in clients.items():
            history = [*histories[workspace], user(f"/say {workspace} again\n/recall")]
            second = await client.chat("scripted", history)
            answers[workspace] = second.text
            histories[workspace] = [*history, second.assistant_message()]
    for workspace, text in answers.items():
        assert text.startswith(f"{workspace} again\n")
        assert json.loads(text.split("earlier prompts: ")[1]) == ["/say hello"], text  # its own session only
    assert daemon.stderr.count("session opened") == 2
    # The first workspace's editor reconnects: it continues its own conversation.
    async with daemon.client(workspaceFolders=[str(tmp_path / "one")]) as client:
        reply = await client.chat("scripted", [*histories["one"], user("/recall")])
    assert json.loads(reply.text.removeprefix("earlier prompts: ")) == ["/say hello", "/say one again\n/recall"]
    assert daemon.stderr.count("session opened") == 2


async def test_consecutive_user_messages_keep_their_boundary(daemon: Daemon) -> None:
    # "alpha line" + "beta line" must reach the agent as two lines, not "alpha linebeta line".
    async with daemon.client() as client:
        history = [user("/say first")]
        first = await client.chat("scripted", history)
        history += [first.assistant_message(), user("alpha line"), user("beta line")]
        reply = await client.chat("scripted", history)
    assert reply.text == "echo: alpha line\n\nbeta line\n"


async def test_the_connection_limit_holds_when_handshakes_arrive_together(tmp_path: Path, agents_toml: Path) -> None:
    # Handshakes in flight together count too: counting only accepted connections would let them all pass.
    accepted: list[int] = []
    refused: list[int] = []
    release = trio.Event()
    all_answered = trio.Event()

    def answered() -> None:
        if len(accepted) + len(refused) == 25:
            all_answered.set()

    async with serving(tmp_path, agents_toml, "--max-connections", "5") as live:
        auth = [(b"authorization", f"Bearer {live.token}".encode())]

        async def connect(n: int) -> None:
            try:
                async with trio_websocket.open_websocket_url(live.url, extra_headers=auth):
                    accepted.append(n)
                    answered()
                    await release.wait()
            except trio_websocket.HandshakeError as error:
                assert error.status_code == 503  # type: ignore[attr-defined]
                refused.append(n)
                answered()

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for n in range(25):
                    nursery.start_soon(connect, n)
                await all_answered.wait()
                release.set()
    assert len(accepted) == 5 and len(refused) == 20


async def _log_says(daemon: Daemon, text: str, count: int = 1, seconds: float = 20) -> None:
    with trio.fail_after(seconds):
        while daemon.stderr.count(text) < count:
            await trio.sleep(0.05)  # polling another process's log: there is no event to wait on


async def test_fault_agent_sigkill_mid_turn(daemon: Daemon) -> None:
    history = [user("/say working\n/sleep 600000")]
    async with daemon.client() as client:
        turn = await client.start_chat("scripted", history)
        with trio.fail_after(30):
            await turn.first_part.wait()
        status = await client.request("daemon/status", {})
        (agent,) = [a for a in status["agents"] if a["id"] == "scripted"]
        os.kill(agent["pid"], signal.SIGKILL)
        with trio.fail_after(30):
            killed = await turn.result()
        assert killed.error is not None and killed.error.code == -32002 and killed.error.data["retryable"]
        assert killed.text == "working\n"  # what came before the kill was delivered
        with trio.fail_after(30):
            again = await client.chat("scripted", [*history, user("/say still here")])
    assert again.error is None and again.text == "still here\n"


async def test_fault_an_editor_silent_past_every_timeout(tmp_path: Path, agents_toml: Path, marker: str) -> None:
    # The editor receives a tool call and goes quiet: its connection is closed when idle, the session when idle
    # (the agent's waiting MCP call is withdrawn), and nothing is left running; when it comes back with the
    # result, its conversation goes on from the history.
    config = tmp_path / "short.toml"
    config.write_text(agents_toml.read_text().replace("[sessions]", "[sessions]\nidle_ttl = 0.5\ndetached_grace = 0.5"))
    clock = {"name": "get_time", "description": "The time", "inputSchema": {"type": "object"}}
    async with serving(tmp_path, config, "--idle-timeout", "0.5") as live:
        history = [user("/tool get_time {}")]
        async with live.client() as client:
            first = await client.chat("scripted", history, tools=[clock])
            (call,) = first.tool_calls
            await _log_says(live, "closing an idle connection")
        await _log_says(live, "closing an idle session")
        result = {"type": "tool_result", "callId": call["callId"], "content": [{"type": "text", "value": "noon"}]}
        history += [first.assistant_message(), {"role": "user", "content": [result]}]
        async with live.client() as client:
            with trio.fail_after(30):
                back = await client.chat("scripted", [*history, user("/say back again")], tools=[clock])
        assert back.error is None and back.text.endswith("back again\n"), back
    assert processes_with_marker(marker) == []
