"""The stdio relay's MCP server answered without the SDK (mcp_synthetic.stdio): the SDK's answers, message by message;
the official SDK's client served start to end through the real relay process without the SDK's server; the SDK
taking a connection over when a message needs it; a withdrawn call."""

from __future__ import annotations

import json
import os
import secrets
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from fakes import MCP_DIALOGUE, MCP_TOOLS, mcp_initialize

from mcp_synthetic.early import EARLY_PROTOCOL_VERSIONS
from mcp_synthetic.server import DISCOVERY_REFUSAL, MAX_LINE_BYTES, SessionTools, load_sdk
from mcp_synthetic.stdio import serve_stdio
from mcp_synthetic.wiring import HANDSHAKE, SHIM_PATH
from wire.observe.logs import get_logger
from wire.rpc.protocol import LineFramer


async def _answer(name: str, arguments: Any) -> Any:
    return {"content": [{"type": "text", "value": f"{name}: {json.dumps(arguments)}"}]}, ""


def _tools(invoke: Callable[..., Any] = _answer) -> SessionTools:
    tools = SessionTools(invoke, log=get_logger())
    tools.update(MCP_TOOLS)
    return tools


async def _no_sdk() -> None:
    raise AssertionError("the SDK was needed")


async def _sdk() -> None:
    await trio.to_thread.run_sync(load_sdk)


async def _serve_with_sdk(tools: SessionTools, stream: trio.abc.Stream) -> None:
    """The SDK's server alone on ``stream``: what answered every relay connection before ``mcp_synthetic.stdio``."""
    framer = LineFramer(MAX_LINE_BYTES)

    async def lines() -> AsyncIterator[bytes]:
        while data := await stream.receive_some():
            for line in framer.feed(data):
                assert isinstance(line, bytes)
                yield line

    await tools.serve(lines(), stream.send_all)


class _Agent:
    """The agent's end of a connection: whole messages out, whole messages in."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.received = b""

    async def send(self, message: Any) -> None:
        await self.stream.send_all(json.dumps(message).encode() + b"\n")

    async def receive(self) -> Any:
        with trio.fail_after(30):
            while b"\n" not in self.received:
                data = await self.stream.receive_some()
                assert data, "the server closed the connection"
                self.received += data
        line, _, self.received = self.received.partition(b"\n")
        return json.loads(line)


@asynccontextmanager
async def _connected(
    serve: Callable[[SessionTools, trio.abc.Stream], Awaitable[None]], tools: SessionTools
) -> AsyncIterator[_Agent]:
    agent, server = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve, tools, server)
        yield _Agent(agent)
        nursery.cancel_scope.cancel()


def _early(sdk_ready: Callable[[], Awaitable[None]] = _no_sdk) -> Callable[[SessionTools, trio.abc.Stream], Any]:
    async def serve(tools: SessionTools, stream: trio.abc.Stream) -> None:
        await serve_stdio(tools, stream, sdk_ready=sdk_ready, log=get_logger())

    return serve


_DIALOGUE = [
    *MCP_DIALOGUE,
    {"jsonrpc": "2.0", "method": "notifications/roots/list_changed"},  # nothing answers a notification
    {"jsonrpc": "2.0", "id": 7, "method": "ping"},
]


async def _dialogue(serve: Callable[[SessionTools, trio.abc.Stream], Awaitable[None]], version: str) -> list[Any]:
    answers = []
    async with _connected(serve, _tools()) as agent:
        for message in [mcp_initialize(version), *_DIALOGUE]:
            await agent.send(message)
            if "id" in message:
                answers.append(await agent.receive())
    return answers


@pytest.mark.parametrize("version", sorted(EARLY_PROTOCOL_VERSIONS))
async def test_a_relay_connection_gets_the_sdks_answers_without_the_sdk(version: str) -> None:
    await _sdk()
    assert await _dialogue(_early(), version) == await _dialogue(_serve_with_sdk, version)


async def test_discovery_is_refused_and_initialize_follows_with_or_without_the_sdk() -> None:
    """A client of MCP 2026-07-28 asks ``server/discover`` first and opens with ``initialize`` upon any error; the
    SDK's server would hold the connection to that revision and refuse the ``initialize``."""
    await _sdk()
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    discover = {"jsonrpc": "2.0", "id": "d", "method": "server/discover", "params": {"_meta": meta}}
    for serve in (_early(), _serve_with_sdk):
        async with _connected(serve, _tools()) as agent:
            await agent.send(discover)
            assert await agent.receive() == {
                "jsonrpc": "2.0",
                "id": "d",
                "error": {"code": -32601, "message": DISCOVERY_REFUSAL},
            }
            await agent.send(mcp_initialize("2025-11-25"))
            assert (await agent.receive())["result"]["protocolVersion"] == "2025-11-25"


