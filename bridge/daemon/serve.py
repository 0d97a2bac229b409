"""``lmbridge serve``: the daemon, for any number of editors (WebSocket, editor protocol v1) and HTTP clients
(the OpenAI/Anthropic-compatible API of ``bridge.http``) at once.

Owns the listening sockets (TCP on loopback by default, or a unix socket for the WebSocket), the checks that come
before any method can run — bearer token, Origin, connection limit — the token file, one ``EditorConnection`` per
WebSocket connection (one JSON-RPC message per text frame), per-connection limits (message size, requests in
flight, idle timeout), serving the HTTP front on Hypercorn (``wire.http_server``) with the same token, Origin and
TLS rules, and the orderly stop on SIGTERM/SIGINT: stop accepting, cancel running turns, close sessions, stop agent
process groups, exit 0.

Sessions belong to the daemon, not to a connection: an editor that disconnects and reconnects continues its
conversation, and a turn whose connection dropped keeps its agent's output for the editor's retry.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
import trio_websocket

from bridge.config import Config
from bridge.editor.connection import EditorConnection
from bridge.service.composition import BridgeService
from bridge.service.limits import DAY
from bridge.service.principals import Principal
from wire.http_server import bearer
from wire.observe.logger import Logger
from wire.observe.redact import add_secret
from wire.rpc.connection import EDITOR_CANCEL, JsonRpcConnection
from wire.rpc.websocket import WebSocketWire

from .agent_models import install_agent_models
from .audit import AuditLog, audit_path_for
from .keys import KeyRing, KeysFile, keys_path_for
from .ledger import UsageLedger, ledger_path_for
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .metrics import DaemonMetrics
from .security import (
    Refusal,
    ServeError,
    beside_token,
    check_listen_address,
    check_origin,
    default_token_path,
    load_token,
    origins_in,
    ssl_context,
)

__all__ = ["ServeOptions", "WebSocketDaemon", "serve_daemon"]


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 0
    unix_path: str | None = None
    token_file: str | None = None
    keys_file: str | None = None  # default: keys.json beside the token file
    ledger_file: str | None = None  # the usage ledger; default: usage.db beside the token file
    audit_file: str | None = None  # the audit log; default: audit.log beside the token file
    allow_remote: bool = False
    tls_cert: str | None = None
    tls_key: str | None = None
    allowed_origins: tuple[str, ...] = ()
    max_connections: int = 64
    max_message_bytes: int = 64 * 1024 * 1024
    idle_timeout: float = 3600.0
    max_requests: int = 32
    default_cwd: str | None = None
    websocket: bool = True  # the WebSocket editor listener (off: HTTP API only)
    http: tuple[str, int] | None = None  # host and port of the HTTP API, when it is served
    http_max_turns: int = 32
    http_activity: str = "native"
    drain_grace: float = 0.0  # seconds a SIGTERM lets running turns finish (0: they are cancelled at once)
    open_metrics: bool = False  # /metrics without a key for loopback clients


class _UnixListener(trio.abc.Listener[trio.SocketStream]):
    """A unix-socket listener that trio-websocket does not mistake for a TCP one (it parses TCP socket names)."""

    def __init__(self, listener: trio.SocketListener) -> None:
        self._listener = listener

    async def accept(self) -> trio.SocketStream:
        return await self._listener.accept()

    async def aclose(self) -> None:
        await self._listener.aclose()


class WebSocketDaemon:
    """Accepts editors; their connections run in ``handlers``, a nursery that outlives accepting (so a stop can
    refuse new editors while answering the connected ones)."""

    def __init__(
        self, service: BridgeService, options: ServeOptions, keyring: KeyRing, *, log: Logger, tracer: Any = None
    ) -> None:
        self.on_refused: Callable[[str, str], None] | None = None  # told (reason, peer) of each handshake refused
        self._service = service
        self.handlers: trio.Nursery | None = None
        self._options = options
        self._keyring = keyring
        self._log = log
        self._tracer = tracer
        self._connections: dict[int, tuple[EditorConnection, JsonRpcConnection]] = {}
        self._admitted = 0  # handshakes past the checks (connections being accepted or served): the limit counts these
        self._ids = iter(range(1, 1 << 62))
        self._accepting = True
        self.url = ""

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    async def open_listeners(self) -> list[Any]:
        """Check the options and open the listening sockets; ``ServeError`` says what to change."""
        options = self._options
        context = ssl_context(options.tls_cert, options.tls_key)
        if options.unix_path is None:
            check_listen_address(options.host, allow_remote=options.allow_remote, tls=context is not None)
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

    async def run(
        self,
        listeners: list[Any],
        *,
        task_status: trio.TaskStatus[trio_websocket.WebSocketServer] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept connections until cancelled; they are handled in the ``handlers`` nursery."""
        server = trio_websocket.WebSocketServer(
            self._handle,
            listeners,
            handler_nursery=self.handlers,
            max_message_size=self._options.max_message_bytes,
            connect_timeout=10,
            disconnect_timeout=5,
        )
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
        checked = self._check(request.headers)
        if not isinstance(checked, Principal):
            status, why = checked
            self._log.warning("refused a connection", reason=why)
            if self.on_refused is not None and status in (401, 403):
                remote = request.remote
                self.on_refused(why, str(getattr(remote, "address", remote)))
            await request.reject(status, extra_headers=[(b"content-type", b"text/plain")], body=why.encode())
            return
        # The slot is taken in the same step as the check (no await between them): handshakes that arrive
        # together cannot all pass a check that only counts connections already accepted.
        self._admitted += 1
        try:
            await self._serve_connection(request, checked)
        finally:
            self._admitted -= 1

    async def _serve_connection(self, request: trio_websocket.WebSocketRequest, principal: Principal) -> None:
        ws = await request.accept()
        number = next(self._ids)
        name = f"editor:{number}"
        editor = EditorConnection(
            self._service,
            name=name,
            default_cwd=self._options.default_cwd,
            shutdown_stops_daemon=False,
            principal=principal,
            authorized=lambda: self._keyring.valid(principal),
        )
        wire = WebSocketWire(ws)
        connection = JsonRpcConnection(
            wire,
            editor.methods,
            name=name,
            cancel_style=EDITOR_CANCEL,
            tracer=self._tracer,
            max_message_bytes=self._options.max_message_bytes,
            max_concurrent_requests=self._options.max_requests,
            parse=editor.parse,
        )
        editor.connection = connection
        self._connections[number] = (editor, connection)
        self._log.info("editor connected", conn=name, key=principal.name, connections=len(self._connections))
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
            editor.close()
            del self._connections[number]
            self._log.info("editor disconnected", conn=name, connections=len(self._connections))

    def _check(self, raw_headers: list[tuple[bytes, bytes]]) -> Principal | tuple[int, str]:
        """Whose connection it is, or why it is refused (status, reason)."""
        headers = {name.lower(): value for name, value in raw_headers}
        if not self._accepting:
            return 503, "lmbridge is shutting down"
        if self._admitted >= self._options.max_connections:
            return 503, f"too many connections (the limit is {self._options.max_connections})"
        try:
            principal = self._keyring.authenticate(bearer(headers.get(b"authorization")))
            check_origin(origins_in(raw_headers), self._options.allowed_origins)
        except Refusal as refusal:
            return refusal.status, refusal.reason
        return principal

    async def end_connections(self, ended: Callable[[Principal], bool]) -> list[str]:
        """Close the connections whose principal has ``ended`` (its key revoked or expired), their running turns
        ended (cancelled) first; the names of their keys."""
        closing = [(e, c) for e, c in self._connections.values() if ended(e.principal)]
        for editor, _connection in closing:
            editor.cancel_turns()
        async with trio.open_nursery() as nursery:
            for _editor, connection in closing:
                nursery.start_soon(connection.aclose)
        return [editor.principal.name for editor, _connection in closing]

    async def _close_when_idle(
        self, connection: JsonRpcConnection, wire: WebSocketWire, editor: EditorConnection
    ) -> None:
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


