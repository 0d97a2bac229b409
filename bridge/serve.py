"""``lmbridge serve``: the daemon on a WebSocket, for any number of editors at once.

Owns the listening sockets (TCP on loopback by default, or a unix socket), the handshake checks that come before
any method can run — bearer token, Origin, connection limit — the token file, one ``EditorConnection`` per
WebSocket connection (one JSON-RPC message per text frame), per-connection limits (message size, requests in
flight, idle timeout), and the orderly stop on SIGTERM/SIGINT: stop accepting, cancel running turns, close
sessions, stop agent process groups, exit 0.

Sessions belong to the daemon, not to a connection: an editor that disconnects and reconnects continues its
conversation, and a turn whose connection dropped keeps its agent's output for the editor's retry.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
import secrets
import signal
import socket
import ssl
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
import trio_websocket

from .config import Config
from .daemon import Daemon
from .editor import EditorConnection
from .rpc import EDITOR_CANCEL, JsonRpcConnection
from .websocket import WebSocketWire

__all__ = ["ServeOptions", "ServeError", "load_token", "serve_websocket", "default_token_path"]


class ServeError(Exception):
    """A problem with how the daemon was asked to serve: the message says what to change."""


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 0
    unix_path: str | None = None
    token_file: str | None = None
    allow_remote: bool = False
    tls_cert: str | None = None
    tls_key: str | None = None
    allowed_origins: tuple[str, ...] = ()
    max_connections: int = 64
    max_message_bytes: int = 64 * 1024 * 1024
    idle_timeout: float = 3600.0
    max_requests: int = 32
    default_cwd: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def default_token_path() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "lmbridge" / "token"


def load_token(path: Path) -> str:
    """The token in ``path``; a new random one (file created 0600) if it does not exist. A file that other users
    can read is refused: the token is the only thing between them and the agents."""
    try:
        info = path.stat()
    except FileNotFoundError:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        token = secrets.token_urlsafe(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(token + "\n")
        return token
    if not stat.S_ISREG(info.st_mode):
        raise ServeError(f"token file {path} is not a regular file")
    if info.st_mode & 0o077:
        raise ServeError(f"token file {path} is accessible by other users (mode {stat.S_IMODE(info.st_mode):04o}); "
                         f"run: chmod 600 {path}")
    token = path.read_text().strip()
    if len(token) < 16:
        raise ServeError(f"token file {path} holds no usable token (at least 16 characters); delete it to get a new one")
    return token


class _UnixListener(trio.abc.Listener[trio.SocketStream]):
    """A unix-socket listener that trio-websocket does not mistake for a TCP one (it parses TCP socket names)."""

    def __init__(self, listener: trio.SocketListener) -> None:
        self._listener = listener

    async def accept(self) -> trio.SocketStream:
        return await self._listener.accept()

    async def aclose(self) -> None:
        await self._listener.aclose()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _ssl_context(options: ServeOptions) -> ssl.SSLContext | None:
    if not (options.tls_cert or options.tls_key):
        return None
    if not (options.tls_cert and options.tls_key):
        raise ServeError("give both --tls-cert and --tls-key")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(options.tls_cert, options.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise ServeError(f"cannot load the TLS certificate/key: {exc}") from None
    return context


class WebSocketDaemon:
    """Accepts editors; their connections run in ``handlers``, a nursery that outlives accepting (so a stop can
    refuse new editors while answering the connected ones)."""

    def __init__(self, daemon: Daemon, options: ServeOptions, token: str, *, log: Any, tracer: Any = None) -> None:
        self._daemon = daemon
        self.handlers: trio.Nursery | None = None
        self._options = options
        self._token = token.encode()
        self._log = log
        self._tracer = tracer
        self._connections: dict[int, tuple[EditorConnection, JsonRpcConnection]] = {}
        self._ids = iter(range(1, 1 << 62))
        self._accepting = True
        self.url = ""

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    async def open_listeners(self) -> list[Any]:
        """Check the options and open the listening sockets; ``ServeError`` says what to change."""
        options = self._options
        context = _ssl_context(options)
        if options.unix_path is None and not _is_loopback(options.host):
            if not options.allow_remote:
                raise ServeError(f"refusing to listen on {options.host}: not a loopback address. To accept remote "
                                 "editors, add --allow-remote and TLS (--tls-cert/--tls-key)")
            if context is None:
                raise ServeError("--allow-remote needs TLS: give --tls-cert and --tls-key")
        listeners: list[Any]
        if options.unix_path is not None:
            listeners = [await self._unix_listener(Path(options.unix_path))]
            self.url = f"{'wss+unix' if context else 'ws+unix'}://{Path(options.unix_path).resolve()}"
        else:
            try:
                listeners = await trio.open_tcp_listeners(options.port, host=options.host)
            except OSError as exc:
                raise ServeError(f"cannot listen on {options.host}:{options.port}: {exc.strerror or exc}") from None
            port = listeners[0].socket.getsockname()[1]
            host = options.host if ":" not in options.host else f"[{options.host}]"
            self.url = f"{'wss' if context else 'ws'}://{host}:{port}"
        if context is not None:
            listeners = [trio.SSLListener(listener, context, https_compatible=True) for listener in listeners]
        return listeners

    async def run(self, listeners: list[Any], *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Accept connections until cancelled; they are handled in the ``handlers`` nursery."""
        server = trio_websocket.WebSocketServer(
            self._handle, listeners, handler_nursery=self.handlers, max_message_size=self._options.max_message_bytes,
            connect_timeout=10, disconnect_timeout=5)
        await server.run(task_status=task_status)

    async def _unix_listener(self, path: Path) -> trio.abc.Listener[trio.SocketStream]:
        if path.exists():
            if not path.is_socket():
                raise ServeError(f"{path} exists and is not a socket")
            path.unlink()  # a stale socket from an earlier run
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await sock.bind(str(path))
        os.chmod(path, 0o600)
        sock.listen(64)
        return _UnixListener(trio.SocketListener(sock))

    # -- connections --------------------------------------------------------------------------------------------

    async def _handle(self, request: trio_websocket.WebSocketRequest) -> None:
        headers = {name.lower(): value for name, value in request.headers}
        refusal = self._check(headers)
        if refusal is not None:
            status, why = refusal
            self._log.warning("refused a connection", reason=why)
            await request.reject(status, extra_headers=[(b"content-type", b"text/plain")], body=why.encode())
            return
        ws = await request.accept()
        number = next(self._ids)
        name = f"editor:{number}"
        editor = EditorConnection(self._daemon, name=name, default_cwd=self._options.default_cwd,
                                  shutdown_stops_daemon=False)
        wire = WebSocketWire(ws)
        connection = JsonRpcConnection(wire, editor.methods, name=name, cancel_style=EDITOR_CANCEL, tracer=self._tracer,
                                       max_message_bytes=self._options.max_message_bytes,
                                       max_concurrent_requests=self._options.max_requests, parse=editor.parse)
        editor.connection = connection
        self._connections[number] = (editor, connection)
        self._log.info("editor connected", conn=name, connections=len(self._connections))
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(connection.serve)
                nursery.start_soon(self._close_when_idle, connection, wire, editor)
                await connection.peer_closed.wait()
                # Nobody is listening any more: running turns are detached at once (their output is kept for
                # the editor's return), not waited for.
                await connection.aclose(timeout=0)
                nursery.cancel_scope.cancel()
        finally:
            del self._connections[number]
            self._log.info("editor disconnected", conn=name, connections=len(self._connections))

    def _check(self, headers: dict[bytes, bytes]) -> tuple[int, str] | None:
        if not self._accepting:
            return 503, "lmbridge is shutting down"
        if len(self._connections) >= self._options.max_connections:
            return 503, f"too many connections (the limit is {self._options.max_connections})"
        authorization = headers.get(b"authorization", b"")
        scheme, _, presented = authorization.partition(b" ")
        if scheme.lower() != b"bearer" or not presented:
            return 401, "missing token: send the header 'Authorization: Bearer <token>' (the token is in the token file)"
        if not hmac.compare_digest(presented.strip(), self._token):
            return 401, "wrong token"
        origin = headers.get(b"origin")
        if origin is not None and origin.decode("latin-1") not in self._options.allowed_origins:
            return 403, (f"origin {origin.decode('latin-1')!r} is not allowed (browsers may not talk to lmbridge "
                         "unless started with --allow-origin)")
        return None

    async def _close_when_idle(self, connection: JsonRpcConnection, wire: WebSocketWire, editor: EditorConnection) -> None:
        timeout = self._options.idle_timeout
        while True:
            await trio.sleep_until(wire.last_activity + timeout)
            if trio.current_time() >= wire.last_activity + timeout and connection.in_flight == 0:
                self._log.info("closing an idle connection", conn=editor.name, idle_seconds=timeout)
                await connection.aclose()
                return
            if connection.in_flight:  # a long turn is activity too
                wire.last_activity = trio.current_time()

    async def stop(self) -> None:
        """Stop accepting; end every connection's running turns (answered ``cancelled``)."""
        self._accepting = False
        for editor, _connection in list(self._connections.values()):
            editor.cancel_turns()

    async def close_connections(self) -> None:
        async with trio.open_nursery() as nursery:
            for _editor, connection in list(self._connections.values()):
                nursery.start_soon(connection.aclose)


