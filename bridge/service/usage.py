"""What one turn used, and the record of it a usage ledger keeps.

Owns ``Meter`` (filled in by a turn as it runs: its first part, the usage its agent reported, how it ended) and
``TurnRecord``, the one row a turn leaves: who, through which front, which agent and model, which session, the
tokens (reported, else estimated and marked so), the session's cost as the agent reported it, durations and the
outcome. Nothing of the conversation's content is in it. Where records go is the daemon's (``bridge.daemon.ledger``);
here they are only handed to a ``Recorder``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import trio

from wire.errors import Draining, RpcError, TooManyRequests

__all__ = ["Meter", "Recorder", "TurnRecord", "refused"]


class TurnRecord(NamedTuple):
    time: float  # Unix seconds when the turn was asked for
    principal: str  # the principal's id ("" in a process with one user)
    key: str  # the principal's name (a key's, "owner", "local")
    front: str  # "editor", "http", ...
    agent: str  # the agent id, or "editor" for a model an editor shares
    model: str  # the model the request named
    session: str  # the ACP session that ran it ("" when none did)
    input_tokens: int | None
    output_tokens: int | None
    cached_tokens: int | None
    total_tokens: int | None  # reported, else estimated (then ``estimated``)
    estimated: bool
    session_cost: float | None  # the session's cost so far, as the agent last reported it (ACP reports a total)
    currency: str | None
    seconds: float
    first_part_seconds: float | None
    outcome: str  # the stop reason, or "cancelled", "refused", "error"
    error_code: int | None
    tool_calls: int  # calls of the client's tools the turn handed to it
    limit: str  # for a refused request, the limit it met ("requests_per_minute", ...); else ""


class Recorder(Protocol):
    def __call__(self, record: TurnRecord) -> None: ...


class Meter:
    """One turn's account, from its admission to its end; ``record()`` is the row it leaves."""

    __slots__ = (
        "_clock",
        "_first_part",
        "_started",
        "counted",
        "error_code",
        "estimated",
        "outcome",
        "session",
        "tokens",
        "tool_calls",
        "usage",
        "who",
    )

    def __init__(
        self,
        who: tuple[float, str, str, str, str, str],
        *,
        counted: bool,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        """``who``: (Unix time, principal id, its name, front, agent, model). ``counted``: its tokens are counted
        (by a limit or a ledger), so an estimate is made when the agent reports none. ``clock``: seconds, for
        durations."""
        self.who = who
        self.counted = counted
        self._clock = clock
        self._started = clock()
        self._first_part: float | None = None
        self.tokens = 0
        self.estimated = False
        self.usage: dict[str, Any] = {}
        self.session = ""
        self.outcome = "error"
        self.error_code: int | None = None
        self.tool_calls = 0

    def sink(self, sink: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], Any]:
        """``sink``, noting when the first part went through it."""

        async def timed(part: dict[str, Any]) -> None:
            if self._first_part is None:
                self._first_part = self._clock() - self._started
            if part.get("type") == "tool_call":
                self.tool_calls += 1
            await sink(part)

        return timed

    def count(self, usage: dict[str, Any] | None, estimate: Callable[[], int] | None) -> None:
        """The agent's report of what the turn used; ``estimate()`` is asked only when it gave no token counts (and
        something counts them); ``None``: nothing to estimate for this turn."""
        self.usage = usage or {}
        reported = _reported_total(self.usage)
        if reported is not None:
            self.tokens = reported
        elif self.counted and estimate is not None:
            self.tokens, self.estimated = estimate(), True

    def ended(self, stop_reason: str | None, error: BaseException | None, session: str = "") -> None:
        self.session = session
        if error is None:
            self.outcome = stop_reason or "end_turn"
        else:
            self.failed(error)

    def failed(self, error: BaseException) -> None:
        cancelled = isinstance(error, trio.Cancelled)
        self.outcome = "cancelled" if cancelled else "refused" if isinstance(error, Draining) else "error"
        self.error_code = error.code if isinstance(error, RpcError) else None

    def record(self) -> TurnRecord:
        time, principal, key, front, agent, model = self.who
        usage = self.usage
        cost = usage.get("cost")
        amount = cost.get("amount") if isinstance(cost, dict) else None
        return TurnRecord(
            time,
            principal,
            key,
            front,
            agent,
            model,
            self.session,
            _count(usage, "inputTokens"),
            _count(usage, "outputTokens"),
            _count(usage, "cachedReadTokens"),
            self.tokens if self.estimated else _reported_total(usage),
            self.estimated,
            float(amount) if isinstance(amount, int | float) else None,
            cost.get("currency") if isinstance(cost, dict) and amount is not None else None,
            round(self._clock() - self._started, 6),
            round(self._first_part, 6) if self._first_part is not None else None,
            self.outcome,
            self.error_code,
            self.tool_calls,
            "",
        )


def refused(who: tuple[float, str, str, str, str, str], error: TooManyRequests) -> TurnRecord:
    """The row of a request refused before it started (over a limit)."""
    time, principal, key, front, agent, model = who
    return TurnRecord(
        time, principal, key, front, agent, model, "", None, None, None, None, False, None, None, 0.0, None,
        "refused", error.code, 0, error.name,
    )  # fmt: skip


def _count(usage: dict[str, Any], name: str) -> int | None:
    """A token count the agent reported; none for anything but a whole number of 0 or more."""
    value = usage.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _reported_total(usage: dict[str, Any]) -> int | None:
    total = _count(usage, "totalTokens")
    if total is not None:
        return total
    counts = [count for count in (_count(usage, "inputTokens"), _count(usage, "outputTokens")) if count is not None]
    return sum(counts) if counts else None
