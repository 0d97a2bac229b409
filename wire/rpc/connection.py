"""Trio shell around the sans-IO JSON-RPC core: one connection = one reader task, one writer task, and one
task per incoming request, all in the nursery of ``JsonRpcConnection.serve``.

Owns: reading and writing a wire, dispatching incoming requests and notifications to handlers, correlating
our requests with their responses, and cancellation in both directions. It does not know what any method
means; the editor server and the ACP client register handlers.

Guarantees: nothing the peer sends stops the reader (bad input gets an error reply or a log line); every
incoming request gets exactly one answer unless the connection is gone; outgoing writes are whole messages,
coalesced into one write when several are queued; a slow peer applies backpressure to senders.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from wire.cancel import CancelRequest
from wire.errors import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    REQUEST_CANCELLED,
    InvalidParams,
    RpcError,
    TooManyRequests,
)
from wire.observe.logs import get_logger

from . import protocol
from .protocol import (
    ErrorResponse,
    InvalidMessage,
    JsonRpcProtocol,
    Notification,
    Request,
    RequestId,
    Response,
    StrayResponse,
)

__all__ = [
    "ACP_CANCEL",
    "EDITOR_CANCEL",
    "CancelStyle",
    "ConnectionClosed",
    "JsonRpcConnection",
    "MethodTable",
    "OutgoingRequest",
    "ReadGate",
    "RequestContext",
    "StreamWire",
]


class ConnectionClosed(Exception):
    """The peer went away (EOF or a broken pipe) before the operation could finish."""


@dataclass(frozen=True, slots=True)
class CancelStyle:
    """How a dialect spells request cancellation: the notification's method and the name of its id field."""

    method: str
    id_field: str


EDITOR_CANCEL = CancelStyle("$/cancelRequest", "id")
ACP_CANCEL = CancelStyle("$/cancel_request", "requestId")


class RequestContext:
    """What a request handler knows about its request. ``cancel_requested`` is set when the peer cancels it;
    handlers registered with ``handles_cancel=True`` watch it and answer themselves (e.g. a chat turn ends with
    ``stopReason: "cancelled"``), others are simply cancelled and answered with -32800."""

    __slots__ = (
        "_after_reply",
        "_handles_cancel",
        "_replied",
        "_scope",
        "cancel_requested",
        "connection",
        "id",
        "method",
    )

    def __init__(self, request_id: RequestId, method: str, connection: JsonRpcConnection, handles_cancel: bool) -> None:
        self.id = request_id
        self.method = method
        self.connection = connection
        self.cancel_requested = CancelRequest()
        self._scope: trio.CancelScope | None = None
        self._handles_cancel = handles_cancel
        self._after_reply: Callable[[], object] | None = None
        self._replied = False

    def reply_now(self, result: Any) -> None:
        """Answer the request with ``result`` at once, from whatever task knows the answer first; what the handler
        returns or raises afterwards is not sent (its ``after_reply`` callback still runs when it ends)."""
        if self._replied:
            raise RuntimeError(f"request {self.id!r} has been answered already")
        self._replied = True
        self.connection._settle_incoming(self, JsonRpcProtocol.respond(self.id, result))

    def after_reply(self, callback: Callable[[], object]) -> None:
        """Have ``callback`` called once the reply has been queued (or written): for what should not delay it, such
        as the request's log line. It must not raise."""
        self._after_reply = callback

    def _cancel(self) -> None:
        self.cancel_requested.set()
        if not self._handles_cancel and self._scope is not None:
            self._scope.cancel()


RequestHandler = Callable[[Any, RequestContext], Awaitable[Any]]
NotificationHandler = Callable[[Any], Awaitable[None]]


@dataclass(slots=True)
class _Method:
    handler: Callable[..., Awaitable[Any]]
    is_request: bool
    handles_cancel: bool
    inline: bool = False
    precondition: Callable[[], None] | None = None
    batch: bool = False