async def serve_daemon(
    config: Config, options: ServeOptions, *, log: Logger, tracer: Any = None, stdout: Any = None
) -> int:
    token_path = Path(options.token_file).expanduser() if options.token_file else default_token_path()
    token = load_token(token_path)
    add_secret(token)
    if tracer is not None:
        tracer.add_secret(token)
    keys_path = beside_token(options.keys_file, str(token_path), keys_path_for)
    keyring = KeyRing(token, KeysFile(keys_path))
    ledger = UsageLedger(beside_token(options.ledger_file, str(token_path), ledger_path_for))
    ledger.open()
    audit = AuditLog(beside_token(options.audit_file, str(token_path), audit_path_for))
    service = BridgeService(config, log=log, tracer=tracer)
    service.recorders.append(ledger.record)
    now = time.time()
    service.limits.seed(ledger.tokens_today(now - now % DAY), wall=now)
    install_agent_models(service, log)
    server = WebSocketDaemon(service, options, keyring, log=log, tracer=tracer)
    service.connection_count = lambda: server.connection_count
    http = _http_listener(service, options, keyring, log) if options.http is not None else None
    metrics = DaemonMetrics(service, http_running=lambda: http.front.running if http is not None else 0)
    service.recorders.append(metrics.observe)
    if http is not None:
        http.front.metrics = (metrics.exposition, METRICS_CONTENT_TYPE)
        http.front.on_refused = audit.refused
    server.on_refused = audit.refused
    service.listeners.append(metrics.event)

    def audited(event: str, fields: dict[str, Any]) -> None:
        principal = fields.get("principal")
        named = {**fields, "key": keyring.name_of(principal)} if isinstance(principal, str) else fields
        audit.event(event, **named)

    service.listeners.append(audited)
    out = stdout if stdout is not None else sys.stdout
    try:
        listeners = await server.open_listeners() if options.websocket else []
        ready = {"listening": server.url} if options.websocket else {}
        if http is not None:
            ready["http"] = service.http_url = http.url
        ready["tokenFile"] = str(token_path.resolve())
        ready["keysFile"] = str(keys_path.resolve())
        ready["ledger"] = str(ledger.path.resolve())
        ready["auditLog"] = str(audit.path.resolve())
        audit.event("daemon_started", pid=os.getpid(), agents=sorted(config.agents), config=str(config.path or ""))
        # Taken over before anyone is told the daemon is ready: a SIGTERM from then on stops it in order.
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                await nursery.start(service.run)
                nursery.start_soon(_watch_keys, keyring, server, http, audit, log)
                nursery.start_soon(_keep_ledger, ledger, log)
                async with trio.open_nursery() as connections:
                    server.handlers = connections
                    with trio.CancelScope() as accepting:
                        async with trio.open_nursery() as listening:
                            if listeners:
                                await listening.start(server.run, listeners)
                            if http is not None:
                                await listening.start(http.run)
                            out.write(json.dumps(ready) + "\n")
                            out.flush()
                            log.info("lmbridge serve ready", **ready, pid=os.getpid(), agents=sorted(config.agents))
                            await _next_signal(signals, log)
                            if options.drain_grace > 0:
                                await _drain(service, http, options.drain_grace, signals, log)
                            await server.stop()
                            if http is not None:
                                await http.finish_turns(config.sessions.cancel_drain_timeout + 1)
                            accepting.cancel()
                    await service.shutdown()
                    await server.close_connections()
                    connections.cancel_scope.cancel()  # what is left are half-open handshakes: nothing owed to them
                nursery.cancel_scope.cancel()
    finally:
        if http is not None:
            http.close()
        ledger.close()
        audit.flush()
        audit.event("daemon_stopped", pid=os.getpid())
        audit.close()
    return 0


