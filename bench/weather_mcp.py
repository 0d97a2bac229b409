"""The direct side's independent tool server in ``make bench-agents``: ``get_weather`` on the official MCP SDK's own
high-level server (``MCPServer``, what MCP servers are commonly written with), answering at once.

It shares no code with lmbridge: the baseline a user's agent has when it is given a tool the usual way. Over stdio
(``python bench/weather_mcp.py``, until its input ends), or with ``--http`` over streamable HTTP on 127.0.0.1 as the
SDK serves it (Starlette on uvicorn): it then writes one line, ``{"url": …}``, and serves until its stdin ends.
"""

from __future__ import annotations

import json
import socket
import sys
import threading

ANSWER = "Sunny, 22 degrees"  # what the editor answers on the bridged side


def server() -> object:
    from mcp.server.mcpserver import MCPServer

    mcp = MCPServer("editor", log_level="WARNING")

    # Text only, as the editor answers on the bridged side: no output schema, no structured copy of the answer (the
    # SDK adds both for a typed return), which agents put in their model requests.
    @mcp.tool(name="get_weather", description="The current weather in a city.", structured_output=False)
    def get_weather(city: str) -> str:
        return ANSWER

    return mcp


def serve_http() -> None:
    import asyncio

    import uvicorn

    mcp = server()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    app = mcp.streamable_http_app()  # type: ignore[attr-defined]
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
        server().run("stdio")  # type: ignore[attr-defined]
    return 0


if __name__ == "__main__":
    sys.exit(main())
