"""The direct side's independent tool server in ``make bench-agents``: ``get_weather`` on the official MCP SDK's
server, answering at once.

It shares no code with lmbridge: the baseline a user's agent has when it is given a tool the usual way. Over stdio
(``python bench/weather_mcp.py``, until its input ends), or with ``--http`` over streamable HTTP on 127.0.0.1 as the
SDK serves it (Starlette on uvicorn): it then writes one line, ``{"url": …}``, and serves until its stdin ends.

It offers what lmbridge's server offers and no more, so that the agent's model sees the same tools on both sides:
the SDK's low-level ``Server`` with tools alone. (Its high-level ``MCPServer`` also advertises resources and prompts,
and Claude Code and OpenCode then give their model three resource tools more: 1.5 – 2.1 KB a request.) The tool is
the bench editor's, answered in text only, as the editor answers.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
from typing import Any

ANSWER = "Sunny, 22 degrees"  # what the editor answers on the bridged side
TOOL = {
    "name": "get_weather",
    "description": "The current weather in a city.",
    "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def server() -> Any:
    from mcp import types
    from mcp.server.lowlevel import Server

    tool = types.Tool.model_validate(TOOL)

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        if params.name != tool.name:
            return types.CallToolResult(content=[types.TextContent(type="text", text="no such tool")], is_error=True)
        return types.CallToolResult(content=[types.TextContent(type="text", text=ANSWER)])

    return Server("editor", on_list_tools=list_tools, on_call_tool=call_tool)


def serve_stdio() -> None:
    import anyio
    from mcp.server.stdio import stdio_server

    mcp = server()

    async def run() -> None:
        async with stdio_server() as (read_stream, write_stream):
            await mcp.run(read_stream, write_stream, mcp.create_initialization_options())

    anyio.run(run)


def serve_http() -> None:
    import asyncio

    import uvicorn

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    app = server().streamable_http_app()
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    http = uvicorn.Server(config)

    def until_stdin_ends() -> None:
        sys.stdin.buffer.read()
        http.should_exit = True

    threading.Thread(target=until_stdin_ends, daemon=True).start()
    sys.stdout.write(json.dumps({"url": f"http://127.0.0.1:{port}/mcp"}) + "\n")
    sys.stdout.flush()
    asyncio.run(http.serve(sockets=[listener]))


def main() -> int:
    if "--http" in sys.argv[1:]:
        serve_http()
    else:
        serve_stdio()
    return 0


if __name__ == "__main__":
    sys.exit(main())