async def serve_websocket(config: Config, options: ServeOptions, *, log: Any, tracer: Any = None, stdout: Any = None) -> int:
    token_path = Path(options.token_file).expanduser() if options.token_file else default_token_path()
    token = load_token(token_path)
    if tracer is not None:
        tracer.add_secret(token)
    daemon = Daemon(config, log=log, tracer=tracer)
    server = WebSocketDaemon(daemon, options, token, log=log, tracer=tracer)
    listeners = await server.open_listeners()
    daemon.connection_count = lambda: server.connection_count
    url = server.url
    out = stdout if stdout is not None else sys.stdout
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        async with trio.open_nursery() as connections:
            server.handlers = connections
            with trio.CancelScope() as accepting:
                async with trio.open_nursery() as listening:
                    await listening.start(server.run, listeners)
                    out.write(json.dumps({"listening": url, "tokenFile": str(token_path.resolve())}) + "\n")
                    out.flush()
                    log.info("lmbridge serve ready", url=url, pid=os.getpid(), agents=sorted(config.agents))
                    await _wait_for_signal(log)
                    accepting.cancel()
            await server.stop()
            await daemon.shutdown()
            await server.close_connections()
            connections.cancel_scope.cancel()  # what is left are half-open handshakes: nothing owed to them
        nursery.cancel_scope.cancel()
    return 0


async def _wait_for_signal(log: Any) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("stopping on signal", signal=signal.Signals(signum).name)
            return
