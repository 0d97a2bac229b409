"""Fuzzing both editor wires with what breaks parsers: ``lmbridge stdio`` and one WebSocket connection of
``lmbridge serve`` each get at least 5,000 generated inputs — random JSON, every method with a wrong type in every
field, lone surrogates, numbers of thousands of digits, deep nesting, lines split across writes and joined in one —
and must stay alive, answer every request (an error for what cannot be represented), and serve a valid request
afterwards."""

from __future__ import annotations

import itertools
import json
import os
import selectors
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.daemon import Daemon, WsEditor

pytestmark = pytest.mark.wire  # lmbridge and its agents as processes: make test, not make check

INPUTS_PER_WIRE = 5000
_ids = itertools.count(1)

# -- what is sent ----------------------------------------------------------------------------------------------

surrogate_text = st.sampled_from(["\ud800", "a\udfffb", "\udc00\ud800", "ok \ud83d"])
huge_numbers = st.sampled_from([10**4299, -(10**4299), 10**400, 1e308, -0.0, 2**63, 2**64 + 1])
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12)
scalars = scalars | surrogate_text | huge_numbers
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)

_MESSAGES = [{"role": "user", "content": [{"type": "text", "value": "hi"}]}]
VALID_PARAMS: dict[str, dict[str, Any]] = {
    "initialize": {"protocolVersion": 1, "clientInfo": {"name": "fuzz", "version": "1"}, "workspaceFolders": ["/tmp"]},
    "lm/models": {},
    "lm/countTokens": {"modelId": "demo", "text": "abcd"},
    "lm/chat": {"modelId": "demo", "messages": _MESSAGES, "options": {"tools": [], "toolMode": "auto"}},
    "daemon/status": {},
    "$/cancelRequest": {"id": 1},
    "lm/nonexistent": {},
}


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in ``value`` a wrong value can go: each key and list index, nested."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield (*prefix, key)
            yield from _paths(inner, (*prefix, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield (*prefix, index)
            yield from _paths(inner, (*prefix, index))


def _replace(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    copy = json.loads(json.dumps(value))
    target = copy
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = new
    return copy


@st.composite
def wrong_requests(draw: st.DrawFn) -> dict[str, Any]:
    """A request of a real method with one field (or the whole params) of the wrong type or shape."""
    method = draw(st.sampled_from(sorted(VALID_PARAMS)))
    params = VALID_PARAMS[method]
    paths = [(), *_paths(params)]
    path = draw(st.sampled_from(paths))
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": _replace(params, path, draw(json_values))}
    if method != "$/cancelRequest" or draw(st.booleans()):
        message["id"] = draw(st.sampled_from([f"fuzz-{next(_ids)}", next(_ids)]))
    return message


@st.composite
def envelope_mutations(draw: st.DrawFn) -> dict[str, Any]:
    """The JSON-RPC envelope itself wrong: ``jsonrpc``, ``id`` or ``method`` of any type."""
    message = {"jsonrpc": "2.0", "id": f"fuzz-{next(_ids)}", "method": "lm/models", "params": {}}
    key = draw(st.sampled_from(["jsonrpc", "id", "method", "params"]))
    message[key] = draw(json_values)
    return message


def encode(message: Any) -> bytes:
    """As an editor would write it: JSON escapes for what UTF-8 cannot carry (lone surrogates)."""
    try:
        return json.dumps(message, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return json.dumps(message).encode()


raw_garbage = st.one_of(
    st.binary(max_size=120),
    st.text(max_size=120).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.just(b"[" * 3000 + b"]" * 3000),
    st.just(b'{"jsonrpc":"2.0","id":1,"method":"lm/countTokens","params":' + b"[" * 5000 + b"]" * 5000 + b"}"),
    st.just(b'{"jsonrpc":"2.0","id":"big","method":"lm/models","params":{"n":1' + b"0" * 5000 + b"}}"),
)
inputs = st.one_of(
    wrong_requests().map(encode),
    envelope_mutations().map(encode),
    json_values.map(encode),
    raw_garbage,
)


def _requests_in(line: bytes) -> Any:
    """The id a reply must carry, when ``line`` is a request the bridge can read (None: nothing to expect)."""
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(message, dict) or not isinstance(message.get("method"), str) or message.get("jsonrpc") != "2.0":
        return None
    request_id = message.get("id")
    if isinstance(request_id, bool) or not isinstance(request_id, (int, str)):
        return None
    return request_id


def _harmless(line: bytes) -> bytes:
    # Generated requests may name a method that ends the connection: keep to those that cannot.
    return line.replace(b"shutdown", b"shutd0wn").replace(b"\n", b" ")


class Counter:
    sent = 0


# -- stdio -----------------------------------------------------------------------------------------------------


class StdioPeer:
    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bridge", "stdio", "--log-level", "error", "--max-message-bytes", "65536"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.buffer = b""
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.process.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]

    def write(self, data: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(data)
        self.process.stdin.flush()

    def message(self, timeout: float = 20.0) -> dict[str, Any]:
        while b"\n" not in self.buffer:
            if not self.selector.select(timeout):
                raise TimeoutError("lmbridge stdio did not answer")
            chunk = self.process.stdout.read1(1 << 16)  # type: ignore[union-attr]
            if not chunk:
                raise EOFError(f"lmbridge stdio closed stdout (exit status {self.process.poll()})")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        message: dict[str, Any] = json.loads(line)  # every line on stdout is JSON
        return message


@pytest.fixture(scope="module")
def stdio_peer() -> Iterator[StdioPeer]:
    peer = StdioPeer()
    peer.write(encode({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": VALID_PARAMS["initialize"]}))
    peer.write(b"\n")
    assert peer.message()["id"] == "init"
    yield peer
    peer.process.stdin.close()  # type: ignore[union-attr]
    assert peer.process.wait(timeout=30) == 0


def exchange(send: Any, receive: Any, lines: list[bytes]) -> None:
    """Send ``lines`` then a ping; every request among them, and the ping, must be answered."""
    ping_id = f"ping-{next(_ids)}"
    ping = {"jsonrpc": "2.0", "id": ping_id, "method": "lm/countTokens", "params": {"modelId": "demo", "text": "abcd"}}
    lines = [_harmless(line) for line in lines]
    owed = {request_id for line in lines if (request_id := _requests_in(line)) is not None}
    send([*lines, encode(ping)])
    Counter.sent += len(lines)
    ping_answered = False
    while not ping_answered or owed:
        reply = receive()
        assert reply.get("jsonrpc") == "2.0", reply
        if "method" in reply:  # lm/part of a chat the generator happened to get right
            continue
        assert ("error" in reply) != ("result" in reply), reply
        if "error" in reply:
            assert isinstance(reply["error"]["code"], int) and reply["error"]["message"], reply
        if reply.get("id") == ping_id:
            assert reply["result"] == {"count": 1}
            ping_answered = True
        owed.discard(reply.get("id"))


@settings(
    max_examples=INPUTS_PER_WIRE // 4 + 50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(lines=st.lists(inputs, min_size=3, max_size=6), cuts=st.lists(st.integers(0, 400), max_size=4))
def _stdio_round(stdio_peer: StdioPeer, lines: list[bytes], cuts: list[int]) -> None:
    def send(batch: list[bytes]) -> None:
        data = b"\n".join(batch) + b"\n"
        # Split the bytes at arbitrary points (mid-line, mid-character) and write each piece on its own.
        points = sorted({min(c, len(data)) for c in cuts})
        for start, end in itertools.pairwise([0, *points, len(data)]):
            if end > start:
                stdio_peer.write(data[start:end])

    exchange(send, stdio_peer.message, lines)


def test_stdio_survives_thousands_of_hostile_inputs(stdio_peer: StdioPeer) -> None:
    before = Counter.sent
    _stdio_round(stdio_peer)
    assert Counter.sent - before >= INPUTS_PER_WIRE
    assert stdio_peer.process.poll() is None
    stdio_peer.write(b'{"jsonrpc":"2.0","id":"last","method":"lm/models","params":{}}\n')
    assert stdio_peer.message()["result"]["models"][0]["id"] == "demo"


# -- one WebSocket connection of the daemon --------------------------------------------------------------------


@pytest.fixture(scope="module")
def ws_peer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WsEditor]:
    state = tmp_path_factory.mktemp("fuzz-daemon")
    env = {**os.environ, "XDG_CONFIG_HOME": str(state)}
    daemon = Daemon(
        [sys.executable, "-m", "bridge", "serve"], env=env, stderr=subprocess.DEVNULL, token_file=state / "t"
    )
    try:
        yield WsEditor(daemon.ws_url, daemon.token, timeout=20)  # initialized
        assert daemon.process.poll() is None, "the daemon died"
    finally:
        daemon.close()
    assert daemon.process.returncode == 0


def send_text(peer: WsEditor, data: bytes) -> None:
    # A text frame must be UTF-8: bytes that are not are sent as the text they decode to with replacements.
    peer.send_text(data.decode("utf-8", "replace"))


@settings(
    max_examples=INPUTS_PER_WIRE // 4 + 50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(lines=st.lists(inputs, min_size=3, max_size=6))
def _ws_round(ws_peer: WsEditor, lines: list[bytes]) -> None:
    def send(batch: list[bytes]) -> None:
        for line in batch:
            send_text(ws_peer, line)

    exchange(send, ws_peer.message, lines)


def test_one_websocket_connection_survives_thousands_of_hostile_inputs(ws_peer: WsEditor) -> None:
    before = Counter.sent
    _ws_round(ws_peer)
    assert Counter.sent - before >= INPUTS_PER_WIRE
    send_text(ws_peer, b'{"jsonrpc":"2.0","id":"last","method":"lm/models","params":{}}')
    assert ws_peer.message()["result"]["models"][0]["id"] == "demo"
