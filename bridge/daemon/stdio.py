"""``lmbridge stdio``: one editor on stdin/stdout, the way an editor extension spawns the bridge.

Owns the process-level plumbing of that mode: stdout is reserved for the protocol (the original fd is kept for
it and fd 1 is pointed at stderr, so a stray print or a library writing to stdout cannot corrupt the stream);
answering the editor's first message, ``initialize``, before the bulk of the bridge (Trio, the session layer) is
even imported — an editor waits for that answer while it starts — and starting the agent of a first chat sent
along with it just as early, or sent as soon as the answer came (read while the rest is imported); and the stop
conditions — ``shutdown``, end of stdin, SIGTERM/SIGINT — which all
lead to the same orderly exit: running turns answered ``cancelled``, sessions closed, agent process groups
stopped, exit status 0.

This module imports nothing heavy at the top: ``read_initialize`` and ``answer_initialize`` run before Trio is
loaded.
"""

from __future__ import annotations

import json
import os
import select
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from bridge.config import Config
from wire.observe.logger import Logger

if TYPE_CHECKING:  # imported when needed: this module runs before the rest of lmbridge is imported
    from bridge.editor.initialize import EditorHello
    from bridge.service.composition import BridgeService

    from .http_listener import HttpListener

__all__ = [
    "EarlyInitialize",
    "answer_initialize",
    "import_while_reading",
    "load_service",
    "read_initialize",
    "reserve_stdout",
    "serve_stdio",
    "start_first_chat_agent",
]


def reserve_stdout() -> int:
    """Keep a private copy of stdout for the protocol and send everything else written to fd 1 to stderr."""
    protocol_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return protocol_fd


class EarlyInitialize(NamedTuple):
    """The editor's first message, a valid ``initialize``, read before the rest of lmbridge is imported."""

    request_id: int | str
    hello: EditorHello
    line: bytes


def read_initialize(
    stdin_fd: int, *, max_message_bytes: int = 64 * 1024 * 1024
) -> tuple[EarlyInitialize | None, bytes]:
    """Read the editor's first message. Returns it if it is a valid ``initialize`` (else None), and the input not
    consumed, for the protocol engine to carry on with. Anything unusual — another method, invalid params, a huge
    line, end of input — is left to the engine, which answers it exactly as it would have."""
    from bridge.editor.initialize import parse_initialize
    from wire.errors import RpcError

    data = b""
    while b"\n" not in data:
        chunk = os.read(stdin_fd, 65536)
        if not chunk or len(data) + len(chunk) > max_message_bytes:
            return None, data + chunk
        data += chunk
    line, _, rest = data.partition(b"\n")
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):
        return None, data
    request_id = message.get("id") if isinstance(message, dict) else None
    if (
        not isinstance(message, dict)
        or message.get("jsonrpc") != "2.0"
        or message.get("method") != "initialize"
        or isinstance(request_id, bool)
        or not isinstance(request_id, (int, str))
    ):
        return None, data
    try:
        hello = parse_initialize(message.get("params"))
    except RpcError:
        return None, data
    return EarlyInitialize(request_id, hello, line), rest


def answer_initialize(config: Config, first: EarlyInitialize, protocol_fd: int, *, tracer: Any = None) -> None:
    """Answer the ``initialize`` ``read_initialize`` read, on the protocol's fd."""
    from bridge.editor.initialize import initialize_result
    from session.permissions import permission_tool_schema

    result = initialize_result(permission_tool_schema(config.permissions.tool_name))
    # The standard library's JSON, as read_initialize's: the JSON-RPC engine (and orjson, ~4 ms of imports) is loaded
    # after the answer, while the editor is already reading it. ASCII escapes keep any id writable.
    message = {"jsonrpc": "2.0", "id": first.request_id, "result": result}
    reply = json.dumps(message, separators=(",", ":")).encode() + b"\n"
    view = memoryview(reply)
    while view:
        view = view[os.write(protocol_fd, view) :]
    if tracer is not None:
        tracer.record("editor", "in", first.line)
        tracer.record("editor", "out", reply)