async def test_the_sdk_takes_a_connection_over_when_a_message_needs_it() -> None:
    """A request answered nowhere here (``resources/list``) hands the connection to the SDK: the agent gets the
    SDK's answer, one answer to its ``initialize`` only, the SDK's answers from then on, the answer of a call that
    was running here when it happened, and the SDK tells it of tool list changes."""
    imported: list[str] = []
    release_call = trio.Event()

    async def invoke(name: str, arguments: Any) -> Any:
        if name == "erase":
            await release_call.wait()
        return await _answer(name, arguments)

    async def sdk() -> None:
        imported.append("SDK")
        await _sdk()

    tools = _tools(invoke)
    async with _connected(_early(sdk), tools) as agent:
        await agent.send(mcp_initialize("2025-06-18"))
        assert (await agent.receive())["id"] == 0
        await agent.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        await agent.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "erase"}})
        await agent.send({"jsonrpc": "2.0", "id": 2, "method": "resources/list"})
        answer = await agent.receive()
        assert imported == ["SDK"]
        assert answer["id"] == 2 and answer["error"]["code"] == -32601  # the SDK's: no resources here
        await agent.send({"jsonrpc": "2.0", "id": 0, "method": "tools/list"})  # an id the opening used: answered
        listed = await agent.receive()
        assert listed["id"] == 0 and [tool["name"] for tool in listed["result"]["tools"]] == [
            t["name"] for t in MCP_TOOLS
        ]
        release_call.set()
        call = await agent.receive()
        assert call["id"] == 1 and call["result"]["content"][0]["text"] == "erase: {}"
        tools.update(MCP_TOOLS[:1])
        await tools.notify_changed()
        assert await agent.receive() == {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
        await agent.send({"jsonrpc": "2.0", "id": 3, "method": "ping"})
        assert await agent.receive() == {"jsonrpc": "2.0", "id": 3, "result": {}}  # no second list_changed before


async def test_a_withdrawn_call_is_cancelled_and_gets_no_answer() -> None:
    running = trio.Event()
    withdrawn = trio.Event()

    async def invoke(name: str, arguments: Any) -> Any:
        running.set()
        try:
            await trio.sleep_forever()
        finally:
            withdrawn.set()

    async with _connected(_early(), _tools(invoke)) as agent:
        await agent.send(mcp_initialize("2025-11-25"))
        await agent.receive()
        await agent.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        params = {"name": "erase", "arguments": {}, "_meta": {"progressToken": "p"}}
        await agent.send({"jsonrpc": "2.0", "id": "call", "method": "tools/call", "params": params})
        with trio.fail_after(30):
            await running.wait()
        await agent.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "call"}})
        with trio.fail_after(30):
            await withdrawn.wait()
        await agent.send({"jsonrpc": "2.0", "id": 9, "method": "ping"})
        assert await agent.receive() == {"jsonrpc": "2.0", "id": 9, "result": {}}  # nothing for the call before it


async def test_the_calls_running_end_when_the_agent_hangs_up() -> None:
    withdrawn = trio.Event()

    async def invoke(name: str, arguments: Any) -> Any:
        try:
            await trio.sleep_forever()
        finally:
            withdrawn.set()

    agent_end, server = trio.testing.memory_stream_pair()
    agent = _Agent(agent_end)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_early(), _tools(invoke), server)
        await agent.send(mcp_initialize("2025-11-25"))
        await agent.receive()
        await agent.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "erase"}})
        await trio.testing.wait_all_tasks_blocked()
        await agent_end.aclose()
        with trio.fail_after(30):
            await withdrawn.wait()  # and the server returns: the nursery exits


async def test_a_line_over_the_limit_closes_the_connection() -> None:
    agent_end, server = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_early(), _tools(), server)
        chunk = b"x" * (1 << 20)
        with trio.fail_after(60):
            for _ in range(MAX_LINE_BYTES // len(chunk) + 1):
                await agent_end.send_all(chunk)
            assert await agent_end.receive_some() == b""  # closed by the server, nothing answered


@asynccontextmanager
async def _relay_socket(tools: SessionTools, sdk_ready: Callable[[], Awaitable[None]]) -> AsyncIterator[dict[str, str]]:
    """A unix socket served as lmbridge serves a stdio session's, token first; the relay's environment."""
    token = secrets.token_urlsafe(16)
    directory = Path(await trio.to_thread.run_sync(lambda: __import__("tempfile").mkdtemp(prefix="lmb-")))
    path = directory / "s.sock"
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await sock.bind(str(path))
    sock.listen(4)
    listener = trio.SocketListener(sock)

    async def accept() -> None:
        async with listener:
            while True:
                stream = await listener.accept()
                line = b""
                while not line.endswith(b"\n"):  # a byte at a time: what follows is the server's to read
                    line += await stream.receive_some(1)
                assert line == HANDSHAKE + token.encode() + b"\n"
                await serve_stdio(tools, stream, sdk_ready=sdk_ready, log=get_logger())

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(accept)
            yield {"LMBRIDGE_MCP_SOCKET": str(path), "LMBRIDGE_MCP_TOKEN": token}
            nursery.cancel_scope.cancel()
    finally:
        os.unlink(path)
        os.rmdir(directory)


async def test_the_official_client_is_served_through_the_relay_process_without_the_sdks_server() -> None:
    """The MCP SDK's own stdio client starts the real relay (``python -I -S shim.py``) as an agent does: it asks
    ``server/discover`` first, falls back to ``initialize``, lists and calls tools and hears of a change — and
    lmbridge's side never needs the SDK's server."""
    import mcp_types
    from mcp import Client, StdioServerParameters

    notified = trio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, mcp_types.ToolListChangedNotification):
            notified.set()

    tools = _tools()
    async with _relay_socket(tools, _no_sdk) as env:
        relay = StdioServerParameters(command=sys.executable, args=["-I", "-S", SHIM_PATH], env=env)
        with trio.fail_after(60):
            async with Client(relay, message_handler=on_message) as client:
                assert client.protocol_version == "2025-11-25"
                listed = await client.list_tools()
                assert [tool.name for tool in listed.tools] == ["get_weather", "erase", "broken"]
                result = await client.call_tool("get_weather", {"city": "Oslo"})
                assert result.content[0].text == 'get_weather: {"city": "Oslo"}'  # type: ignore[union-attr]
                assert tools.update([*MCP_TOOLS, {"name": "get_time", "inputSchema": {"type": "object"}}])
                await tools.notify_changed()
                await notified.wait()
                assert "get_time" in [tool.name for tool in (await client.list_tools()).tools]