def _http_listener(service: BridgeService, options: ServeOptions, keyring: KeyRing, log: Logger) -> Any:
    from bridge.http.app import HttpSettings

    from .http_listener import HttpListener

    assert options.http is not None
    settings = HttpSettings(
        max_body_bytes=options.max_message_bytes,
        max_turns=options.http_max_turns,
        activity=options.http_activity,
        default_cwd=options.default_cwd,
        allowed_origins=options.allowed_origins,
        open_metrics=options.open_metrics,
    )
    tls = ssl_context(options.tls_cert, options.tls_key)
    return HttpListener.open(
        service, options.http, settings, keyring.authenticate, tls=tls, allow_remote=options.allow_remote, log=log
    )


KEYS_CHECK_INTERVAL = 1.0  # seconds between looks at the keys file (a revoked key is refused from the next look)
USED_WRITE_INTERVAL = 30.0  # seconds between writes of when each key was last used
AUDIT_REFUSALS_INTERVAL = 60.0  # seconds between audit lines counting refused credentials


async def _watch_keys(keyring: KeyRing, server: WebSocketDaemon, http: Any, audit: AuditLog, log: Logger) -> None:
    """Take in changes of the keys file as they come (and audit them), and end what a revoked or expired key has
    running: every connection and turn is looked at each time, so one let in as its key was revoked does not stay.
    Refused credentials are audited once a minute, counted."""
    last_write = last_audit = trio.current_time()
    problem = ""  # said once, not every second
    try:
        while True:
            await trio.sleep(KEYS_CHECK_INTERVAL)
            try:
                changes = keyring.refresh()
                problem = ""
                for event, records in (
                    ("key_added", changes.added),
                    ("key_revoked", changes.revoked),
                    ("key_expired", changes.expired),
                ):
                    for record in records:
                        audit.event(event, key=record.name, scopes=list(record.scopes), agents=record.agents)
            except ServeError as exc:
                if str(exc) != problem:
                    problem = str(exc)
                    log.error("cannot read the keys file: every key is refused until it is mended", error=problem)
                    audit.event("keys_file_unreadable", error=problem)

            def ended(principal: Principal) -> bool:
                return not keyring.valid(principal, reload=False)

            names = set(http.front.cancel_turns(ended)) if http is not None else set()
            names.update(await server.end_connections(ended))
            for name in sorted(names):
                log.warning("key revoked or expired: its turns are ended, its connections closed", key=name)
            if trio.current_time() - last_audit >= AUDIT_REFUSALS_INTERVAL:
                last_audit = trio.current_time()
                audit.flush()
            if trio.current_time() - last_write >= USED_WRITE_INTERVAL:
                last_write = trio.current_time()
                try:
                    await trio.to_thread.run_sync(keyring.flush_used)
                except OSError as exc:
                    log.warning("cannot record when keys were last used", error=str(exc))
    finally:
        try:
            keyring.flush_used()
        except OSError as exc:
            log.warning("cannot record when keys were last used", error=str(exc))


