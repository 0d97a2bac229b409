"""The demo agent's MCP client side (asyncio, official ``mcp`` SDK): how ``/tool`` and ``/tools`` reach the MCP
servers an ACP client passes in ``session/new``.

Owns one client connection per session, opened on first use and kept until the session closes — the way real
agents hold their MCP servers. Imported only when a directive needs it: ``mcp`` takes about a second to import.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
from typing import Any

__all__ = ["McpConnections", "call_tools", "connections"]


class McpConnections:
    """The MCP servers of one session, connected in a background task that owns their contexts."""

    def __init__(self, servers: list[Any]) -> None:
        self._servers = servers
        self._clients: list[tuple[Any, set[str]]] = []
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._error: BaseException | None = None
        self._task = asyncio.create_task(self._hold())

    async def _hold(self) -> None:
        from mcp import Client, StdioServerParameters, stdio_client

        try:
            async with contextlib.AsyncExitStack() as stack:
                for server in self._servers:
                    if getattr(server, "command", None):
                        env = {**os.environ, **{variable.name: variable.value for variable in server.env or ()}}
                        params = StdioServerParameters(command=server.command, args=list(server.args or ()), env=env)
                        transport = stdio_client(params)
                    elif getattr(server, "url", None):
                        from mcp.client.streamable_http import streamable_http_client

                        headers = {header.name: header.value for header in server.headers or ()}
                        import httpx2

                        http = await stack.enter_async_context(httpx2.AsyncClient(headers=headers, timeout=None))
                        transport = streamable_http_client(str(server.url), http_client=http)
                    else:
                        continue
                    client = await stack.enter_async_context(Client(transport, mode="legacy"))
                    listed = await client.list_tools()
                    self._clients.append((client, {tool.name for tool in listed.tools}))
                self._ready.set()
                await self._stop.wait()
        except BaseException as exc:  # surfaced to the next call as a failed tool
            self._error = exc
            self._ready.set()

    async def call(
        self, name: str, arguments: Any, timeout: float | None = None, *, progress: Any = None
    ) -> tuple[bool, str]:
        """``progress``: the MCP client's progress callback (the call then carries a progress token)."""
        await self._ready.wait()
        if self._error is not None:
            return False, f"cannot reach the MCP server: {type(self._error).__name__}: {self._error}"
        if not self._clients:
            return False, "no MCP server was given in session/new"
        client = next((c for c, names in self._clients if name in names), self._clients[0][0])
        from mcp.shared.exceptions import MCPError

        try:
            result = await client.call_tool(
                name,
                arguments if isinstance(arguments, dict) else {"value": arguments},
                read_timeout_seconds=timeout,
                progress_callback=progress,
            )
        except MCPError as exc:
            return False, f"MCP error {exc.error.code}: {exc.error.message}"
        pieces = []
        for content in result.content:
            if content.type == "text":
                pieces.append(content.text)
            elif content.type == "image":
                pieces.append(f"[image {content.mime_type}, {len(base64.b64decode(content.data))} bytes]")
            else:
                pieces.append(f"[{content.type}]")
        return not result.is_error, "".join(pieces)

    async def aclose(self) -> None:
        self._stop.set()
        with contextlib.suppress(BaseException):
            await self._task


def connections(session: Any) -> McpConnections:
    """The session's MCP connections, opened on first use."""
    if session.tools is None:
        session.tools = McpConnections(session.mcp_servers)
    tools: McpConnections = session.tools
    return tools


async def call_tools(
    session: Any, calls: tuple[tuple[str, Any], ...], timeout: float | None = None
) -> list[tuple[bool, str]]:
    tools = connections(session)
    return list(await asyncio.gather(*(tools.call(name, arguments, timeout) for name, arguments in calls)))
