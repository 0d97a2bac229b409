"""A daemon stopped gently, over real sockets: /healthz for a load balancer, and SIGTERM with a drain grace —
no new conversation, running turns (their tool calls out with the client included) finish, then exit; a second
signal ends the wait."""

from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import openai
import pytest
import trio
from conftest import HANG, processes_with_marker
from fakes import tool_result, user
from test_serve import Daemon, serving

from bridge.editor.client import connect_daemon

pytestmark = pytest.mark.wire

EDITOR_TOOL = {"name": "read_file", "description": "Read a file", "inputSchema": {"type": "object"}}


def _get(url: str) -> tuple[int, Any]:
    """GET without a token (a load balancer has none): the status and the JSON body."""
    try:
        with urllib.request.urlopen(url, timeout=HANG) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _health(daemon: Daemon) -> tuple[int, Any]:
    return _get(f"{daemon.http_url}/healthz")


async def _until_draining(daemon: Daemon) -> None:
    with trio.fail_after(HANG):
        while (await trio.to_thread.run_sync(_health, daemon))[0] != 503:
            await trio.sleep(0.05)  # polling: the signal is handled in the daemon's own time


@asynccontextmanager
async def _draining(tmp_path: Path, agents_toml: Path) -> AsyncIterator[tuple[Daemon, openai.OpenAI]]:
    """A daemon with both fronts and a long drain grace, and an SDK client of its HTTP API."""
    args = ("--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--drain-grace", "600")
    async with serving(tmp_path, agents_toml, *args) as daemon:
        yield daemon, openai.OpenAI(base_url=f"{daemon.http_url}/v1", api_key=daemon.token, max_retries=0, timeout=HANG)


async def _streaming(nursery: trio.Nursery, client: openai.OpenAI, content: str, seen: dict[str, Any]) -> None:
    """Start a streamed turn in a thread of ``nursery``, and return once its first text has come: ``seen`` gets
    ``text`` (all of it) and ``finish`` (the last finish reason) when the stream ends."""

    def stream() -> None:
        said = ""
        chunks = client.chat.completions.create(
            model="scripted", messages=[{"role": "user", "content": content}], stream=True
        )
        for chunk in chunks:
            if chunk.choices:
                said += chunk.choices[0].delta.content or ""
                seen["first"] = True
                seen["finish"] = chunk.choices[0].finish_reason or seen.get("finish")
        seen["text"] = said

    nursery.start_soon(trio.to_thread.run_sync, stream)
    with trio.fail_after(HANG):
        while not seen.get("first"):
            await trio.sleep(0.05)  # polling what the SDK's thread has read: the turn is running


async def test_healthz_says_ready_without_a_token_and_nothing_else(
    tmp_path: Path, agents_toml: Path, marker: str
) -> None:
    async with serving(tmp_path, agents_toml, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0") as daemon:
        assert await trio.to_thread.run_sync(_health, daemon) == (200, {"status": "ready"})
        status, _body = await trio.to_thread.run_sync(_get, f"{daemon.http_url}/v1/models")
        assert status == 401  # only /healthz goes without a token
    assert daemon.process.returncode == 0
    assert processes_with_marker(marker) == []


@pytest.mark.smoke
async def test_sigterm_drains_running_conversations_refuses_new_ones_and_exits_when_done(
    tmp_path: Path, agents_toml: Path, marker: str
) -> None:
    async with _draining(tmp_path, agents_toml) as (daemon, client), connect_daemon(daemon.url, daemon.token) as editor:
        with trio.fail_after(HANG):
            await editor.initialize(clientInfo={"name": "code"}, workspaceFolders=[str(tmp_path)])
        history = [user('/tool read_file {"path": "a.txt"}')]
        asked = await editor.chat("scripted", history, tools=[EDITOR_TOOL])
        (call,) = asked.tool_calls
        # The agent's turn waits for the tool's result, which the editor has not sent yet: it is owed.
        daemon.process.send_signal(signal.SIGTERM)
        await _until_draining(daemon)
        assert await trio.to_thread.run_sync(_health, daemon) == (503, {"status": "draining"})

        def new_conversation() -> tuple[int, str, str]:
            try:
                client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "/say hi"}])
            except openai.InternalServerError as error:
                return error.status_code, error.response.headers.get("retry-after", ""), str(error)
            return 200, "", ""

        status, retry, message = await trio.to_thread.run_sync(new_conversation)
        assert (status, retry) == (503, "1") and "opens no new conversation" in message
        refused = (await editor.chat("scripted", [user("/say a new conversation")])).error
        assert refused is not None and refused.code == -32007 and refused.data == {"retryAfter": 1.0}
        async with connect_daemon(daemon.url, daemon.token) as again:  # an editor may come back (to its own)
            with trio.fail_after(HANG):
                await again.initialize(clientInfo={"name": "code"}, workspaceFolders=[str(tmp_path)])
        history += [asked.assistant_message(), tool_result(call["callId"], "the contents of a.txt")]
        finished = await editor.chat("scripted", history, tools=[EDITOR_TOOL])  # it goes on to its end
        assert finished.error is None and "the contents of a.txt" in finished.text
        with trio.fail_after(HANG):  # nothing is owed any more: the daemon stops by itself
            assert await daemon.process.wait() == 0
    assert "drained" in daemon.stderr and "drain ended" not in daemon.stderr
    assert processes_with_marker(marker) == []