LEDGER_WRITE_INTERVAL = 1.0  # seconds between writes of the turns' rows to the usage ledger


async def _keep_ledger(ledger: UsageLedger, log: Logger) -> None:
    """Move the rows turns left to the ledger file, in a worker thread, once a second; the last ones on the way out.
    A disk that refuses them is said once; the rows wait for the next write (the oldest dropped past a bound)."""
    problem = ""
    try:
        while True:
            await trio.sleep(LEDGER_WRITE_INTERVAL)
            rows = ledger.take()
            try:
                await trio.to_thread.run_sync(ledger.write, rows)
                problem = ""
            except (sqlite3.Error, OSError) as exc:
                ledger.give_back(rows)
                if str(exc) != problem:
                    problem = str(exc)
                    log.error("cannot write the usage ledger: its rows wait", error=problem, ledger=str(ledger.path))
    finally:
        try:
            ledger.write(ledger.take())
        except (sqlite3.Error, OSError) as exc:
            log.error("cannot write the usage ledger: its last rows are lost", error=str(exc))
        if ledger.dropped:
            log.error("usage ledger rows were dropped while it could not be written", rows=ledger.dropped)


async def _next_signal(signals: AsyncIterator[int], log: Logger) -> None:
    async for signum in signals:
        log.info("stopping on signal", signal=signal.Signals(signum).name)
        return


DRAIN_POLL = 0.1  # seconds between looks at what still runs while draining


async def _drain(service: BridgeService, http: Any, grace: float, signals: AsyncIterator[int], log: Logger) -> None:
    """Stop gently: /healthz says draining, no new conversation, and running turns (tool calls out with a connected
    editor included) may finish — for ``grace`` seconds at most, or until a second signal."""
    service.drain()  # editors may still connect: one coming back for what it is owed must find its way in
    log.info("draining: running turns may finish, no new conversation is opened", grace_seconds=grace)
    started = trio.current_time()
    with trio.move_on_after(grace) as waited:
        async with trio.open_nursery() as nursery:

            async def second_signal() -> None:
                await _next_signal(signals, log)
                nursery.cancel_scope.cancel()

            nursery.start_soon(second_signal)
            # What is owed is spread over every session's state machine: looked at ten times a second, here.
            while service.owing or (http is not None and http.front.running):  # noqa: ASYNC110
                await trio.sleep(DRAIN_POLL)
            nursery.cancel_scope.cancel()
    owing, requests = service.owing, http.front.running if http is not None else 0
    log.info(
        "drained" if not (owing or requests) else "drain ended: what still runs is cancelled",
        seconds=round(trio.current_time() - started, 3),
        timed_out=waited.cancelled_caught,
        conversations_owing=owing,
        http_requests=requests,
    )
