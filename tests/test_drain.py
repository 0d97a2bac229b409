"""A daemon stopped gently, over real sockets: /healthz for a load balancer, and SIGTERM with a drain grace —
no new conversation, running turns (their tool calls out with the client included) finish, then exit; a second
signal ends the wait."""

from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest
import trio
import trio_websocket
from conftest import HANG, processes_with_marker
from test_serve import Daemon, serving

pytestmark = pytest.mark.wire

TOOL = {
    "type": "function",
    "function": {"name": "read_file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}},
}


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
    async with serving(
        tmp_path, agents_toml, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--drain-grace", "600"
    ) as daemon:
        client = openai.OpenAI(base_url=f"{daemon.http_url}/v1", api_key=daemon.token, max_retries=0, timeout=HANG)
        messages: list[Any] = [{"role": "user", "content": '/tool read_file {"path": "a.txt"}'}]

        def first() -> Any:
            return client.chat.completions.create(model="scripted", messages=messages, tools=[TOOL])  # type: ignore[list-item]

        asked = await trio.to_thread.run_sync(first)
        (call,) = asked.choices[0].message.tool_calls or []
        # The agent's turn waits for the tool's result, which the client has not sent yet: it is owed.
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
        with pytest.raises(trio_websocket.HandshakeError):  # no new editor connection either
            headers = [(b"authorization", f"Bearer {daemon.token}".encode())]
            async with trio_websocket.open_websocket_url(daemon.url, extra_headers=headers):
                pass

        messages += [
            asked.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "the contents of a.txt"},
        ]
        finished = await trio.to_thread.run_sync(first)  # the running conversation goes on to its end
        assert "the contents of a.txt" in (finished.choices[0].message.content or "")
        with trio.fail_after(HANG):  # nothing is owed any more: the daemon stops by itself
            assert await daemon.process.wait() == 0
    assert "drained" in daemon.stderr and "drain ended" not in daemon.stderr
    assert processes_with_marker(marker) == []


async def test_a_second_signal_ends_the_drain_and_cancels_what_runs(
    tmp_path: Path, agents_toml: Path, marker: str
) -> None:
    async with serving(
        tmp_path, agents_toml, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--drain-grace", "600"
    ) as daemon:
        client = openai.OpenAI(base_url=f"{daemon.http_url}/v1", api_key=daemon.token, max_retries=0, timeout=HANG)
        seen: dict[str, Any] = {}

        def long_turn() -> None:
            stream = client.chat.completions.create(
                model="scripted", messages=[{"role": "user", "content": "/say started\n/sleep 600000"}], stream=True
            )
            said = ""
            for chunk in stream:
                if chunk.choices:
                    said += chunk.choices[0].delta.content or ""
                    seen["first"] = True
                    seen["finish"] = chunk.choices[0].finish_reason or seen.get("finish")
            seen["text"] = said

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, long_turn)
            with trio.fail_after(HANG):
                while not seen.get("first"):
                    await trio.sleep(0.05)  # polling what the SDK's thread has read: the turn is running
            daemon.process.send_signal(signal.SIGTERM)
            await _until_draining(daemon)
            daemon.process.send_signal(signal.SIGINT)
            with trio.fail_after(HANG):
                assert await daemon.process.wait() == 0
    assert seen["text"].startswith("started") and seen["finish"] == "stop"  # ended as a cancelled turn
    assert "drain ended: what still runs is cancelled" in daemon.stderr
    assert "conversations_owing=1 http_requests=1" in daemon.stderr
    assert processes_with_marker(marker) == []
