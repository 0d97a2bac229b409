"""Property-based fuzzing of the framing on the real wire: whatever bytes an editor writes, ``lmbridge stdio``
answers with well-formed JSON-RPC lines only, and keeps serving."""

from __future__ import annotations

import json
import selectors
import subprocess
import sys
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.wire  # lmbridge and its agents as processes: make test, not make check


class LineReader:
    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        self.buffer = b""
        self.selector = selectors.DefaultSelector()
        self.selector.register(process.stdout, selectors.EVENT_READ)

    def line(self, timeout: float = 10.0) -> bytes:
        while b"\n" not in self.buffer:
            if not self.selector.select(timeout):
                raise TimeoutError("the bridge did not answer")
            chunk = self.process.stdout.read1(65536)  # type: ignore[union-attr]
            if not chunk:
                raise EOFError("the bridge closed stdout")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line


@pytest.fixture(scope="module")
def live_bridge() -> Iterator[tuple[subprocess.Popen[bytes], LineReader]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "bridge", "stdio", "--log-level", "warning", "--max-message-bytes", "4096"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    reader = LineReader(process)
    assert process.stdin is not None
    process.stdin.write(b'{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":1}}\n')
    process.stdin.flush()
    assert json.loads(reader.line())["id"] == "init"
    yield process, reader
    process.stdin.close()
    assert process.wait(timeout=20) == 0


_pings = iter(range(10**9))

garbage = st.one_of(
    st.binary(max_size=200),
    st.text(max_size=200).map(str.encode),
    st.builds(
        lambda m: json.dumps(m).encode(),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=10),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(
                    st.sampled_from(["jsonrpc", "id", "method", "params", "result", "error", "x"]), inner, max_size=4
                )
            ),
            max_leaves=10,
        ),
    ),
    st.just(b"x" * 5000),  # over --max-message-bytes
    st.just(b"[" * 2000 + b"]" * 2000),  # deeper than Python's recursion limit
    st.just(
        b'{"jsonrpc":"2.0","id":7,"method":"lm/countTokens","params":{"messages":[' + b"[" * 1900 + b"]" * 1900 + b"]}}"
    ),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(garbage, min_size=1, max_size=5))
def test_garbage_gets_error_replies_and_the_bridge_keeps_serving(live_bridge, chunks: list[bytes]) -> None:
    process, reader = live_bridge
    ping_id = f"ping-{next(_pings)}"
    ping = {"jsonrpc": "2.0", "id": ping_id, "method": "lm/countTokens", "params": {"modelId": "demo", "text": "abcd"}}
    # Garbage may contain requests for real methods (even shutdown): keep it to methods that cannot stop us.
    payload = b"".join(c.replace(b"shutdown", b"shutd0wn").replace(b"lm/chat", b"lm/ch4t") + b"\n" for c in chunks)
    assert process.stdin is not None
    process.stdin.write(payload + json.dumps(ping).encode() + b"\n")
    process.stdin.flush()
    while True:
        reply = json.loads(reader.line())  # every line on stdout is JSON
        assert reply.get("jsonrpc") == "2.0"
        if reply.get("id") == ping_id:
            assert reply["result"] == {"count": 1}
            break
        assert "error" in reply or "result" in reply
        if "error" in reply:
            assert isinstance(reply["error"]["code"], int) and reply["error"]["message"]
    assert process.poll() is None
