"""JSON-RPC over WebSocket (trio-websocket): one message per text frame. Used by ``lmbridge serve`` and by clients
that connect to it.

Owns the wire adapter and the client-side connect (``ws://``, ``wss://`` and ``ws+unix://PATH``, with the bearer
token in the handshake).
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio
import trio_websocket

from wire.errors import INVALID_REQUEST, RpcError

from .protocol import InvalidMessage, JsonRpcProtocol

__all__ = ["WebSocketWire", "open_websocket"]


class WebSocketWire:
    """JSON-RPC over a WebSocket: one message per text frame."""

    def __init__(self, ws: trio_websocket.WebSocketConnection) -> None:
        self._ws = ws
        self.last_activity = trio.current_time()

    async def read(self, protocol: JsonRpcProtocol) -> list[Any] | None:
        try:
            message = await self._ws.get_message()
        except trio_websocket.ConnectionClosed:
            return None
        self.last_activity = trio.current_time()
        if isinstance(message, bytes):
            return [
                InvalidMessage(
                    RpcError(
                        INVALID_REQUEST,
                        "Invalid Request: binary frames are not supported; "
                        "send each JSON-RPC message as one text frame",
                    ),
                    None,
                    b"",
                )
            ]
        return [protocol.receive_message(message)]

    async def write(self, messages: list[bytes]) -> None:
        for data in messages:
            try:
                await self._ws.send_message(data[:-1].decode())
            except trio_websocket.ConnectionClosed as exc:
                raise trio.BrokenResourceError(str(exc)) from None

    def write_nowait(self, data: bytes) -> int:
        return 0  # frames go out through the library's (async) send only

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(2):
            await self._ws.aclose()


@asynccontextmanager
async def open_websocket(
    url: str, token: str, *, max_message_bytes: int = 64 * 1024 * 1024, ssl_context: ssl.SSLContext | None = None
) -> AsyncIterator[trio_websocket.WebSocketConnection]:
    """A client connection to ``lmbridge serve`` at ``url`` (``ws://HOST:PORT``, ``wss://...``, ``ws+unix://PATH``)."""
    headers = [(b"authorization", f"Bearer {token}".encode())]
    async with trio.open_nursery() as nursery:
        if url.startswith("ws+unix://"):
            stream = await trio.open_unix_socket(url.removeprefix("ws+unix://"))
            ws = await trio_websocket.wrap_client_stream(
                nursery, stream, "localhost", "/", extra_headers=headers, max_message_size=max_message_bytes
            )
        else:
            ws = await trio_websocket.connect_websocket_url(
                nursery, url, ssl_context, extra_headers=headers, max_message_size=max_message_bytes
            )
        try:
            yield ws
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                await ws.aclose()
            nursery.cancel_scope.cancel()
