"""Sans-IO JSON-RPC 2.0: newline framing, message classification and request-id bookkeeping.

This module owns the wire format shared by the editor side and the ACP side. It never touches a socket, a
process, a clock or a task: callers feed it bytes (``receive_data``) or whole messages (``receive_message``)
and get back events; they ask it to encode outgoing messages and write the bytes themselves.

Ids: the two directions have separate id spaces. Requests *we* send get ids from our own counter and their
responses are matched against ``pending`` only; requests the peer sends carry the peer's ids (agents use
integers from 0 or UUID strings) and are answered with exactly that id. A response to an id we never sent, or
already saw answered, is reported as ``StrayResponse`` instead of being mistaken for anything else.
"""

from __future__ import annotations

import json
import json.scanner
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import orjson

from wire.errors import INTERNAL_ERROR, INVALID_REQUEST, PARSE_ERROR, RpcError

__all__ = [
    "ErrorResponse",
    "Event",
    "InvalidMessage",
    "JsonRpcProtocol",
    "LineFramer",
    "Notification",
    "Request",
    "RequestId",
    "Response",
    "StrayResponse",
    "encode",
    "parse",
    "scan_json",
    "skip_json_space",
    "to_json",
]

RequestId = int | str


@dataclass(frozen=True, slots=True)
class Request:
    id: RequestId
    method: str
    params: Any


@dataclass(frozen=True, slots=True)
class Notification:
    method: str
    params: Any


@dataclass(frozen=True, slots=True)
class Response:
    id: RequestId
    result: Any
    method: str  # the method of our request this answers


@dataclass(frozen=True, slots=True)
class ErrorResponse:
    id: RequestId
    error: RpcError
    method: str


@dataclass(frozen=True, slots=True)
class InvalidMessage:
    """The peer sent something that is not a valid message. ``reply`` is the error response to send back
    (JSON-RPC says: with the request's id when it could be read, else null)."""

    error: RpcError
    reply_id: RequestId | None
    raw: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class StrayResponse:
    """A response whose id matches none of our pending requests (late, duplicated, or invented)."""

    id: Any
    raw: bytes = field(repr=False)


Event = Request | Notification | Response | ErrorResponse | InvalidMessage | StrayResponse


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)  # one, not one per call
_ASCII_ENCODER = json.JSONEncoder(separators=(",", ":"))  # for text with lone surrogates (see encode)
# json.loads on bytes sniffs the encoding and wraps the C scanner in Python checks on every call: for one message
# per line, decoding the line and calling the scanner directly takes half the time.
# scan_json(text, index) → (the JSON value starting exactly at index, the index after it); StopIteration when
# no value starts there.
# (typeshed types the scanner's argument as the scanner itself; the documented argument is a decoder.)
_DECODER: Any = json.JSONDecoder()
scan_json: Callable[[str, int], tuple[Any, int]] = json.scanner.make_scanner(_DECODER)


_JSON_SPACE = re.compile(r"[ \t\n\r]*")  # JSON's whitespace only: str.isspace() would also skip "\x1f" and more


def skip_json_space(text: str, index: int) -> int:
    """The index of the first character at or after ``index`` that is not JSON whitespace."""
    found = _JSON_SPACE.match(text, index)
    assert found is not None  # the pattern matches the empty string
    return found.end()


# orjson reads and writes JSON several times faster than the standard library (a 100 KB editor/chat line: written in
# 0.02 ms instead of 0.54, read in 0.09 ms instead of 0.27), and lines that size are every request of an agent that
# thinks with the editor's models. What orjson does not take as the standard library does is left to the standard
# library, so that lmbridge reads and writes exactly what it did: lone surrogates, NaN and Infinity, integers beyond
# 64 bits, nesting deeper than orjson allows, keys that are not strings. Two of them it does not refuse: it writes NaN
# as null (the standard library writes NaN, which is not JSON), and it reads an integer of 20 digits or more as a
# float, losing digits -- so a text with 19 digits in a row (found in ~0.07 ms per 100 KB) goes to the standard library.
_DIGITS_AS_ZERO = bytes(0x30 if 0x30 <= byte <= 0x39 else 0x20 for byte in range(256))
_LONG_NUMBER = b"0" * 19
_DUMPS_OPTIONS = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME  # refused by both, as before


