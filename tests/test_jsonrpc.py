"""The sans-IO JSON-RPC core: framing, classification, ids, errors — including property-based fuzzing."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from wire.errors import INVALID_REQUEST, PARSE_ERROR
from wire.rpc.protocol import (
    ErrorResponse,
    InvalidMessage,
    JsonRpcProtocol,
    LineFramer,
    Notification,
    Request,
    Response,
    StrayResponse,
    encode,
    parse,
    to_json,
)

json_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
messages = st.builds(
    lambda i, method, params: {"jsonrpc": "2.0", "id": i, "method": method, "params": params},
    st.integers(0, 2**31) | st.uuids().map(str),
    st.text(min_size=1, max_size=20),
    st.dictionaries(st.text(max_size=8), json_values, max_size=4),
)


def encode_all(items: list[dict]) -> bytes:
    return b"".join(json.dumps(m).encode() + b"\n" for m in items)


@given(st.lists(messages, max_size=8), st.data())
def test_any_chunking_yields_the_same_messages(items: list[dict], data: st.DataObject) -> None:
    stream = encode_all(items)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    protocol = JsonRpcProtocol()
    events = []
    previous = 0
    for cut in [*cuts, len(stream)]:
        events += protocol.receive_data(stream[previous:cut])
        previous = cut
    assert [(e.id, e.method, e.params) for e in events] == [(m["id"], m["method"], m["params"]) for m in items]


@settings(max_examples=300)
@given(st.binary(max_size=300))
def test_garbage_never_raises_and_every_line_gets_an_event(data: bytes) -> None:
    protocol = JsonRpcProtocol(max_message_bytes=100)
    events = protocol.receive_data(data + b"\n")
    lines = [line for line in (data + b"\n").split(b"\n")[:-1] if line.strip() or len(line) > 100]
    assert len(events) == len(lines)
    for event in events:
        assert isinstance(event, (Request, Notification, InvalidMessage, StrayResponse))


@given(st.lists(st.text(max_size=50), max_size=5))
@example(["\x1f0"])  # not JSON: "\x1f" is whitespace to str.isspace(), not to JSON
@example(["0\x1f"])
def test_text_lines_that_are_not_json_objects_get_parse_or_invalid_request_errors(lines: list[str]) -> None:
    protocol = JsonRpcProtocol()
    for line in lines:
        if not line.strip() or "\n" in line or "\r" in line:
            continue
        event = protocol.receive_message(line)
        try:
            value = json.loads(line)
        except ValueError:
            assert isinstance(event, InvalidMessage) and event.error.code == PARSE_ERROR
            continue
        if not isinstance(value, dict):
            assert isinstance(event, InvalidMessage) and event.error.code == INVALID_REQUEST


def test_malformed_json_is_a_parse_error_with_null_id() -> None:
    event = JsonRpcProtocol().receive_message(b'{"jsonrpc": "2.0", "id": 1, "method":')
    assert isinstance(event, InvalidMessage)
    assert event.error.code == PARSE_ERROR and event.reply_id is None


def test_a_batch_is_refused_clearly() -> None:
    event = JsonRpcProtocol().receive_message(b'[{"jsonrpc":"2.0","id":1,"method":"x"}]')
    assert isinstance(event, InvalidMessage) and event.error.code == INVALID_REQUEST
    assert "batch" in event.error.message


def test_invalid_request_keeps_the_id_when_it_can() -> None:
    event = JsonRpcProtocol().receive_message(b'{"jsonrpc":"2.0","id":7,"method":5}')
    assert isinstance(event, InvalidMessage) and event.reply_id == 7


def test_boolean_and_float_ids_are_invalid() -> None:
    protocol = JsonRpcProtocol()
    for raw in (b'{"jsonrpc":"2.0","id":true,"method":"m"}', b'{"jsonrpc":"2.0","id":1.5,"method":"m"}'):
        event = protocol.receive_message(raw)
        assert isinstance(event, InvalidMessage) and event.error.code == INVALID_REQUEST


def test_wrong_jsonrpc_version_is_invalid() -> None:
    event = JsonRpcProtocol().receive_message(b'{"jsonrpc":"1.0","id":1,"method":"m"}')
    assert isinstance(event, InvalidMessage) and "2.0" in event.error.message


def test_responses_match_only_our_pending_ids_and_directions_stay_apart() -> None:
    protocol = JsonRpcProtocol(first_id=0)
    our_id, _ = protocol.request("session/new", {})
    assert our_id == 0
    # The peer's own request with the same id 0 is a request, not an answer to ours.
    peer_request = protocol.receive_message(
        b'{"jsonrpc":"2.0","id":0,"method":"session/request_permission","params":{}}'
    )
    assert isinstance(peer_request, Request) and peer_request.id == 0
    assert protocol.pending == {0: "session/new"}
    # A string "0" is not our integer 0.
    assert isinstance(protocol.receive_message(b'{"jsonrpc":"2.0","id":"0","result":{}}'), StrayResponse)
    answer = protocol.receive_message(b'{"jsonrpc":"2.0","id":0,"result":{"sessionId":"s"}}')
    assert isinstance(answer, Response) and answer.method == "session/new"
    assert isinstance(protocol.receive_message(b'{"jsonrpc":"2.0","id":0,"result":{}}'), StrayResponse)


def test_error_responses_carry_code_message_and_data() -> None:
    protocol = JsonRpcProtocol()
    request_id, _ = protocol.request("m")
    event = protocol.receive_message(
        json.dumps({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32000, "message": "nope", "data": {"x": 1}}})
    )
    assert isinstance(event, ErrorResponse)
    assert (event.error.code, event.error.message, event.error.data) == (-32000, "nope", {"x": 1})


def test_malformed_error_objects_still_become_errors() -> None:
    protocol = JsonRpcProtocol()
    request_id, _ = protocol.request("m")
    event = protocol.receive_message(json.dumps({"jsonrpc": "2.0", "id": request_id, "error": "bad"}))
    assert isinstance(event, ErrorResponse) and "bad" in event.error.message


def test_over_long_line_is_reported_once_and_the_next_line_still_parses() -> None:
    protocol = JsonRpcProtocol(max_message_bytes=50)
    long_line = b'{"jsonrpc":"2.0","method":"x","params":{"p":"' + b"a" * 200 + b'"}}'
    events = []
    for start in range(0, len(long_line), 7):  # arriving in small pieces
        events += protocol.receive_data(long_line[start : start + 7])
    assert events == []  # nothing until the line ends, and nothing buffered beyond the limit
    assert protocol._framer.buffered <= len(long_line)
    events = protocol.receive_data(b'\n{"jsonrpc":"2.0","method":"ok"}\n')
    assert isinstance(events[0], InvalidMessage) and "exceeds the maximum of 50 bytes" in events[0].error.message
    assert isinstance(events[1], Notification) and events[1].method == "ok"


def test_framer_memory_stays_bounded_while_discarding() -> None:
    framer = LineFramer(100)
    for _ in range(1000):
        assert framer.feed(b"x" * 1000) == []
    assert len(framer._buffer) <= 65_536 and framer.buffered == 1_000_000  # the smallest buffer, never the line
    out = framer.feed(b"\nabc\n")
    assert isinstance(out[0], LineFramer.LineTooLong) and out[0].size == 1_000_000
    assert out[1] == b"abc"


# Reads of a few bytes up to more than the small-piece buffer, as pipes and sockets deliver them.
read_sizes = st.lists(st.sampled_from([1, 7, 4095, 4096, 65_535, 70_000, 400_000]), min_size=1, max_size=12)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 300_000), min_size=1, max_size=4), read_sizes)
def test_long_lines_in_reads_of_any_size_come_out_whole(line_sizes: list[int], reads: list[int]) -> None:
    lines = [bytes([65 + n % 26]) * size for n, size in enumerate(line_sizes)]
    stream = b"".join(line + b"\n" for line in lines)
    framer = LineFramer(1_000_000)
    out: list = []
    position = 0
    for size in itertools.cycle(reads):
        if position >= len(stream):
            break
        out += framer.feed(stream[position : position + size])
        position += size
    assert out == lines and framer.buffered == 0


def _reader(stream: bytes, sizes: list[int]):
    """A ``read`` for ``LineFramer.receive_into`` delivering ``stream`` in reads of the given sizes (cycled), as
    ``os.readv`` does: a read with nothing there yet raises ``BlockingIOError`` every other time."""
    position = 0
    calls = itertools.count()
    sizes_cycle = itertools.cycle(sizes)

    def read(view: memoryview) -> int:
        nonlocal position
        if next(calls) % 2:
            raise BlockingIOError
        size = min(next(sizes_cycle), len(view), len(stream) - position)
        view[:size] = stream[position : position + size]
        position += size
        return size

    return read


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 300_000), min_size=1, max_size=5), read_sizes, st.sampled_from([4096, 65_536, 1 << 20]))
def test_lines_read_into_the_framer_come_out_whole(line_sizes: list[int], reads: list[int], size: int) -> None:
    lines = [bytes([65 + n % 26]) * length for n, length in enumerate(line_sizes)]
    framer = LineFramer(1_000_000)
    read = _reader(b"".join(line + b"\r\n" for line in lines), reads)
    out: list = []
    while True:
        try:
            got = framer.receive_into(read, size)
        except BlockingIOError:
            continue  # nothing changed: the next read goes on where the last one ended
        if got is None:
            break
        out += got
    assert out == [line for line in lines if line] and framer.buffered == 0


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.integers(0, 200_000), min_size=1, max_size=5),
    st.lists(st.tuples(st.booleans(), st.sampled_from([1, 7, 4096, 65_536, 300_000])), min_size=1, max_size=12),
)
def test_reads_fed_and_read_into_the_framer_mix(line_sizes: list[int], reads: list[tuple[bool, int]]) -> None:
    # As StreamWire reads a pipe: a message's first read is fed, the rest of a long one is read into the framer.
    lines = [bytes([97 + n % 26]) * length for n, length in enumerate(line_sizes)]
    stream = b"".join(line + b"\n" for line in lines)
    framer = LineFramer(150_000)
    out: list = []
    position = 0
    for into, size in itertools.cycle(reads):
        if position >= len(stream):
            break
        piece = stream[position : position + size]
        if into:  # up to ``size`` a read: the framer may take less (its buffer's room), and read again
            read = _reader(piece, [len(piece)])
            while (got := _retry(framer.receive_into, read, len(piece))) is not None:
                out += got
        else:
            out += framer.feed(piece)
        position += len(piece)
    expected = [line if len(line) <= 150_000 else len(line) for line in lines if line]
    assert [x.size if isinstance(x, LineFramer.LineTooLong) else x for x in out] == expected
    assert framer.buffered == 0


def test_over_long_lines_read_into_the_framer_are_discarded_as_they_come() -> None:
    framer = LineFramer(100_000)
    stream = b"x" * 1_000_000 + b"\nok\n"
    read = _reader(stream, [65_536])
    out: list = []
    while (got := _retry(framer.receive_into, read, 65_536)) is not None:
        out += got
        assert len(framer._buffer) <= 4 * 65_536  # never the whole line
    assert isinstance(out[0], LineFramer.LineTooLong) and out[0].size == 1_000_000 and out[1:] == [b"ok"]


def _retry(receive_into, read, size):
    while True:
        try:
            return receive_into(read, size)
        except BlockingIOError:
            continue


def test_the_framer_keeps_room_for_long_lines_while_they_keep_coming_and_gives_it_back_after() -> None:
    framer = LineFramer(10_000_000)
    long_line = b"y" * 3_000_000 + b"\n"
    for _ in range(3):
        read = _reader(long_line, [1 << 20])
        while not (got := _retry(framer.receive_into, read, 1 << 20)):
            pass
        assert got == [long_line[:-1]]
    kept = len(framer._buffer)
    assert kept >= 3_000_000
    # Another long line fits the kept buffer: it is not grown again (no copy, no fresh memory).
    read = _reader(long_line, [1 << 20])
    while not _retry(framer.receive_into, read, 1 << 20):
        pass
    assert len(framer._buffer) == kept
    # Short lines only, for a while: the buffer shrinks to what they need.
    for _ in range(200):
        assert _retry(framer.receive_into, _reader(b"{}\n", [3]), 65_536) == [b"{}"]
    assert len(framer._buffer) <= 4 * 65_536


def test_crlf_and_blank_lines_are_tolerated() -> None:
    events = JsonRpcProtocol().receive_data(b'\r\n\n{"jsonrpc":"2.0","method":"a"}\r\n   \n')
    assert [e.method for e in events] == ["a"]


def test_encoding_is_one_compact_line() -> None:
    data = JsonRpcProtocol.notify("lm/part", {"text": "line one\nline two"})
    assert data.endswith(b"\n") and data.count(b"\n") == 1
    assert json.loads(data) == {"jsonrpc": "2.0", "method": "lm/part", "params": {"text": "line one\nline two"}}


# Every JSON value the standard library reads, with the numbers and strings a fast reader gets wrong or refuses.
wide_scalars = (
    st.none()
    | st.booleans()
    | st.integers()  # beyond 64 bits too: read as integers, every digit kept
    | st.integers(-(10**40), 10**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)  # lone surrogates too
)
wide_values = st.recursive(
    wide_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=16,
)


@given(wide_values)
@example(12345678901234567890123)
@example({"id": -9999999999999999999, "n": 18446744073709551616})
@example(["\ud800", "\udfff x"])
@example({"a": [[[[[[[[1]]]]]]]]})
def test_what_is_written_reads_back_the_same_and_as_the_standard_library_reads_it(value: object) -> None:
    written = to_json(value)
    assert parse(written) == json.loads(written) == value
    line = encode({"v": value})
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert parse(line) == json.loads(line) == {"v": value}


@given(st.binary(max_size=200) | wide_values.map(lambda v: json.dumps(v).encode()))
@example(b'{"id": 12345678901234567890, "big": -12345678901234567890}')
@example(b"NaN")
@example(b"[Infinity, -Infinity, 1e400]")
@example(b'"\\ud800"')
@example(b"\xef\xbb\xbf{}")  # a byte-order mark: not JSON, as before
@example(b'{"a": 1, "a": 2}')
def test_parse_reads_what_the_standard_library_reads_and_refuses_what_it_refuses(data: bytes) -> None:
    try:
        expected = json.loads(data.decode())
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        with pytest.raises((ValueError, RecursionError)):
            parse(data)
        return
    assert json.dumps(parse(data)) == json.dumps(expected)  # the same types too (1 and 1.0), and NaN


def test_deep_nesting_and_non_string_keys_are_written_as_the_standard_library_writes_them() -> None:
    deep: object = 1
    for _ in range(400):  # deeper than orjson writes
        deep = [deep]
    assert to_json(deep) == json.dumps(deep, separators=(",", ":")).encode()
    assert to_json({1: "a", None: "b"}) == b'{"1":"a","null":"b"}'
    assert encode({"id": 2**70}) == b'{"id":1180591620717411303424}\n'
    assert encode({"t": "\ud800"}) == b'{"t":"\\ud800"}\n'  # no UTF-8 form: its JSON escape