def load_service() -> None:
    """Import what serving the editor needs (Trio, the session layer, the service: ~0.1 s)."""
    import trio  # noqa: F401

    from bridge.daemon.security import ServeError  # noqa: F401
    from bridge.editor.connection import EditorConnection  # noqa: F401
    from bridge.service.composition import BridgeService  # noqa: F401
    from wire.observe.logs import configure  # noqa: F401
    from wire.rpc.connection import JsonRpcConnection  # noqa: F401

    from .agent_models import install_agent_models  # noqa: F401


def import_while_reading(
    load: Callable[[], None],
    stdin_fd: int,
    pending: bytes,
    *,
    max_message_bytes: int = 64 * 1024 * 1024,
    on_request: Callable[[bytes], Any] | None = None,
) -> tuple[bytes, Any]:
    """Run ``load`` in a thread while reading the editor's next request: an editor that sends its first chat once
    ``initialize`` is answered (VS Code's extension, after starting lmbridge again) has it read now, and
    ``on_request(pending)`` called as soon as it is whole — its agent started (``start_first_chat_agent``) while the
    imports go on, instead of after them. Returns ``pending`` with what was read (up to the end of the first
    request, the end of input, or ``max_message_bytes``) and what ``on_request`` returned (None if it was not
    called). An import that fails here fails again, with its traceback, where the caller imports the module
    itself."""
    done_read, done_write = os.pipe()

    def run() -> None:
        try:
            load()
        except BaseException:  # raised again by the caller's own import, with its traceback
            pass
        finally:
            os.write(done_write, b"!")

    thread = threading.Thread(target=run, name="lmbridge-imports", daemon=True)
    thread.start()
    watching = b"\n" not in pending
    started = None
    try:
        while True:
            readable, _, _ = select.select([stdin_fd, done_read] if watching else [done_read], [], [])
            if watching and stdin_fd in readable:
                chunk = os.read(stdin_fd, 65536)
                pending += chunk
                watching = bool(chunk) and b"\n" not in pending and len(pending) <= max_message_bytes
                if b"\n" in pending and on_request is not None:
                    started = on_request(pending)
            if done_read in readable:
                return pending, started
    finally:
        thread.join()
        os.close(done_read)
        os.close(done_write)


def start_first_chat_agent(config: Config, first: EarlyInitialize | None, pending: bytes, *, tracer: Any = None) -> Any:
    """When the editor's first chat came with ``initialize`` (an editor woken by a chat), start its agent now —
    before answering ``initialize`` (the editor, having sent its chat, is not waiting for that answer) and before
    Trio and the session layer are imported (~90 ms) — and send it ``initialize``: the agent's own start-up,
    usually the longest wait of a first chat, overlaps lmbridge's. Returns the ``EarlyAgent`` for
    ``serve_stdio``, or None."""
    if first is None:
        return None
    from bridge.acp.spawn import start_early

    early = start_early({**config.agents, **first.hello.agents}, pending)
    if early is not None and early.initialize_line is not None and tracer is not None:
        tracer.record(f"agent:{early.config.id}", "out", early.initialize_line)
    return early


