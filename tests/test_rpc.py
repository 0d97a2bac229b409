"""The Trio JSON-RPC shell over in-memory streams: both directions at once, cancellation, errors, bad input."""

from __future__ import annotations

import json
import os

import pytest
import trio
import trio.testing
from conftest import HANG

from wire.errors import RpcError
from wire.rpc.connection import (
    ACP_CANCEL,
    EDITOR_CANCEL,
    ConnectionClosed,
    InvalidParams,
    JsonRpcConnection,
    MethodTable,
    StreamWire,
)


def connection_pair(left: MethodTable, right: MethodTable, *, style=EDITOR_CANCEL, max_message_bytes=1 << 20):
    a, b = trio.testing.memory_stream_pair()
    return (
        JsonRpcConnection(StreamWire(a, a), left, name="left", cancel_style=style, max_message_bytes=max_message_bytes),
        JsonRpcConnection(StreamWire(b, b), right, name="right", cancel_style=style),
    )


async def test_requests_flow_both_ways_concurrently(nursery: trio.Nursery) -> None:
    gate = trio.Event()
    left_methods, right_methods = MethodTable(), MethodTable()

    async def slow(params, context):
        await gate.wait()
        return {"slow": params["n"]}

    async def fast(params, context):
        return {"fast": params["n"]}

    right_methods.request("slow", slow)
    right_methods.request("fast", fast)
    left_methods.request("ping", fast)
    left, right = connection_pair(left_methods, right_methods)
    await nursery.start(left.serve)
    await nursery.start(right.serve)

    results = {}

    async def call(conn, method, n):
        results[(method, n)] = await conn.request(method, {"n": n})

    async with trio.open_nursery() as calls:
        calls.start_soon(call, left, "slow", 1)
        calls.start_soon(call, left, "fast", 2)
        calls.start_soon(call, right, "ping", 3)
        await trio.testing.wait_all_tasks_blocked()
        # the slow request does not hold up the others, in either direction
        assert results == {("fast", 2): {"fast": 2}, ("ping", 3): {"fast": 3}}
        gate.set()
    assert results[("slow", 1)] == {"slow": 1}


async def test_unknown_method_invalid_params_and_handler_failures_are_errors(nursery: trio.Nursery) -> None:
    methods = MethodTable()

    async def needs_name(params, context):
        if not isinstance(params.get("name"), str):
            raise InvalidParams("name", "must be a string")
        return params["name"]

    async def broken(params, context):
        raise RuntimeError("kaboom")

    methods.request("hello", needs_name)
    methods.request("broken", broken)
    left, right = connection_pair(MethodTable(), methods)
    await nursery.start(left.serve)
    await nursery.start(right.serve)
    with pytest.raises(RpcError) as missing:
        await left.request("nope", {})
    assert missing.value.code == -32601 and "nope" in missing.value.message
    with pytest.raises(RpcError) as bad:
        await left.request("hello", {"name": 3})
    assert bad.value.code == -32602 and bad.value.data == {"field": "name"}
    with pytest.raises(RpcError) as failed:
        await left.request("broken", {})
    assert failed.value.code == -32603 and "kaboom" in failed.value.message
    assert await left.request("hello", {"name": "still alive"}) == "still alive"


async def test_peer_cancel_cancels_the_handler_and_answers_request_cancelled(nursery: trio.Nursery) -> None:
    methods = MethodTable()
    cancelled = trio.Event()

    async def forever(params, context):
        try:
            await trio.sleep_forever()
        finally:
            cancelled.set()

    methods.request("forever", forever)
    left, right = connection_pair(MethodTable(), methods)
    await nursery.start(left.serve)
    await nursery.start(right.serve)
    call = await left.start_request("forever", {})
    await trio.testing.wait_all_tasks_blocked()
    call.cancel()
    with pytest.raises(RpcError) as answer:
        await call.result()
    assert answer.value.code == -32800
    assert cancelled.is_set()


async def test_handlers_that_handle_cancel_answer_themselves(nursery: trio.Nursery) -> None:
    methods = MethodTable()

    async def turn(params, context):
        await context.cancel_requested.wait()
        return {"stopReason": "cancelled"}

    methods.request("turn", turn, handles_cancel=True)
    left, right = connection_pair(MethodTable(), methods)
    await nursery.start(left.serve)
    await nursery.start(right.serve)
    call = await left.start_request("turn", {})
    await trio.testing.wait_all_tasks_blocked()
    call.cancel()
    assert await call.result() == {"stopReason": "cancelled"}


