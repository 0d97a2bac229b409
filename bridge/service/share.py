"""Which principal's work goes first on the daemon's one event loop.

Owns the rule: while a request of a principal that runs fewer turns than another is starting — from when a front
knows whose request it is until the first bytes of its answer are written — the busier principal's bulk work (its
turns' parts and new turns, the output of agent processes that work for it alone) waits: for at most
``DEFER_AT_MOST`` at a time, and then it goes on for as long before it waits again, however many starts come (a key
sending request after request cannot hold the others back more than half the time). Principals that run as many
turns go in turn as usual, and nobody waits for their own requests. A team's daemon serves one key's flood and
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
        self._held_since: dict[str, float] = {}  # a principal kept waiting: since when, this time
        self._free_until: dict[str, float] = {}  # a principal that waited its longest: when it may be held again

    # -- what the session path tells it -----------------------------------------------------------------------

    def turn_began(self, who: str) -> None:
        self._running[who] += 1

    def turn_ended(self, who: str) -> None:
        self._running[who] -= 1
        if self._running[who] <= 0:
            del self._running[who]
            self._held_since.pop(who, None)
            self._free_until.pop(who, None)

    def starting(self, who: str) -> Start | None:
        """A request of ``who`` is starting: a ``Start`` to hand to ``started`` once its answer's first bytes are
        written (or it ended) — or None when no other principal runs more turns (nobody is to wait for it), or
        ``who`` is "" (the daemon's own: an agent's request to an editor's model is part of some key's turn)."""
        if not self.others_busier(who):
            return None
        start = Start(who, self._running.get(who, 0), self._clock())
        self._starts.add(start)
        return start

    def others_busier(self, who: str) -> bool:
        """Whether a start of ``who`` would hold anyone back: another principal runs more turns ("" never does)."""
        level = self._running.get(who, 0)
        return bool(who) and any(count > level for other, count in self._running.items() if other != who)

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
        """Until when ``who`` is held back now: the latest of the starts it yields to, within this time's limit
        (None: it goes on)."""
        mine = self._running.get(who, 0)
        if not mine:
            return None
        now = self._clock()
        if now < self._free_until.get(who, now):
            return None
        stale = [start for start in self._starts if now >= start.since + DEFER_AT_MOST]
        self._starts.difference_update(stale)  # a start never said to be done holds nobody back for longer
        until = [start.since + DEFER_AT_MOST for start in self._starts if start.who != who and start.running < mine]
        if not until:
            self._held_since.pop(who, None)
            return None
        limit = self._held_since.setdefault(who, now) + DEFER_AT_MOST
        if now >= limit:  # held back long enough this time: now as long without
            del self._held_since[who]
            self._free_until[who] = now + DEFER_AT_MOST
            return None
        return min(max(until), limit)


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
