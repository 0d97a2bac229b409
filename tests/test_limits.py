"""Per-key limits, as pure objects on given clocks: turns at once, the request bucket, the daily token budget, how
long a refusal's answer is held, and the ``[limits]`` table that configures them; then the service's refusals on
Trio's mock clock."""

from __future__ import annotations

import pytest
import trio

from bridge.config import ConfigError, Limits, LimitSettings, parse_config
from bridge.service.limits import DAY, TurnLimits
from bridge.service.principals import LOCAL, Principal
from bridge.service.usage import Meter
from wire.errors import TOO_MANY_REQUESTS, TooManyRequests

ALICE, BOB = Principal("k-alice", "alice"), Principal("k-bob", "bob")
NOON = 20_000 * DAY + DAY / 2  # a wall-clock time in the middle of a UTC day


def limits(**default: int) -> TurnLimits:
    return TurnLimits(Limits(LimitSettings(**default)))


def refused(limits: TurnLimits, principal: Principal, *, now: float = 0.0, wall: float = NOON) -> TooManyRequests:
    with pytest.raises(TooManyRequests) as caught:
        limits.admit(principal, now=now, wall=wall)
    return caught.value


def test_turns_at_once_are_counted_per_key_and_freed_when_a_turn_ends() -> None:
    turns = limits(concurrent_turns=2)
    first = turns.admit(ALICE, now=0, wall=NOON)
    turns.admit(ALICE, now=0, wall=NOON)
    error = refused(turns, ALICE)
    assert error.code == TOO_MANY_REQUESTS
    assert error.data == {"limit": 2, "retryAfter": 1.0, "name": "concurrent_turns"}
    turns.admit(BOB, now=0, wall=NOON)  # another key's turns are its own
    turns.finish(first, 10, wall=NOON)
    turns.admit(ALICE, now=0, wall=NOON)


def test_the_bucket_allows_a_burst_then_refills_evenly_and_says_when_to_retry() -> None:
    turns = limits(requests_per_minute=3)
    for _ in range(3):
        turns.finish(turns.admit(ALICE, now=100.0, wall=NOON), 0, wall=NOON)
    error = refused(turns, ALICE, now=100.0)
    assert error.name == "requests_per_minute" and error.retry_after == pytest.approx(20.0)
    assert refused(turns, ALICE, now=110.0).retry_after == pytest.approx(10.0)  # half a token back
    turns.admit(ALICE, now=120.0, wall=NOON)  # one whole token: one more request
    refused(turns, ALICE, now=120.0)
    turns.admit(BOB, now=120.0, wall=NOON)  # bob's bucket is full
    # A long pause refills to the burst, never beyond it.
    for _ in range(3):
        turns.admit(ALICE, now=10_000.0, wall=NOON)
    refused(turns, ALICE, now=10_000.0)


def test_the_daily_budget_counts_what_turns_used_and_is_renewed_at_midnight_utc() -> None:
    turns = limits(daily_tokens=1000)
    turns.finish(turns.admit(ALICE, now=0, wall=NOON), 600, wall=NOON)
    turns.finish(turns.admit(ALICE, now=0, wall=NOON), 600, wall=NOON)  # admitted under the budget: it finishes
    assert turns.used_today(ALICE.id, wall=NOON) == 1200
    error = refused(turns, ALICE, wall=NOON)
    assert error.name == "daily_tokens" and error.limit == 1000
    assert error.retry_after == pytest.approx(DAY / 2)  # until midnight UTC
    turns.admit(BOB, now=0, wall=NOON)
    tomorrow = NOON + DAY / 2 + 1
    assert turns.used_today(ALICE.id, wall=tomorrow) == 0
    turns.admit(ALICE, now=0, wall=tomorrow)


def test_a_turn_that_ends_after_midnight_counts_for_the_new_day() -> None:
    turns = limits(daily_tokens=1000)
    admitted = turns.admit(ALICE, now=0, wall=NOON)
    turns.finish(admitted, 900, wall=NOON + DAY)
    assert turns.used_today(ALICE.id, wall=NOON) == 0
    assert turns.used_today(ALICE.id, wall=NOON + DAY) == 900