class MethodTable:
    """Method name → handler. Request handlers run concurrently, each in its own task; notification handlers
    are awaited in the reader, in arrival order, so they must be quick (hand work off through a channel)."""

    def __init__(self) -> None:
        self._methods: dict[str, _Method] = {}

    def request(
        self,
        name: str,
        handler: RequestHandler,
        *,
        handles_cancel: bool = False,
        inline: bool = False,
        precondition: Callable[[], None] | None = None,
    ) -> None:
        """``inline`` handlers run in the reader, before the next message is looked at: for quick requests that
        later ones depend on (``initialize``: a client may send its first chat right behind it).
        ``precondition`` is checked when the request is read, in arrival order (raise ``RpcError`` to refuse it)."""
        self._methods[name] = _Method(handler, True, handles_cancel, inline, precondition)

    def notification(self, name: str, handler: NotificationHandler, *, batch: bool = False) -> None:
        """``batch``: the handler takes a list of params — the consecutive notifications of this method that
        arrived together — instead of one (for floods such as an agent's streamed updates)."""
        self._methods[name] = _Method(handler, False, False, batch=batch)

    def get(self, name: str) -> _Method | None:
        return self._methods.get(name)


class Wire(Protocol):
    """A duplex transport carrying JSON-RPC: either a byte stream with newline framing or a message transport."""

    async def read(self, protocol: JsonRpcProtocol) -> list[protocol.Event] | None:
        """The next events, or None at end of input."""

    async def write(self, messages: list[bytes]) -> None:
        """Write whole encoded messages (each ending in a newline)."""

    def write_nowait(self, data: bytes) -> int:
        """Write what the transport takes at once, without waiting: how many bytes (0 when it would have to wait,
        or cannot write this way). Called only while no ``write`` is in progress."""

    async def aclose(self) -> None: ...


class StreamWire:
    """Newline-delimited JSON over a pair of Trio byte streams (stdio, pipes, unix sockets)."""

    def __init__(
        self,
        receive: trio.abc.ReceiveStream,
        send: trio.abc.SendStream,
        *,
        read_size: int = 65536,
        long_read_size: int | None = None,
        pending: bytes = b"",
    ):
        """``long_read_size``: reads while a message longer than ``read_size`` is coming in (default: ``read_size``).
        ``pending``: input already read from ``receive`` by someone else, to be processed first."""
        self._receive = receive
        self._send = send
        self._read_size = read_size
        self._long_read_size = long_read_size or read_size
        self._pending = pending

    async def read(self, protocol: JsonRpcProtocol) -> list[protocol.Event] | None:
        if self._pending:
            pending, self._pending = self._pending, b""
            return protocol.receive_data(pending)
        # A message longer than a read is coming in: long reads. (The tail of the last read, a message cut short by
        # it, is not one: reads stay short, so that a flood of small messages is handled a short step at a time.)
        size = self._long_read_size if protocol.buffered >= self._read_size else self._read_size
        if protocol.buffered and isinstance(self._receive, trio.lowlevel.FdStream):
            return await self._read_rest(self._receive, protocol, size)
        try:
            data = await self._receive.receive_some(size)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return None
        if not data:
            return None
        return protocol.receive_data(data)

    @staticmethod
    async def _read_rest(
        stream: trio.lowlevel.FdStream, protocol: JsonRpcProtocol, size: int
    ) -> list[protocol.Event] | None:
        # The rest of a long message: FdStream.receive_some, but into the protocol's buffer instead of a new bytes
        # object per read (see LineFramer.receive_into). The same checkpoint and the same ends: EOF, a closed or
        # broken descriptor. (Short messages take the plain read: for them it is the quicker of the two.)
        def read(view: memoryview) -> int:
            return os.readv(stream.fileno(), (view,))  # the descriptor is -1 once closed: EBADF

        await trio.lowlevel.checkpoint()
        while True:
            try:
                return protocol.receive_into(read, size)
            except BlockingIOError:
                try:
                    await trio.lowlevel.wait_readable(stream.fileno())
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return None
            except OSError:  # EBADF (closed under us), EIO, ...: the end of this input
                return None

    async def write(self, messages: list[bytes]) -> None:
        await self._send.send_all(messages[0] if len(messages) == 1 else b"".join(messages))

    def write_nowait(self, data: bytes) -> int:
        # A file descriptor (stdio, a pipe) in non-blocking mode, as Trio keeps it: one write(2), now.
        if not isinstance(self._send, trio.lowlevel.FdStream):
            return 0
        fd = self._send.fileno()  # -1 once closed (never a number reused since)
        if fd < 0:
            return 0
        try:
            return os.write(fd, data)
        except OSError:  # would block, or the peer is gone: the writer task takes it (and reports the failure)
            return 0

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            for stream in (self._send, self._receive):
                try:
                    await stream.aclose()
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass


class OutgoingRequest:
    """A request we sent. ``result()`` waits for the answer; ``cancel()`` asks the peer to cancel it and keeps
    waiting; ``abandon()`` cancels it and stops waiting (a late answer is ignored); ``on_answer(callback)`` is
    told of the answer synchronously, by the reader, before it looks at the next message — so the answer keeps
    its place in the order of what the peer sent."""

    __slots__ = ("_connection", "_waiter", "id", "method")

    def __init__(self, connection: JsonRpcConnection, request_id: RequestId, method: str, waiter: _PendingRequest):
        self._connection = connection
        self.id = request_id
        self.method = method
        self._waiter = waiter

    @property
    def answered(self) -> bool:
        return self._waiter.done.is_set()

    async def result(self) -> Any:
        await self._waiter.done.wait()
        if self._waiter.error is not None:
            raise self._waiter.error
        return self._waiter.result

    def cancel(self) -> None:
        if not self.answered:
            self._connection._cancel_notification(self.id)

    def abandon(self) -> None:
        if not self.answered:
            self._connection._abandon(self.id)

    def on_answer(self, callback: Callable[[Any, BaseException | None], None]) -> None:
        """``callback(result, error)``; called at once if the answer is already here."""
        if self.answered:
            callback(self._waiter.result, self._waiter.error)
        else:
            self._waiter.callback = callback


class _PendingRequest:
    __slots__ = ("callback", "done", "error", "result")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.callback: Callable[[Any, BaseException | None], None] | None = None

    def settle(self, result: Any, error: BaseException | None) -> None:
        self.result = result
        self.error = error
        self.done.set()
        if self.callback is not None:
            self.callback(result, error)


class ReadGate(Protocol):
    """Whether a connection's input is to wait before its next read: the peer's output is someone's bulk work, and
    someone else's goes first now (``bridge.service.share``). ``wait`` returns when it may read again."""

    def yields(self) -> bool: ...

    async def wait(self) -> None: ...


