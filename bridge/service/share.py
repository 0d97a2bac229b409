"""Which principal's work goes first on the daemon's one event loop.

Owns the rule: while a request of a principal that runs fewer turns than another is starting — from when a front
knows whose request it is until the first bytes of its answer are written — the busier principal's bulk work (its
agent processes' output, its turns' parts) waits, for at most ``DEFER_AT_MOST`` per start. Principals that run as
many turns go in turn as usual, and nobody waits for their own requests. A team's daemon serves one key's flood and
another key's new conversation from the same thread: without this, the conversation's every step waits behind a
step of the flood's (docs/performance.md#one-keys-flood).

The rule is pure (``yields``, on the given clock); ``wait`` is the thin Trio shell. Imports nothing of lmbridge.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import trio

__all__ = ["DEFER_AT_MOST", "LoopShare", "Start"]

DEFER_AT_MOST = 0.05  # seconds one start keeps busier principals waiting, at most


@dataclass(frozen=True, slots=True, eq=False)  # each start is its own, even two alike
class Start:
    """A request starting: whose, how many turns that principal ran then, and since when."""

    who: str
    running: int
    since: float


class LoopShare:
    def __init__(self, clock: Callable[[], float] = trio.current_time) -> None:
        self._clock = clock
        self._running: Counter[str] = Counter()
        self._starts: set[Start] = set()
        self._changed = trio.Event()

    # -- what the session path tells it -----------------------------------------------------------------------

    def turn_began(self, who: str) -> None:
        self._running[who] += 1

    def turn_ended(self, who: str) -> None:
        self._running[who] -= 1
        if self._running[who] <= 0:
            del self._running[who]

    def starting(self, who: str) -> Start | None:
        """A request of ``who`` is starting: a ``Start`` to hand to ``started`` once its answer's first bytes are
        written (or it ended) — or None when no other principal runs more turns (nobody is to wait for it), or
        ``who`` is "" (the daemon's own: an agent's request to an editor's model is part of some key's turn)."""
        if not who:
            return None
        level = self._running.get(who, 0)
        if not any(count > level for other, count in self._running.items() if other != who):
            return None
        start = Start(who, level, self._clock())
        self._starts.add(start)
        return start

    def started(self, start: Start | None) -> None:
        if start is not None and start in self._starts:
            self._starts.discard(start)
            self._changed.set()
            self._changed = trio.Event()

    # -- what bulk work asks ---------------------------------------------------------------------------------------

    def yields(self, who: str) -> bool:
        """Whether ``who``'s bulk work is to wait now: another principal, running fewer turns, is starting."""
        return bool(self._starts) and self._deferring(who) is not None

    async def wait(self, who: str) -> None:
        """Until ``who`` need not yield: the starts it yields to are done, or have kept it waiting long enough."""
        while (until := self._deferring(who)) is not None:
            with trio.move_on_at(until):
                await self._changed.wait()

    def gate(self, who: str) -> PrincipalGate:
        """``who``'s gate, for the input of a process that works for ``who`` alone (``wire.rpc.ReadGate``)."""
        return PrincipalGate(self, who)

    def _deferring(self, who: str) -> float | None:
        """When the latest start ``who`` yields to stops holding it back (None: it yields to none)."""
        mine = self._running.get(who, 0)
        if not mine:
            return None
        now = self._clock()
        until = [
            start.since + DEFER_AT_MOST
            for start in self._starts
            if start.who != who and start.running < mine and now < start.since + DEFER_AT_MOST
        ]
        return max(until) if until else None


class PrincipalGate:
    """One principal's side of a ``LoopShare``: what a reader of that principal's agent output asks before a read."""

    __slots__ = ("_share", "_who")

    def __init__(self, share: LoopShare, who: str) -> None:
        self._share = share
        self._who = who

    def yields(self) -> bool:
        return self._share.yields(self._who)

    async def wait(self) -> None:
        await self._share.wait(self._who)