async def test_a_draining_daemon_lets_a_running_http_turn_finish_but_not_wait_for_its_clients_tools(
    tmp_path: Path, agents_toml: Path, marker: str
) -> None:
    async with _draining(tmp_path, agents_toml) as (daemon, client):
        # An HTTP client's tool call out: its next request carries the history and may go to any node (or to this
        # one once restarted): not waited for.
        tool = {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}
        asked = await trio.to_thread.run_sync(
            lambda: client.chat.completions.create(
                model="scripted",
                messages=[{"role": "user", "content": '/tool read_file {"path": "a"}'}],
                tools=[tool],  # type: ignore[list-item]
            )
        )
        assert asked.choices[0].finish_reason == "tool_calls"
        seen: dict[str, Any] = {}
        async with trio.open_nursery() as nursery:
            await _streaming(nursery, client, "/say started\n/sleep 300\n/say finished", seen)
            daemon.process.send_signal(signal.SIGTERM)
        with trio.fail_after(HANG):
            assert await daemon.process.wait() == 0
    assert seen["text"] == "started\nfinished\n"  # the running turn finished, not cancelled
    assert "drained" in daemon.stderr and "drain ended" not in daemon.stderr
    assert processes_with_marker(marker) == []


async def test_a_drain_does_not_wait_for_an_editor_that_went_away(
    tmp_path: Path, agents_toml: Path, marker: str
) -> None:
    async with _draining(tmp_path, agents_toml) as (daemon, _client):
        async with connect_daemon(daemon.url, daemon.token) as editor:
            with trio.fail_after(HANG):
                await editor.initialize(clientInfo={"name": "code"}, workspaceFolders=[str(tmp_path)])
            asked = await editor.chat("scripted", [user('/tool read_file {"path": "a.txt"}')], tools=[EDITOR_TOOL])
            assert asked.tool_calls  # owed to this editor, which now goes away without an answer
        daemon.process.send_signal(signal.SIGTERM)
        with trio.fail_after(HANG):
            assert await daemon.process.wait() == 0
    assert "drained" in daemon.stderr and "drain ended" not in daemon.stderr
    assert processes_with_marker(marker) == []


async def test_a_second_signal_ends_the_drain_and_cancels_what_runs(
    tmp_path: Path, agents_toml: Path, marker: str
) -> None:
    async with _draining(tmp_path, agents_toml) as (daemon, client):
        seen: dict[str, Any] = {}
        async with trio.open_nursery() as nursery:
            await _streaming(nursery, client, "/say started\n/sleep 600000", seen)
            daemon.process.send_signal(signal.SIGTERM)
            await _until_draining(daemon)
            daemon.process.send_signal(signal.SIGINT)
            with trio.fail_after(HANG):
                assert await daemon.process.wait() == 0
    assert seen["text"].startswith("started") and seen["finish"] == "stop"  # ended as a cancelled turn
    assert "drain ended: what still runs is cancelled" in daemon.stderr
    assert "conversations_owing=1 http_requests=1" in daemon.stderr
    assert processes_with_marker(marker) == []