def test_a_refused_request_costs_nothing() -> None:
    turns = limits(concurrent_turns=1, requests_per_minute=2)
    held = turns.admit(ALICE, now=0, wall=NOON)
    for _ in range(5):
        assert refused(turns, ALICE).name == "concurrent_turns"  # refused before the bucket was touched
    turns.finish(held, 0, wall=NOON)
    turns.admit(ALICE, now=0, wall=NOON)  # the second token of the burst is still there


def test_the_local_user_and_keys_without_limits_are_never_refused() -> None:
    turns = TurnLimits(Limits(LimitSettings(concurrent_turns=1), {"bob": LimitSettings()}))
    for _ in range(3):
        turns.admit(LOCAL, now=0, wall=NOON)
        turns.admit(BOB, now=0, wall=NOON)
    turns.admit(ALICE, now=0, wall=NOON)
    refused(turns, ALICE)


def test_a_key_is_limited_by_its_name_so_a_new_key_of_that_name_starts_afresh() -> None:
    turns = limits(concurrent_turns=1)
    turns.admit(ALICE, now=0, wall=NOON)
    turns.admit(Principal("k-alice-2", "alice"), now=0, wall=NOON)  # revoked and re-added: someone else


def test_a_check_raises_what_admission_would_and_takes_nothing() -> None:
    turns = limits(concurrent_turns=1, requests_per_minute=2)
    for _ in range(3):
        turns.check(ALICE, now=0, wall=NOON)  # three looks: neither the bucket nor a turn slot is taken
    held = turns.admit(ALICE, now=0, wall=NOON)
    with pytest.raises(TooManyRequests) as caught:
        turns.check(ALICE, now=0, wall=NOON)
    assert caught.value.data == refused(turns, ALICE).data  # the same refusal as admission's
    turns.finish(held, 0, wall=NOON)
    turns.admit(ALICE, now=0, wall=NOON)  # the burst's second request
    turns.check(BOB, now=0, wall=NOON)
    turns.check(LOCAL, now=0, wall=NOON)


def test_a_key_refused_again_and_again_has_its_later_answers_held() -> None:
    turns = limits(requests_per_minute=1)
    turns.admit(ALICE, now=0, wall=NOON)
    holds = [turns.hold(ALICE, refused(turns, ALICE, now=0.0), now=0.0) for _ in range(7)]
    assert holds == [0.0] * 5 + [1.0] * 2  # a burst answered at once, then at most a second's pause
    # Answers come back at five a second: after 0.4 s, two more at once.
    assert [turns.hold(ALICE, refused(turns, ALICE, now=0.4), now=0.4) for _ in range(3)] == [0.0, 0.0, 1.0]
    # Never longer than the retry time itself.
    busy = limits(concurrent_turns=1)
    busy.admit(BOB, now=0, wall=NOON)
    error = refused(busy, BOB)
    assert [busy.hold(BOB, error, now=0.0) for _ in range(6)][-1] == min(error.retry_after, 1.0)
    short = TooManyRequests("", limit=1, retry_after=0.25)
    assert busy.hold(BOB, short, now=0.0) == 0.25
    # Another key's answers are its own: carol has not been refused yet.
    carol = Principal("k-carol", "carol")
    turns.admit(carol, now=0, wall=NOON)
    assert turns.hold(carol, refused(turns, carol), now=0.4) == 0.0


def test_the_meter_takes_the_reported_tokens_and_estimates_only_when_counted() -> None:
    def never() -> int:
        raise AssertionError("estimated although nothing counts it")

    who = (NOON, ALICE.id, ALICE.name, "http", "scripted", "scripted")
    meter = Meter(who, counted=False, clock=lambda: 0.0)
    meter.count(None, never)
    assert (meter.tokens, meter.estimated, meter.record().total_tokens) == (0, False, None)
    meter = Meter(who, counted=True, clock=lambda: 0.0)
    meter.count({"inputTokens": 30, "outputTokens": 12}, never)
    assert (meter.tokens, meter.estimated) == (42, False)
    meter.count({"totalTokens": 50, "inputTokens": 30}, never)
    assert meter.tokens == 50
    meter.count({"contextUsed": 9}, None)  # a tools-out part of a prompt: nothing to estimate
    assert (meter.tokens, meter.estimated, meter.record().total_tokens) == (50, False, None)
    meter.count({"contextUsed": 9}, lambda: 77)
    assert (meter.tokens, meter.estimated, meter.record().total_tokens) == (77, True, 77)


