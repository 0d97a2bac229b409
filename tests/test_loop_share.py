"""Whose work goes first on the daemon's one event loop (``bridge.service.share``), on Trio's mock clock; and the
read gate a connection asks before each read of its peer's input."""

from __future__ import annotations

import json

import trio
import trio.testing

from bridge.service.share import DEFER_AT_MOST, LoopShare
from wire.rpc.connection import EDITOR_CANCEL, JsonRpcConnection, MethodTable, StreamWire


def busy(share: LoopShare, who: str, turns: int) -> None:
    for _ in range(turns):
        share.turn_began(who)


async def test_a_lighter_keys_start_holds_back_busier_keys_only(autojump_clock: trio.testing.MockClock) -> None:
    share = LoopShare()
    assert share.starting("quiet") is None  # nobody else runs anything: nobody is to wait
    busy(share, "flood", 4)
    busy(share, "peer", 1)
    start = share.starting("quiet")
    assert start is not None
    assert share.yields("flood") and share.yields("peer")  # both run more turns than quiet (none)
    assert not share.yields("quiet")  # never for its own start
    assert not share.yields("idle")  # a principal with no turns has no bulk work to hold back
    assert share.starting("") is None  # the daemon's own requests (an agent asking an editor's model) go in turn
    share.turn_began("quiet")
    second = share.starting("peer")  # peer (1 turn) starts while flood runs 4: flood waits, quiet does not
    assert second is not None and not share.yields("quiet")
    share.started(start)
    assert share.yields("flood") and not share.yields("peer")
    share.started(second)
    share.started(second)  # twice is once
    assert not share.yields("flood")
    # Equals go in turn: peer and quiet run one turn each, so a start of quiet's holds back flood alone.
    third = share.starting("quiet")
    assert third is not None and share.yields("flood") and not share.yields("peer")
    share.started(third)
    share.turn_ended("flood")
    assert share.starting("flood") is None  # flood, the busiest, never holds anyone back


async def test_a_busier_key_waits_until_the_start_is_done_or_has_held_it_long_enough(
    autojump_clock: trio.testing.MockClock,
) -> None:
    share = LoopShare()
    busy(share, "flood", 2)
    start = share.starting("quiet")
    began = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(share.wait, "flood")
        await trio.sleep(0.01)
        share.started(start)  # the quiet key's answer began: the flood goes on at once
    assert trio.current_time() - began == 0.01
    share.starting("quiet")  # one that is never said to be done (a front that failed) ...
    began = trio.current_time()
    await share.wait("flood")
    assert trio.current_time() - began == DEFER_AT_MOST  # ... holds the flood back this long at most
    assert not share.yields("flood")


async def test_a_stream_of_starts_holds_a_busier_key_back_at_most_half_the_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    share = LoopShare()
    busy(share, "quiet", 1)  # one streaming turn
    held = free = 0.0

    async def flood_of_starts() -> None:  # a key with no turn running starts a request every 10 ms
        while True:
            share.starting("flood")
            await trio.sleep(0.01)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(flood_of_starts)
        await trio.sleep(0.001)
        until = trio.current_time() + 1.0
        while trio.current_time() < until:
            began = trio.current_time()
            if share.yields("quiet"):
                await share.wait("quiet")
                held += trio.current_time() - began
                assert trio.current_time() - began <= DEFER_AT_MOST + 1e-9  # never longer at a time
            else:
                await trio.sleep(0.005)  # a part written
                free += trio.current_time() - began
        nursery.cancel_scope.cancel()
    assert held > 0.3 and free >= held, (held, free)  # held back, and never more than half the time


async def test_a_connection_reads_nothing_while_its_gate_yields(autojump_clock: trio.testing.MockClock) -> None:
    share = LoopShare()
    busy(share, "flood", 1)
    received: list[int] = []
    methods = MethodTable()

    async def note(batch: list[dict[str, int]]) -> None:
        received.extend(params["n"] for params in batch)

    methods.notification("note", note, batch=True)
    ours, theirs = trio.testing.memory_stream_pair()
    connection = JsonRpcConnection(
        StreamWire(ours, ours), methods, name="agent", cancel_style=EDITOR_CANCEL, read_gate=share.gate("flood")
    )
    start = share.starting("quiet")
    async with trio.open_nursery() as nursery:
        await nursery.start(connection.serve)
        await theirs.send_all(
            b"".join(
                json.dumps({"jsonrpc": "2.0", "method": "note", "params": {"n": n}}).encode() + b"\n" for n in range(3)
            )
        )
        await trio.testing.wait_all_tasks_blocked()
        assert received == []  # the flood's output waits while the quiet key's request starts
        released = trio.current_time()
        share.started(start)
        while len(received) < 3:
            await trio.sleep(0.001)
        assert received == [0, 1, 2]
        assert trio.current_time() - released < DEFER_AT_MOST  # read on being released, not when the start expired
        await theirs.aclose()
        nursery.cancel_scope.cancel()