def parse(raw: bytes | str) -> Any:
    """One JSON value, as ``json.loads`` reads it (``ValueError`` when it is not JSON; bytes must be UTF-8)."""
    if not isinstance(raw, str):
        raw = bytes(raw) if isinstance(raw, memoryview) else raw
        if _LONG_NUMBER not in raw.translate(_DIGITS_AS_ZERO):
            try:
                return orjson.loads(raw)
            except orjson.JSONDecodeError:
                pass  # what only the standard library reads, or its own words for what is wrong
    text = raw if isinstance(raw, str) else bytes(raw).decode()
    start = skip_json_space(text, 0) if text[:1] in (" ", "\t", "\n", "\r") else 0
    try:
        value, end = scan_json(text, start)
    except StopIteration as stop:
        raise json.JSONDecodeError("Expecting value", text, stop.value) from None
    if end != len(text) and skip_json_space(text, end) != len(text):
        raise json.JSONDecodeError("Extra data", text, end)
    return value


def to_json(value: Any) -> bytes:
    """``value`` as compact JSON in UTF-8 (``TypeError`` for what JSON cannot hold)."""
    try:
        return orjson.dumps(value, option=_DUMPS_OPTIONS)
    except orjson.JSONEncodeError:
        return _stdlib_json(value)


def encode(message: dict[str, Any]) -> bytes:
    """One message as one line: compact JSON, UTF-8, terminated by a newline (JSON escapes any inside).

    A lone surrogate (``"\\ud800"`` is valid JSON, but has no UTF-8 form) is written as its JSON escape, so that
    whatever a peer sent can be echoed back.
    """
    try:
        return orjson.dumps(message, option=_DUMPS_OPTIONS | orjson.OPT_APPEND_NEWLINE)
    except orjson.JSONEncodeError:
        return _stdlib_json(message) + b"\n"


def _stdlib_json(value: Any) -> bytes:
    text = _ENCODER.encode(value)
    try:
        return text.encode()
    except UnicodeEncodeError:
        return _ASCII_ENCODER.encode(value).encode()


_MIN_READ = 64 * 1024  # the framer's buffer is never smaller: a read of small messages takes what is there