class JsonRpcConnection:
    """A JSON-RPC peer over one wire. Run ``serve`` in a nursery (``await nursery.start(conn.serve)``); it
    returns when the peer closes its side or ``aclose`` is called. ``peer_closed`` is set at end of input."""

    def __init__(
        self,
        wire: Wire,
        methods: MethodTable,
        *,
        name: str,
        cancel_style: CancelStyle,
        max_message_bytes: int = 32 * 1024 * 1024,
        tracer: Any = None,
        outbox_high_water: int = 4 * 1024 * 1024,
        max_concurrent_requests: int | None = None,
        parse: Callable[[bytes], Any] = protocol.parse,
        read_gate: ReadGate | None = None,
    ) -> None:
        """``read_gate``: asked before each read of the peer's input (see ``ReadGate``)."""
        self.name = name
        self._read_gate = read_gate
        self._max_concurrent = max_concurrent_requests
        self._wire = wire
        self._methods = methods
        self._cancel_style = cancel_style
        self._protocol = JsonRpcProtocol(max_message_bytes=max_message_bytes, parse=parse)
        self._tracer = tracer
        if tracer is not None:
            self._protocol.on_message = lambda raw, valid: tracer.record(name, "in", raw, valid)
        self._log = get_logger().bind(conn=name)
        self._waiters: dict[RequestId, _PendingRequest] = {}
        self._incoming: dict[RequestId, RequestContext] = {}
        self._outbox: deque[bytes] = deque()
        self._outbox_bytes = 0
        self._outbox_high_water = outbox_high_water
        self._outbox_ready = trio.Event()
        self._outbox_drained = trio.Event()
        self._outbox_drained.set()
        self._writer_idle = False  # the writer task waits for work: a message may be written at once (``_enqueue``)
        self._closed = False
        self._nursery: trio.Nursery | None = None
        self.peer_closed = trio.Event()  # end of input, or the peer stopped reading
        self._stopped = trio.Event()
        self._no_incoming = trio.Event()  # set while no incoming request is in flight
        self._no_incoming.set()

    # -- lifecycle ------------------------------------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._write_loop)
                nursery.start_soon(self._read_loop)
                task_status.started()
                await self._stopped.wait()
                nursery.cancel_scope.cancel()
        finally:
            self._closed = True
            self._fail_waiters(ConnectionClosed(f"{self.name}: connection closed"))
            await self._wire.aclose()

    async def aclose(self, *, timeout: float = 5.0) -> None:
        """Close gracefully: let the requests in flight be answered and the queue be written (both bounded by
        ``timeout``), then stop ``serve`` and close the wire."""
        if not self._closed:
            with trio.move_on_after(timeout) as scope:
                scope.shield = True
                await self._no_incoming.wait()
                await self._outbox_drained.wait()
        self._closed = True
        self._stopped.set()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def in_flight(self) -> int:
        """Incoming requests not answered yet."""
        return len(self._incoming)

    @property
    def pending_ids(self) -> set[RequestId]:
        """Ids of our requests still waiting for an answer."""
        return set(self._waiters)

    # -- outgoing -------------------------------------------------------------------------------------------

    async def request(self, method: str, params: Any = None) -> Any:
        """Send a request and wait for its result. Raises ``RpcError`` for an error answer, ``ConnectionClosed``
        if the peer goes away first. If the caller is cancelled, the peer is told (cancel notification) and the
        answer, whenever it comes, is ignored."""
        call = await self.start_request(method, params)
        try:
            return await call.result()
        except BaseException:
            if not call.answered:
                call.abandon()
            raise

    async def start_request(self, method: str, params: Any = None) -> OutgoingRequest:
        """Send a request without waiting for the answer: for callers that cancel a request and still want its
        answer (an editor cancelling a chat turn gets ``stopReason: "cancelled"``). Waits for room in the
        outgoing queue (backpressure)."""
        call = self.start_request_nowait(method, params)
        if self._outbox_bytes > self._outbox_high_water:
            try:
                await self._outbox_drained.wait()
            except BaseException:
                call.abandon()
                raise
        return call

    def start_request_nowait(self, method: str, params: Any = None) -> OutgoingRequest:
        """Queue a request at once, in order with whatever is queued next (a ``session/prompt`` must reach the
        agent before a ``session/cancel`` sent right after it)."""
        if self._closed:
            raise ConnectionClosed(f"{self.name}: connection closed")
        request_id, data = self._protocol.request(method, params)
        waiter = _PendingRequest()
        self._waiters[request_id] = waiter
        self._enqueue(data)
        return OutgoingRequest(self, request_id, method, waiter)

    def expect_answer(self, request_id: RequestId, method: str) -> OutgoingRequest:
        """The answer to a request written to the peer before this connection existed (``sent_before``), as if
        ``start_request`` had sent it."""
        self._protocol.sent_before(request_id, method)
        waiter = _PendingRequest()
        self._waiters[request_id] = waiter
        return OutgoingRequest(self, request_id, method, waiter)

    def _cancel_notification(self, request_id: RequestId) -> None:
        if not self._closed:
            self._enqueue(JsonRpcProtocol.notify(self._cancel_style.method, {self._cancel_style.id_field: request_id}))

    def _abandon(self, request_id: RequestId) -> None:
        if self._waiters.pop(request_id, None) is not None:
            self._protocol.forget(request_id)
            self._cancel_notification(request_id)

    async def notify(self, method: str, params: Any = None) -> None:
        if self._closed:
            raise ConnectionClosed(f"{self.name}: connection closed")
        await self._send(JsonRpcProtocol.notify(method, params))

    def notify_nowait(self, method: str, params: Any = None) -> None:
        """Queue a notification without waiting for outbox room: for cancel paths that must not block."""
        if not self._closed:
            self._enqueue(JsonRpcProtocol.notify(method, params))

    async def _send(self, data: bytes) -> None:
        self._enqueue(data)
        if self._outbox_bytes > self._outbox_high_water:
            await self._outbox_drained.wait()
            if self._closed:
                raise ConnectionClosed(f"{self.name}: connection closed")

    def _enqueue(self, data: bytes) -> None:
        if self._tracer is not None:
            self._tracer.record(self.name, "out", data)
        if self._writer_idle and not self._outbox:
            # Nothing queued, no write in progress: write now, not a scheduler pass later (a turn's last part and
            # its answer reach the peer ~20-30 µs sooner each); whatever the transport did not take is queued.
            written = self._wire.write_nowait(data)
            if written == len(data):
                return
            data = data[written:]
        self._outbox.append(data)
        self._outbox_bytes += len(data)
        self._outbox_ready.set()
        if self._outbox_drained.is_set():
            self._outbox_drained = trio.Event()

    async def _write_loop(self) -> None:
        try:
            while True:
                self._writer_idle = True
                await self._outbox_ready.wait()
                self._writer_idle = False  # from here until the batch is written: it may wait before the first byte
                self._outbox_ready = trio.Event()
                while self._outbox:
                    batch = list(self._outbox)
                    self._outbox.clear()
                    self._outbox_bytes = 0
                    try:
                        await self._wire.write(batch)
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                        self._log.debug("write failed; peer gone", error=str(exc))
                        self._closed = True
                        self.peer_closed.set()
                        self._outbox_drained.set()
                        self._fail_waiters(ConnectionClosed(f"{self.name}: peer stopped reading"))
                        return
                self._outbox_drained.set()
        finally:
            self._writer_idle = False  # no writer any more: nothing is written at once either

    # -- incoming -------------------------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        try:
            gate = self._read_gate
            while True:
                if gate is not None and gate.yields():
                    await gate.wait()
                events = await self._wire.read(self._protocol)
                if events is None:
                    break
                index, count = 0, len(events)
                while index < count:
                    event = events[index]
                    method = self._methods.get(event.method) if isinstance(event, Notification) else None
                    if method is not None and method.batch and isinstance(event, Notification):
                        # Consecutive notifications of a batching method go to its handler together; anything in
                        # between (a response, a request) keeps its place in the order.
                        batch = [event.params]
                        end = index + 1
                        while end < count:
                            following = events[end]
                            if not isinstance(following, Notification) or following.method != event.method:
                                break
                            batch.append(following.params)
                            end += 1
                        await self._notify_handler(method, event.method, batch)
                        index = end
                        continue
                    await self._dispatch(event)
                    index += 1
        finally:
            self.peer_closed.set()
            self._fail_waiters(ConnectionClosed(f"{self.name}: peer closed the connection"))

    async def _dispatch(self, event: protocol.Event) -> None:
        match event:
            case Notification():
                await self._on_notification(event)
            case Request():
                await self._on_request(event)
            case Response(id=request_id, result=result):
                waiter = self._waiters.pop(request_id, None)
                if waiter is not None:
                    waiter.settle(result, None)
            case ErrorResponse(id=request_id, error=error):
                waiter = self._waiters.pop(request_id, None)
                if waiter is not None:
                    waiter.settle(None, error)
            case InvalidMessage(error=error, reply_id=reply_id):
                self._log.warning("invalid message from peer", error=error.message)
                self._enqueue(JsonRpcProtocol.respond_error(reply_id, error))
            case StrayResponse(id=stray_id):
                self._log.debug("response to no pending request", id=stray_id)

    async def _on_notification(self, event: Notification) -> None:
        if event.method == self._cancel_style.method:
            params = event.params if isinstance(event.params, dict) else {}
            request_id = params.get(self._cancel_style.id_field)
            context = self._incoming.get(request_id) if isinstance(request_id, (int, str)) else None
            if context is not None:
                context._cancel()
            return
        method = self._methods.get(event.method)
        if method is None or method.is_request:
            self._log.debug("ignoring unknown notification", method=event.method)
            return
        await self._notify_handler(method, event.method, [event.params] if method.batch else event.params)

    async def _notify_handler(self, method: _Method, name: str, params: Any) -> None:
        try:
            await method.handler(params)
        except InvalidParams as exc:
            self._log.warning("bad notification params", method=name, error=exc.message)
        except Exception:
            self._log.exception("notification handler failed", method=name)

    async def _on_request(self, event: Request) -> None:
        method = self._methods.get(event.method)
        if method is None or not method.is_request:
            self._enqueue(
                JsonRpcProtocol.respond_error(
                    event.id, RpcError(METHOD_NOT_FOUND, f"Method not found: {event.method}", {"method": event.method})
                )
            )
            return
        if method.precondition is not None:
            try:
                method.precondition()
            except RpcError as exc:
                self._enqueue(JsonRpcProtocol.respond_error(event.id, exc))
                return
        if self._max_concurrent is not None and len(self._incoming) >= self._max_concurrent:
            self._enqueue(
                JsonRpcProtocol.respond_error(
                    event.id,
                    TooManyRequests(
                        f"too many requests in flight on this connection (the limit is {self._max_concurrent}); "
                        "wait for an answer before sending more",
                        limit=self._max_concurrent,
                    ),
                )
            )
            return
        if event.id in self._incoming:
            self._enqueue(
                JsonRpcProtocol.respond_error(
                    event.id,
                    RpcError(
                        INVALID_REQUEST, f"Invalid Request: id {event.id!r} is already in use by a request in flight"
                    ),
                )
            )
            return
        context = RequestContext(event.id, event.method, self, method.handles_cancel)
        self._incoming[event.id] = context
        if self._no_incoming.is_set():
            self._no_incoming = trio.Event()
        if method.inline:
            await self._run_handler(method, event, context)
            return
        assert self._nursery is not None
        self._nursery.start_soon(self._run_handler, method, event, context)

    async def _run_handler(self, method: _Method, event: Request, context: RequestContext) -> None:
        reply: bytes | None = None
        try:
            with trio.CancelScope() as scope:
                context._scope = scope
                result = await method.handler(event.params, context)
                reply = JsonRpcProtocol.respond(event.id, result)
            if scope.cancelled_caught:
                reply = JsonRpcProtocol.respond_error(event.id, RpcError(REQUEST_CANCELLED, "Request cancelled"))
        except RpcError as exc:
            reply = JsonRpcProtocol.respond_error(event.id, exc)
        except Exception as exc:
            single = _only_exception(exc)
            if isinstance(single, RpcError):  # raised inside a nursery, which wrapped it in a group
                reply = JsonRpcProtocol.respond_error(event.id, single)
                return
            self._log.exception("request handler failed", method=event.method)
            reply = JsonRpcProtocol.respond_error(
                event.id, RpcError(INTERNAL_ERROR, f"Internal error in {event.method}: {type(exc).__name__}: {exc}")
            )
        finally:
            # On the way out of a cancelled connection there is no reply (``reply`` is None) and nobody to send
            # it to. A request answered early (``reply_now``) is answered already.
            if not context._replied:
                self._settle_incoming(context, reply)
            if context._after_reply is not None:
                context._after_reply()

    def _settle_incoming(self, context: RequestContext, reply: bytes | None) -> None:
        """The request is answered: it stops counting as in flight in the same step its reply is queued (its id may
        be used again at once)."""
        if self._incoming.get(context.id) is context:
            del self._incoming[context.id]
        if reply is not None and not self._closed:
            self._enqueue(reply)
        if not self._incoming:
            self._no_incoming.set()

    def _fail_waiters(self, error: BaseException) -> None:
        waiters, self._waiters = self._waiters, {}
        for waiter in waiters.values():
            waiter.settle(None, error)


def _only_exception(exc: BaseException) -> BaseException:
    """The one exception inside (nested) single-member exception groups, or ``exc`` itself."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
