"""The tool round trip's baseline: an MCP server on the official ``mcp`` SDK that runs the tool in-process and
answers at once.

Same SDK (the low-level ``Server``), same async library (Trio) and the same newline framing as lmbridge's synthetic
MCP server (``mcp_synthetic/server.py``), over its own stdin/stdout instead of the shim's unix socket: what is left
between the two measurements is the bridge's part — the shim's relay, the socket, the session actor and the round
trip to the editor. It offers one tool, ``echo``, whose result is the text ``ok`` (the bench editor answers the
bridged call with the same text). Run as ``python bench/mcp_server.py``; it exits at end of input.

With ``--http`` it is the baseline of the same figure over streamable HTTP: lmbridge's own MCP endpoint
(``mcp_synthetic.http``, what agents advertising HTTP MCP get) on 127.0.0.1, the tool answered in-process at once.
It writes one line, ``{"url": …, "token": …}``, then serves until its stdin ends.
"""

from __future__ import annotations

import os
from typing import Any

ECHO_TOOL = {
    "name": "echo",
    "description": "Answers ok.",
    "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
}


async def serve() -> None:
    import anyio
    import mcp_types as types
    import trio
    from mcp.server.lowlevel import NotificationOptions, Server
    from mcp.shared.message import SessionMessage

    async def list_tools(ctx: Any, params: Any) -> Any:
        return types.ListToolsResult(
            tools=[
                types.Tool(
                    name=ECHO_TOOL["name"], description=ECHO_TOOL["description"], input_schema=ECHO_TOOL["inputSchema"]
                )
            ]
        )

    async def call_tool(ctx: Any, params: Any) -> Any:
        return types.CallToolResult(content=[types.TextContent(text="ok")], is_error=False)

    server = Server("bench-echo", version="1", on_list_tools=list_tools, on_call_tool=call_tool)
    stdin = trio.lowlevel.FdStream(os.dup(0))
    stdout = trio.lowlevel.FdStream(os.dup(1))
    to_server_send, to_server = anyio.create_memory_object_stream[Any](64)
    from_server, from_server_receive = anyio.create_memory_object_stream[Any](64)

    async def read_lines() -> None:
        buffer = b""
        async with to_server_send:
            while True:
                try:
                    data = await stdin.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    data = b""
                if not data:
                    return
                *lines, buffer = (buffer + data).split(b"\n")
                for line in lines:
                    if line.strip():
                        message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                        await to_server_send.send(SessionMessage(message))

    async def write_lines() -> None:
        async with from_server_receive:
            async for item in from_server_receive:
                data = item.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"
                try:
                    await stdout.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_lines)
        nursery.start_soon(write_lines)
        await server.run(
            to_server, from_server, server.create_initialization_options(NotificationOptions()), raise_exceptions=False
        )
        nursery.cancel_scope.cancel()


async def serve_http() -> None:
    import json
    import secrets
    import sys

    import trio

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from bench.common import QuietLog
    from mcp_synthetic.http import HttpEndpoints
    from mcp_synthetic.server import SessionTools

    async def invoke(name: str, arguments: Any) -> Any:
        return {"content": [{"type": "text", "value": "ok"}]}, ""

    async def nothing() -> None:
        pass  # mcp_synthetic.http imported its HTTP server already

    tools = SessionTools(invoke, log=QuietLog("bench MCP server"))
    tools.update([ECHO_TOOL])
    endpoints = HttpEndpoints(QuietLog("bench MCP server"), nothing, nothing)
    stdin = trio.lowlevel.FdStream(os.dup(0))
    async with trio.open_nursery() as nursery:
        await nursery.start(endpoints.run)
        token = secrets.token_urlsafe(16)
        url, _stop = endpoints.add(tools, token)
        os.write(1, json.dumps({"url": url, "token": token}).encode() + b"\n")
        while await stdin.receive_some(4096):
            pass
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    import sys

    import trio

    trio.run(serve_http if "--http" in sys.argv[1:] else serve)