class LineFramer:
    """Splits a byte stream into lines of at most ``max_line_bytes``.

    A line longer than the limit is discarded as it arrives (memory stays bounded) and reported once, as a
    ``LineTooLong`` marker in the output, when its terminating newline is seen.

    Input comes either as bytes someone has read (``feed``) or straight into the framer's own buffer
    (``receive_into``, for a reader that can fill memory, such as ``os.readv``). An editor re-sends the whole
    history with every request, megabytes read 1 MiB at a time: reading into one kept buffer, and copying each
    line out of it once, spares a fresh allocation per read (fresh megabytes cost a page fault per 4 KiB: for a
    large request, more than the reading itself).
    """

    class LineTooLong:
        __slots__ = ("size",)

        def __init__(self, size: int) -> None:
            self.size = size

    def __init__(self, max_line_bytes: int) -> None:
        if max_line_bytes < 1:
            raise ValueError("max_line_bytes must be positive")
        self.max_line_bytes = max_line_bytes
        # The incomplete line, at the front of a buffer kept from line to line (``_held`` bytes of it valid). Its
        # size follows the long lines of late (``_peak`` decays with every line), so that one huge message does
        # not pin its memory for the life of the connection.
        self._buffer = bytearray()
        self._held = 0
        self._peak = 0
        self._discarding = 0  # bytes dropped so far of an over-long line; 0 when not discarding

    def feed(self, data: bytes | bytearray) -> list[bytes | LineFramer.LineTooLong]:
        if self._held or self._discarding:
            size = len(data)

            def copy(view: memoryview) -> int:
                view[:size] = data
                return size

            self._reserve(size)
            return (self.receive_into(copy, size) if size else None) or []
        # Nothing held: complete lines come straight from ``data``, only the rest is kept.
        out: list[bytes | LineFramer.LineTooLong] = []
        rest = self._split(data, 0, len(data), out)
        if rest < len(data):
            with memoryview(data) as view:
                self._hold(view[rest:])
        return out

    def receive_into(self, read: Callable[[memoryview], int], size: int) -> list[bytes | LineFramer.LineTooLong] | None:
        """Let ``read`` put up to ``size`` bytes into the framer's buffer and return how many it put there (0: end
        of input, and the result is None). Whatever ``read`` raises (``BlockingIOError``) leaves the framer as it
        was."""
        start = self._held
        if len(self._buffer) - start < min(size, _MIN_READ):
            self._reserve(min(size, _MIN_READ))
        size = min(size, len(self._buffer) - start)  # a long line grows the buffer by doubling, read by read
        view = memoryview(self._buffer)[start : start + size]
        try:
            count = read(view)
        finally:
            view.release()  # the buffer cannot be resized while a view of it exists
        if not count:
            return None
        out: list[bytes | LineFramer.LineTooLong] = []
        end = start + count
        rest = self._split(self._buffer, start, end, out)
        if self._discarding:
            self._discarding += end - rest
            self._held = 0
        elif rest:
            with memoryview(self._buffer) as held:
                held[: end - rest] = held[rest:end]
            self._held = end - rest
        else:
            self._held = end
        if self._held > self.max_line_bytes:
            self._discarding, self._held = self._held, 0
        # Keep room for lines as long as the recent ones (reads arrive while the last is being taken), not more.
        keep = 2 * max(self._peak, self._held, _MIN_READ)
        if out and len(self._buffer) > 2 * keep:
            del self._buffer[keep:]
        return out

    def _split(self, data: bytes | bytearray, start: int, end: int, out: list[bytes | LineFramer.LineTooLong]) -> int:
        """Append the lines that end in ``data[start:end]`` (``data[:start]`` is the incomplete line held before) to
        ``out``; return where the incomplete rest begins."""
        line_start = 0
        with memoryview(data) as view:
            while (newline := data.find(b"\n", start, end)) >= 0:
                size = newline - line_start
                if self._discarding:
                    out.append(self.LineTooLong(self._discarding + size))
                    self._discarding = 0
                elif size > self.max_line_bytes:
                    out.append(self.LineTooLong(size))
                else:
                    if size and data[newline - 1] == 13:  # "\r\n"
                        size -= 1
                    line = bytes(view[line_start : line_start + size])
                    self._peak = max(size, self._peak - (self._peak >> 4))
                    if line.strip():
                        out.append(line)
                start = line_start = newline + 1
        return line_start

    def _reserve(self, free: int) -> None:
        """Room for ``free`` more bytes after the held ones: the buffer at least doubles."""
        if len(self._buffer) - self._held < free:
            size = max(self._held + free, 2 * len(self._buffer), _MIN_READ)
            self._buffer.extend(bytes(size - len(self._buffer)))

    def _hold(self, rest: memoryview) -> None:
        if len(rest) > self.max_line_bytes:
            self._discarding = len(rest)
            return
        self._reserve(len(rest))
        self._buffer[: len(rest)] = rest
        self._held = len(rest)

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete line held (or being discarded) at the moment."""
        return self._held or self._discarding


def _valid_id(value: Any) -> TypeGuard[RequestId]:
    # bool is a subclass of int, and floats round-trip badly: neither is an acceptable id.
    return (isinstance(value, int) and not isinstance(value, bool)) or isinstance(value, str)


class JsonRpcProtocol:
    """One JSON-RPC connection's protocol state, without I/O.

    ``receive_data`` (byte streams) or ``receive_message`` (one message per frame) turn input into events;
    ``request``/``notify``/``respond``/``respond_error`` return the bytes to write. ``pending`` maps the ids of
    our unanswered requests to their method names.
    """

    def __init__(
        self, *, max_message_bytes: int = 32 * 1024 * 1024, first_id: int = 1, parse: Callable[[bytes], Any] = parse
    ) -> None:
        """``parse``: bytes → JSON value, ``ValueError`` when not JSON (e.g. ``history_parse.HistoryReusingParser``)."""
        self.max_message_bytes = max_message_bytes
        self._parse = parse
        self._framer = LineFramer(max_message_bytes)
        self._next_id = first_id
        self.pending: dict[RequestId, str] = {}
        # Called with every incoming message's raw bytes and whether they parsed as JSON (for wire traces).
        self.on_message: Callable[[bytes, bool], None] | None = None

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete message received so far (0 between messages)."""
        return self._framer.buffered

    # -- input ---------------------------------------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray) -> list[Event]:
        return [
            self._too_long(line.size) if isinstance(line, LineFramer.LineTooLong) else self.receive_message(line)
            for line in self._framer.feed(data)
        ]

    def receive_into(self, read: Callable[[memoryview], int], size: int) -> list[Event] | None:
        """``receive_data`` without the bytes object: ``read`` fills up to ``size`` bytes of the framer's own buffer
        and returns how many (see ``LineFramer.receive_into``); None at end of input."""
        lines = self._framer.receive_into(read, size)
        if lines is None:
            return None
        return [
            self._too_long(line.size) if isinstance(line, LineFramer.LineTooLong) else self.receive_message(line)
            for line in lines
        ]

    def receive_message(self, raw: bytes | str) -> Event:
        if isinstance(raw, str):
            raw = raw.encode()
        if len(raw) > self.max_message_bytes:
            return self._too_long(len(raw))
        try:
            message = self._parse(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            if self.on_message is not None:
                self.on_message(raw, False)
            if isinstance(exc, RecursionError):
                reason = "nested too deeply"
            elif "integer string conversion" in str(exc):
                reason = f"a number has more than {sys.get_int_max_str_digits()} digits"
            else:
                reason = str(exc)
            return InvalidMessage(RpcError(PARSE_ERROR, f"Parse error: {reason}"), None, raw)
        if self.on_message is not None:
            self.on_message(raw, True)
        if not isinstance(message, dict):
            what = (
                "a batch (JSON array); batches are not supported"
                if isinstance(message, list)
                else (f"a JSON {type(message).__name__}")
            )
            return InvalidMessage(
                RpcError(INVALID_REQUEST, f"Invalid Request: expected one JSON object per message, got {what}"),
                None,
                raw,
            )
        return self._classify(message, raw)

    def _too_long(self, size: int) -> InvalidMessage:
        return InvalidMessage(
            RpcError(
                INVALID_REQUEST,
                f"Invalid Request: message of {size} bytes exceeds the maximum of {self.max_message_bytes} bytes",
                {"size": size, "maxBytes": self.max_message_bytes},
            ),
            None,
            b"",
        )

    def _classify(self, message: dict[str, Any], raw: bytes) -> Event:
        has_id = "id" in message
        msg_id = message.get("id")
        reply_id = msg_id if _valid_id(msg_id) else None
        if message.get("jsonrpc") != "2.0":
            return self._invalid('"jsonrpc" must be "2.0"', reply_id, raw)
        method = message.get("method")
        if method is not None:
            if not isinstance(method, str):
                return self._invalid('"method" must be a string', reply_id, raw)
            params = message.get("params")
            if params is not None and not isinstance(params, (dict, list)):
                return self._invalid('"params" must be an object or an array', reply_id, raw)
            if not has_id:
                return Notification(method, params)
            if not _valid_id(msg_id):
                return self._invalid('"id" must be a string or an integer', None, raw)
            return Request(msg_id, method, params)
        if "result" in message or "error" in message:
            if not _valid_id(msg_id) or msg_id not in self.pending:
                return StrayResponse(msg_id, raw)
            our_method = self.pending.pop(msg_id)
            if "error" in message:
                return ErrorResponse(msg_id, _error_from_wire(message["error"]), our_method)
            return Response(msg_id, message["result"], our_method)
        return self._invalid('a message needs "method" (request or notification) or "result"/"error"', reply_id, raw)

    @staticmethod
    def _invalid(why: str, reply_id: RequestId | None, raw: bytes) -> InvalidMessage:
        return InvalidMessage(RpcError(INVALID_REQUEST, f"Invalid Request: {why}"), reply_id, raw)

    # -- output --------------------------------------------------------------------------------------------

    def request(self, method: str, params: Any = None) -> tuple[RequestId, bytes]:
        request_id = self._next_id
        self._next_id += 1
        self.pending[request_id] = method
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        return request_id, encode(message)

    def sent_before(self, request_id: RequestId, method: str) -> None:
        """A request of ours written to the peer before this protocol existed (an agent's ``initialize`` sent as it
        was started): its answer is awaited as any of ours. Its id must be one ``request`` never gives."""
        if request_id in self.pending or (isinstance(request_id, int) and request_id >= self._next_id):
            raise ValueError(f"request id {request_id!r} may collide with this connection's own")
        self.pending[request_id] = method

    def forget(self, request_id: RequestId) -> None:
        """Stop waiting for the answer to one of our requests (we cancelled it); a late answer is stray."""
        self.pending.pop(request_id, None)

    @staticmethod
    def notify(method: str, params: Any = None) -> bytes:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        return encode(message)

    @staticmethod
    def respond(request_id: RequestId, result: Any) -> bytes:
        return encode({"jsonrpc": "2.0", "id": request_id, "result": result})

    @staticmethod
    def respond_error(request_id: RequestId | None, error: RpcError) -> bytes:
        return encode({"jsonrpc": "2.0", "id": request_id, "error": error.to_dict()})


def _error_from_wire(error: Any) -> RpcError:
    if isinstance(error, dict):
        code = error.get("code")
        message = error.get("message")
        return RpcError(
            code if isinstance(code, int) and not isinstance(code, bool) else INTERNAL_ERROR,
            message if isinstance(message, str) else json.dumps(error),
            error.get("data"),
        )
    return RpcError(INTERNAL_ERROR, f"malformed error object: {error!r}")
