"""The daemon's HTTP listener: the HTTP API front (``bridge.http``) on its socket, under the daemon's rules.

Owns the socket (loopback unless allowed, TLS when given), the ``authorize`` check the front applies to every
request (Origin, then the token or a key as ``Authorization: Bearer`` or ``x-api-key``: whose request it is),
serving the front's application on the project's HTTP server, and stopping in order: running turns end as
cancelled and their responses are finished before the server drops its connections.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable

import trio

from bridge.http.app import HttpFront, HttpSettings
from bridge.service.composition import BridgeService
from bridge.service.principals import Principal
from wire.http_server import listening_socket, presented_token, serve_asgi
from wire.observe.logger import Logger

from .security import Refusal, ServeError, check_listen_address, check_origin, origins_in

Authenticate = Callable[[bytes | None], Principal]  # ``KeyRing.authenticate``: raises ``Refusal``

__all__ = ["HttpListener"]


class HttpListener:
    def __init__(self, front: HttpFront, sock: socket.socket, url: str, tls: ssl.SSLContext | None) -> None:
        self.front = front
        self.url = url
        self.token_file = ""  # where its clients find the token (set by whoever loaded it)
        self._socket = sock
        self._tls = tls

    @classmethod
    def open(
        cls,
        service: BridgeService,
        address: tuple[str, int],
        settings: HttpSettings,
        authenticate: Authenticate,
        *,
        tls: ssl.SSLContext | None,
        allow_remote: bool,
        log: Logger,
    ) -> HttpListener:
        """Check the address and bind it; ``ServeError`` says what to change."""
        host, port = address
        check_listen_address(host, allow_remote=allow_remote, tls=tls is not None)
        try:
            sock = listening_socket(host, port)
        except OSError as exc:
            raise ServeError(f"cannot listen on {host}:{port} for HTTP: {exc.strerror or exc}") from None
        shown = host if ":" not in host else f"[{host}]"
        url = f"{'https' if tls else 'http'}://{shown}:{sock.getsockname()[1]}"
        allowed = settings.allowed_origins

        def authorize(raw_headers: list[tuple[bytes, bytes]]) -> Principal | tuple[int, str]:
            headers = {name.lower(): value for name, value in raw_headers}
            try:
                check_origin(origins_in(raw_headers), allowed)
                return authenticate(presented_token(headers))
            except Refusal as refusal:
                return refusal.status, refusal.reason

        return cls(HttpFront(service, settings, authorize, log=log), sock, url, tls)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await serve_asgi(self.front.app, [self._socket], ssl_context=self._tls, task_status=task_status)

    async def finish_turns(self, timeout: float) -> None:
        """End the running turns (answered as cancelled) and wait, at most ``timeout`` seconds, for their
        responses to be written."""
        self.front.cancel_turns()
        with trio.move_on_after(timeout):
            await self.front.wait_idle()

    def close(self) -> None:
        self._socket.close()