async def test_cancelling_our_request_tells_the_peer_in_its_dialect(nursery: trio.Nursery) -> None:
    a, b = trio.testing.memory_stream_pair()
    left = JsonRpcConnection(StreamWire(a, a), MethodTable(), name="acp", cancel_style=ACP_CANCEL)
    await nursery.start(left.serve)
    with trio.fail_after(HANG):  # the far end never answers: the test cancels the request itself
        async with trio.open_nursery() as inner:
            inner.start_soon(left.request, "session/new", {"cwd": "/"})
            line = await b.receive_some()
            request = json.loads(line)
            inner.cancel_scope.cancel()
    cancel = json.loads(await b.receive_some())
    assert cancel == {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": request["id"]}}


async def test_bad_input_gets_error_replies_and_the_connection_keeps_working(nursery: trio.Nursery) -> None:
    methods = MethodTable()

    async def echo(params, context):
        return params

    methods.request("echo", echo)
    a, b = trio.testing.memory_stream_pair()
    server = JsonRpcConnection(
        StreamWire(a, a), methods, name="server", cancel_style=EDITOR_CANCEL, max_message_bytes=200
    )
    await nursery.start(server.serve)
    await b.send_all(
        b'{not json\n[1,2]\n"str"\n'
        + b'{"jsonrpc":"2.0","id":1,"method":"echo","params":{"x":"'
        + b"y" * 500
        + b'"}}\n{"jsonrpc":"2.0","id":2,"method":"echo","params":{"ok":true}}\n'
    )
    replies = []
    buffer = b""
    while len(replies) < 5:
        buffer += await b.receive_some()
        *lines, buffer = buffer.split(b"\n")
        replies += [json.loads(line) for line in lines]
    assert [r.get("error", {}).get("code") for r in replies[:4]] == [-32700, -32600, -32600, -32600]
    assert all(r["id"] is None for r in replies[:4])
    assert "exceeds the maximum of 200 bytes" in replies[3]["error"]["message"]
    assert replies[4] == {"jsonrpc": "2.0", "id": 2, "result": {"ok": True}}


async def test_long_messages_through_a_real_pipe_are_read_into_one_kept_buffer(nursery: trio.Nursery) -> None:
    # Over a file descriptor a long message is read into the framer's buffer (os.readv) once its first part is in;
    # what comes after it on the same read, an over-long message, and the end of input behave as ever.
    methods = MethodTable()

    async def echo(params, context):
        return params

    methods.request("echo", echo)
    server_read, client_write = os.pipe()
    reply_read, reply_write = os.pipe()
    server = JsonRpcConnection(
        StreamWire(trio.lowlevel.FdStream(server_read), trio.lowlevel.FdStream(reply_write), long_read_size=1 << 20),
        methods,
        name="server",
        cancel_style=EDITOR_CANCEL,
        max_message_bytes=2_000_000,
    )
    nursery.start_soon(server.serve)
    sender = trio.lowlevel.FdStream(client_write)
    receiver = trio.lowlevel.FdStream(reply_read)
    long_text = "ü" * 700_000  # 1.4 MB of UTF-8, several reads
    request = {"jsonrpc": "2.0", "id": 1, "method": "echo", "params": {"text": long_text}}

    async def send() -> None:
        for _ in range(2):
            await sender.send_all(json.dumps(request, ensure_ascii=False).encode() + b"\n")
        await sender.send_all(b'{"jsonrpc":"2.0","id":2,"method":"echo","params":{"x":"' + b"y" * 3_000_000 + b'"}}\n')
        await sender.send_all(b'{"jsonrpc":"2.0","id":3,"method":"echo","params":{"ok":true}}\n')
        await sender.aclose()  # the end of input

    nursery.start_soon(send)
    replies: list = []
    buffer = b""
    while len(replies) < 4:
        data = await receiver.receive_some(1 << 20)
        assert data, "the server closed before answering"
        buffer += data
        *lines, buffer = buffer.split(b"\n")
        replies += [json.loads(line) for line in lines]
    assert [reply.get("result", {}).get("text") == long_text for reply in replies[:2]] == [True, True]
    assert "exceeds the maximum of 2000000 bytes" in replies[2]["error"]["message"]
    assert replies[3] == {"jsonrpc": "2.0", "id": 3, "result": {"ok": True}}
    assert len(server._protocol._framer._buffer) >= 1_400_000  # read into, and kept for the next long one
    with trio.fail_after(HANG):
        await server.peer_closed.wait()  # the end of input is seen as such
    await server.aclose()
    await receiver.aclose()


async def test_peer_going_away_fails_pending_requests(nursery: trio.Nursery) -> None:
    a, b = trio.testing.memory_stream_pair()
    left = JsonRpcConnection(StreamWire(a, a), MethodTable(), name="left", cancel_style=EDITOR_CANCEL)
    await nursery.start(left.serve)

    async def close_soon():
        await b.receive_some()
        await b.aclose()

    nursery.start_soon(close_soon)
    with pytest.raises(ConnectionClosed):
        await left.request("anything", {})
    await left.peer_closed.wait()


async def test_the_answer_to_a_request_sent_before_the_connection_is_awaited_like_its_own(
    nursery: trio.Nursery,
) -> None:
    """An agent started early was sent ``initialize`` (id 0) before lmbridge had a connection to it: the answer,
    already waiting in the pipe when the connection starts reading, settles ``expect_answer``'s request; the
    connection's own requests go on from id 1. An id the connection may give itself is refused."""
    a, b = trio.testing.memory_stream_pair()
    await b.send_all(b'{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1}}\n')
    left = JsonRpcConnection(StreamWire(a, a), MethodTable(), name="left", cancel_style=ACP_CANCEL)
    early = left.expect_answer(0, "initialize")
    with pytest.raises(ValueError, match="may collide"):
        left.expect_answer(1, "initialize")
    with pytest.raises(ValueError, match="may collide"):
        left.expect_answer(0, "initialize")  # awaited already
    await nursery.start(left.serve)
    assert await early.result() == {"protocolVersion": 1}
    nursery.start_soon(left.request, "session/new", {})
    assert json.loads(await b.receive_some())["id"] == 1


async def test_duplicate_in_flight_id_is_refused(nursery: trio.Nursery) -> None:
    methods = MethodTable()
    gate = trio.Event()

    async def wait(params, context):
        await gate.wait()
        return "first"

    methods.request("wait", wait)
    a, b = trio.testing.memory_stream_pair()
    server = JsonRpcConnection(StreamWire(a, a), methods, name="server", cancel_style=EDITOR_CANCEL)
    await nursery.start(server.serve)
    await b.send_all(b'{"jsonrpc":"2.0","id":9,"method":"wait"}\n{"jsonrpc":"2.0","id":9,"method":"wait"}\n')
    reply = json.loads(await b.receive_some())
    assert reply["id"] == 9 and reply["error"]["code"] == -32600 and "already in use" in reply["error"]["message"]
    gate.set()
    assert json.loads(await b.receive_some()) == {"jsonrpc": "2.0", "id": 9, "result": "first"}


async def test_a_reply_sent_early_is_the_only_one_whatever_the_handler_does_next(nursery: trio.Nursery) -> None:
    """``reply_now`` answers from whichever task knows the answer first (a session actor ending a turn); what the
    handler returns, raises or is cancelled with afterwards is not sent, and its after-reply callback still runs."""
    methods = MethodTable()
    contexts = {}
    release = trio.Event()
    logged: list[object] = []

    async def turn(params, context):
        contexts[context.id] = context
        context.after_reply(lambda: logged.append(context.id))
        await release.wait()
        if params["then"] == "raise":
            raise RuntimeError("too late to matter")
        return "the handler's own result"

    methods.request("turn", turn)
    methods.request("ping", lambda params, context: _pong())
    a, b = trio.testing.memory_stream_pair()
    server = JsonRpcConnection(StreamWire(a, a), methods, name="server", cancel_style=EDITOR_CANCEL)
    await nursery.start(server.serve)
    await b.send_all(
        b'{"jsonrpc":"2.0","id":1,"method":"turn","params":{"then":"return"}}\n'
        b'{"jsonrpc":"2.0","id":2,"method":"turn","params":{"then":"raise"}}\n'
        b'{"jsonrpc":"2.0","id":3,"method":"turn","params":{"then":"return"}}\n'
    )
    await trio.testing.wait_all_tasks_blocked()
    for request_id in (1, 2, 3):  # from this task, as an actor would: the handlers are still waiting
        contexts[request_id].reply_now({"early": request_id})
    with pytest.raises(RuntimeError, match="answered already"):
        contexts[1].reply_now("twice")
    received = b""
    while received.count(b"\n") < 3:
        received += await b.receive_some()
    assert [json.loads(line) for line in received.splitlines()] == [
        {"jsonrpc": "2.0", "id": n, "result": {"early": n}} for n in (1, 2, 3)
    ]
    assert logged == []  # the handlers have not ended
    # An answered request is no longer in flight: its id may be used again at once.
    await b.send_all(b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n')
    assert json.loads(await b.receive_some()) == {"jsonrpc": "2.0", "id": 1, "result": "pong"}
    await b.send_all(b'{"jsonrpc":"2.0","method":"$/cancelRequest","params":{"id":3}}\n')
    release.set()
    await trio.testing.wait_all_tasks_blocked()
    assert sorted(logged) == [1, 2, 3]
    # Nothing more came: no second answer for any of them (a ping's answer is the next thing on the wire).
    await b.send_all(b'{"jsonrpc":"2.0","id":4,"method":"ping"}\n')
    assert json.loads(await b.receive_some()) == {"jsonrpc": "2.0", "id": 4, "result": "pong"}


async def _pong() -> str:
    return "pong"


async def test_graceful_close_answers_requests_in_flight_first(nursery: trio.Nursery) -> None:
    methods = MethodTable()
    release = trio.Event()

    async def slow(params, context):
        await release.wait()
        return "answered"

    methods.request("slow", slow)
    left, right = connection_pair(MethodTable(), methods)
    await nursery.start(left.serve)
    await nursery.start(right.serve)
    call = await left.start_request("slow", {})
    await trio.testing.wait_all_tasks_blocked()

    async def close_right():
        await right.aclose()

    nursery.start_soon(close_right)
    await trio.testing.wait_all_tasks_blocked()
    release.set()
    assert await call.result() == "answered"


# -- CancelRequest: a cancel that calls back -------------------------------------------------------------------------


async def test_a_cancel_request_calls_back_in_order_once_and_wakes_its_waiters() -> None:
    from wire.cancel import CancelRequest

    cancel = CancelRequest()
    heard: list[str] = []
    cancel.on_set(lambda: heard.append("first"))
    unregister = cancel.on_set(lambda: heard.append("withdrawn"))
    cancel.on_set(lambda: heard.append("second"))
    unregister()
    woken = trio.Event()

    async def waiter() -> None:
        await cancel.wait()
        woken.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        assert not cancel.is_set() and heard == []
        cancel.set()
        assert heard == ["first", "second"]  # by set() itself, before anyone else runs
        cancel.set()  # once
        await woken.wait()
    assert heard == ["first", "second"] and cancel.is_set()
    late: list[str] = []
    cancel.on_set(lambda: late.append("at once"))()  # registered after: called at once; unregistering is harmless
    assert late == ["at once"]


# -- writing at once over a pipe ------------------------------------------------------------------------------------


class _GatedWire:
    """A wire whose writes go to ``written``: ``write_nowait`` takes at most ``take`` bytes; ``write`` waits for
    ``gate`` (a send that has to wait for the peer) before it writes."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.take = 1 << 30
        self.gate = trio.Event()
        self.nowait_calls = 0

    async def read(self, protocol: object) -> None:
        await trio.sleep_forever()

    def write_nowait(self, data: bytes) -> int:
        self.nowait_calls += 1
        taken = data[: self.take]
        self.written += taken
        return len(taken)

    async def write(self, messages: list[bytes]) -> None:
        await self.gate.wait()
        self.written += b"".join(messages)

    async def aclose(self) -> None:
        pass


async def test_an_idle_writer_writes_at_once_and_a_busy_one_keeps_the_order(nursery: trio.Nursery) -> None:
    wire = _GatedWire()
    connection = JsonRpcConnection(wire, MethodTable(), name="gated", cancel_style=EDITOR_CANCEL)
    await nursery.start(connection.serve)
    await trio.testing.wait_all_tasks_blocked()
    await connection.notify("first", {})
    assert json.loads(wire.written)["method"] == "first"  # written by the sender itself, before any yield
    wire.take = 10
    await connection.notify("second", {"pad": "y" * 100})  # the transport takes 10 bytes; the rest is queued
    await connection.notify("third", {})  # queued behind it, not written at once
    assert wire.nowait_calls == 2
    await trio.testing.wait_all_tasks_blocked()  # the writer took the queue and waits to write it
    await connection.notify("fourth", {})  # the writer is busy: queued, not written at once
    assert wire.nowait_calls == 2
    wire.gate.set()
    await trio.testing.wait_all_tasks_blocked()
    lines = bytes(wire.written).split(b"\n")
    assert [json.loads(line)["method"] for line in lines if line] == ["first", "second", "third", "fourth"]


async def test_messages_over_a_small_pipe_arrive_whole_and_in_order() -> None:
    """Over a real pipe of one page: a message twice its size goes out partly at once (the rest queued), the next
    ones queue behind it, and a reader that takes a few bytes at a time gets every message whole and in order."""
    import fcntl
    import os

    read_fd, write_fd = os.pipe()
    if hasattr(fcntl, "F_SETPIPE_SZ"):
        fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, 4096)
    sender_end = trio.lowlevel.FdStream(write_fd)
    reader_end = trio.lowlevel.FdStream(read_fd)
    sender = JsonRpcConnection(
        StreamWire(sender_end, sender_end), MethodTable(), name="sender", cancel_style=EDITOR_CANCEL
    )
    sent = ["x" * (n * 997 % 9000) for n in range(60)]  # up to twice the pipe
    received: list[int] = []
    all_read = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.serve)
        await trio.testing.wait_all_tasks_blocked()

        async def read_slowly() -> None:
            buffered = b""
            while len(received) < len(sent):
                buffered += await reader_end.receive_some(1500)
                *lines, buffered = buffered.split(b"\n")
                for line in lines:
                    params = json.loads(line)["params"]
                    assert params["pad"] == sent[params["i"]]
                    received.append(params["i"])
            all_read.set()

        for index, pad in enumerate(sent):
            await sender.notify("n", {"i": index, "pad": pad})
            if index == 0:
                nursery.start_soon(read_slowly)
        with trio.fail_after(30):
            await all_read.wait()
        nursery.cancel_scope.cancel()
    assert received == list(range(len(sent)))
    await reader_end.aclose()


async def test_reads_stay_short_for_small_messages_and_grow_for_a_long_one() -> None:
    """On a pipe, as agents' output is read: a small message cut short by a read is read on in short reads, a
    message longer than a read in long ones (what each read took shows in the framer's buffered bytes)."""
    from wire.rpc.protocol import JsonRpcProtocol

    def note(text: str) -> bytes:
        return json.dumps({"jsonrpc": "2.0", "method": "note", "params": {"text": text}}).encode() + b"\n"

    small, long = note("x"), note("y" * 3000)  # 62 bytes; 3062
    read_fd, write_fd = os.pipe()
    wire = StreamWire(trio.lowlevel.FdStream(read_fd), trio.lowlevel.FdStream(os.dup(write_fd)), read_size=100,
                      long_read_size=4096)  # fmt: skip
    protocol = JsonRpcProtocol()
    os.write(write_fd, small * 3 + small[:20])
    assert len(await wire.read(protocol) or ()) == 1 and protocol.buffered == 100 - len(small)  # a 100-byte read
    os.write(write_fd, small[20:] + long)  # in the pipe: the rest of the 2nd small message, the long one
    taken = []
    while (events := await wire.read(protocol)) is not None:
        taken.append((len(events), protocol.buffered))
        if any(event.params["text"].startswith("y") for event in events):
            break
    # Short reads (100 bytes) until the long message has more than a read's worth in; then one long read takes it.
    assert all(buffered <= 200 for _, buffered in taken[:-1]) and taken[-1][1] == 0
    assert 3 <= len(taken) <= 5, taken
    os.close(write_fd)
    await wire.aclose()