async def serve_stdio(
    config: Config,
    *,
    log: Logger,
    tracer: Any = None,
    stdin_fd: int = 0,
    stdout_fd: int | None = None,
    max_message_bytes: int = 64 * 1024 * 1024,
    hello: Any = None,
    pending_input: bytes = b"",
    early_agent: Any = None,
    http: tuple[str, int] | None = None,
    token_file: str | None = None,
) -> int:
    """Serve the editor on ``stdin_fd``/``stdout_fd``. ``hello`` and ``pending_input`` come from
    ``read_initialize`` when ``initialize`` was answered already; ``early_agent`` (``bridge.acp.spawn``)
    is the agent of the first chat, started meanwhile: the pool adopts it (the caller stops it if this fails
    before). ``http``: also serve the HTTP API there (loopback only, the token of ``token_file`` or the default
    one), so that other clients on this machine can use the agents and the models this editor shares."""
    import trio

    from bridge.editor.connection import EditorConnection
    from bridge.service.composition import BridgeService
    from wire.rpc.connection import EDITOR_CANCEL, JsonRpcConnection, StreamWire

    from .agent_models import install_agent_models

    protocol_fd = reserve_stdout() if stdout_fd is None else stdout_fd
    service = BridgeService(config, log=log, tracer=tracer)
    install_agent_models(service, log)
    listener = _http_listener(service, config, http, token_file, log) if http is not None else None
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        if listener is not None:
            await nursery.start(listener.run)
            service.http_url = listener.url
            log.info("HTTP API listening", url=listener.url, token_file=listener.token_file)
        if early_agent is not None:
            service.pool.adopt(early_agent)
        editor = EditorConnection(service)
        if hello is not None:
            editor.apply(hello)
        _widen_pipe(stdin_fd)
        wire = StreamWire(
            trio.lowlevel.FdStream(os.dup(stdin_fd)),
            trio.lowlevel.FdStream(protocol_fd),
            pending=pending_input,
            long_read_size=_LONG_INPUT,
        )
        connection = JsonRpcConnection(
            wire,
            editor.methods,
            name="editor",
            cancel_style=EDITOR_CANCEL,
            tracer=tracer,
            max_message_bytes=max_message_bytes,
            parse=editor.parse,
        )
        editor.connection = connection
        await nursery.start(connection.serve)
        stop = trio.Event()
        nursery.start_soon(_set_when, connection.peer_closed, stop, "end of input")
        nursery.start_soon(_set_when, editor.shutdown_requested, stop, "shutdown request")
        nursery.start_soon(_stop_on_signals, stop, log)
        log.info("lmbridge stdio ready", pid=os.getpid(), agents=sorted(config.agents))
        await stop.wait()
        editor.cancel_turns()
        if listener is not None:
            await listener.finish_turns(config.sessions.cancel_drain_timeout + 1)
        editor.close()
        await service.shutdown()
        await connection.aclose()
        nursery.cancel_scope.cancel()
    return 0


def _http_listener(
    service: BridgeService, config: Config, address: tuple[str, int], token_file: str | None, log: Logger
) -> HttpListener:
    """The HTTP API beside the editor's connection: the rules of ``lmbridge serve --http`` (its token, its limits),
    on loopback only (an editor's lmbridge is one person's)."""
    from pathlib import Path

    from bridge.http.app import HttpSettings
    from bridge.service.principals import LOCAL
    from wire.observe.redact import add_secret

    from .http_listener import HttpListener
    from .keys import KeyRing
    from .security import default_token_path, load_token

    path = Path(token_file).expanduser() if token_file else default_token_path()
    token = load_token(path)
    add_secret(token)
    settings = HttpSettings(max_turns=config.serve.max_turns, activity=config.serve.activity)
    # One person's: the token's holder is the editor's own user (no keys, conversations scoped as the editor's).
    authenticate = KeyRing(token, None, owner=LOCAL).authenticate
    listener = HttpListener.open(service, address, settings, authenticate, tls=None, allow_remote=False, log=log)
    listener.token_file = str(path.resolve())
    return listener


async def _set_when(event: Any, stop: Any, why: str) -> None:
    await event.wait()
    stop.set()


async def _stop_on_signals(stop: Any, log: Logger) -> None:
    import signal

    import trio

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("stopping on signal", signal=signal.Signals(signum).name)
            stop.set()
            return


# An editor re-sends the whole history with every request (megabytes in a long conversation): through the
# default 64 KiB pipe that is dozens of wake-ups of both processes per request. A 1 MiB pipe (Linux's default
# limit for unprivileged processes), and reads to match while a message is coming in, make 16 times fewer.
_LONG_INPUT = 1024 * 1024


def _widen_pipe(fd: int) -> None:
    import fcntl
    import stat

    try:
        if (
            stat.S_ISFIFO(os.fstat(fd).st_mode)
            and hasattr(fcntl, "F_SETPIPE_SZ")
            and fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ) < _LONG_INPUT
        ):  # grow it, never shrink it
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _LONG_INPUT)
    except OSError:
        pass  # over the system's limit, or not allowed: the default pipe works, only slower