def test_the_limits_table_has_defaults_and_per_key_overrides() -> None:
    config = parse_config(
        """
[limits]
concurrent_turns = 4
requests_per_minute = 60

[limits.keys.alice]
requests_per_minute = 600
daily_tokens = 2000000

[limits.keys.ci]
concurrent_turns = 0
"""
    )
    assert config.limits.of("bob") == LimitSettings(4, 60, 0)
    assert config.limits.of("alice") == LimitSettings(4, 600, 2_000_000)  # the defaults it does not name are kept
    assert config.limits.of("ci") == LimitSettings(0, 60, 0)  # 0: no limit
    assert parse_config("").limits.of("anyone") == LimitSettings()


@pytest.mark.parametrize(
    ("text", "key", "says"),
    [
        ("[limits]\nrequests_per_minte = 5", "limits.requests_per_minte", "unknown key"),
        ("[limits]\nconcurrent_turns = -1", "limits.concurrent_turns", "an integer, 0 or more"),
        ("[limits.keys.alice]\ndaily_tokens = 'lots'", "limits.keys.alice.daily_tokens", "an integer"),
        ("[limits]\nkeys = 3", "limits.keys", "table of keys' limits"),
    ],
)
def test_a_mistake_in_the_limits_table_names_its_key(text: str, key: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(text)
    assert key in str(caught.value) and says in str(caught.value)


async def test_the_service_holds_a_flooding_keys_answers_and_no_one_elses(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from bridge.service.composition import BridgeService
    from bridge.service.usage import TurnRecord
    from wire.cancel import CancelRequest
    from wire.observe.logs import get_logger

    limited = "[limits]\nrequests_per_minute = 1\n"
    service = BridgeService(parse_config(limited), log=get_logger())
    rows: list[TurnRecord] = []
    service.recorders.append(rows.append)
    for who in (ALICE, BOB):
        async with service.metered(who, "http", "scripted", "scripted/fast"):
            pass  # the one request of each key's minute

    async def answered_after(who: Principal = ALICE) -> float:
        """A request of ``who`` refused as a front refuses it: the refusal now, its answer after the hold."""
        started = trio.current_time()
        refusal = service.refusal(who, "http", "scripted", "scripted/fast")
        assert refusal is not None and refusal.name == "requests_per_minute"
        await service.hold(who, refusal)
        return trio.current_time() - started

    assert [await answered_after() for _ in range(6)] == [0.0] * 5 + [1.0]
    assert await answered_after(BOB) == 0.0  # bob's first refusal: his answers are his own

    # A refusal at a turn's admission (``metered``) is held the same way: five more answered at once, then one later.
    async def admitted_after() -> float:
        started = trio.current_time()
        with pytest.raises(TooManyRequests):
            async with service.metered(ALICE, "editor", "scripted", "scripted"):
                raise AssertionError("admitted over the limit")
        return trio.current_time() - started

    assert [await admitted_after() for _ in range(6)] == [0.0] * 5 + [1.0]
    # A held answer ends when its request is cancelled (the client went away), and is not held while draining.
    refusal = service.refusal(ALICE, "http", "scripted", "scripted/fast")
    assert refusal is not None
    gone = CancelRequest()
    started = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(service.hold, ALICE, refusal, gone)
        await trio.sleep(0.25)
        gone.set()
    assert trio.current_time() - started == 0.25
    service.router.draining = True
    assert await answered_after() == 0.0
    refusals = [row for row in rows if row.outcome == "refused"]
    assert len(refusals) == 15 and {row.limit for row in refusals} == {"requests_per_minute"}
    assert {(row.key, row.front, row.agent, row.model) for row in refusals} == {
        ("alice", "http", "scripted", "scripted/fast"),
        ("bob", "http", "scripted", "scripted/fast"),
        ("alice", "editor", "scripted", "scripted"),
    }
