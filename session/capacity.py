"""The session cap's bookkeeping, sans-IO: which sessions may be closed to make room, and how often conversations
cycle through more sessions than the cap allows (thrash).

Owns the eviction rule — only a session that nobody is waiting on may be closed: no request matched to it, no turn
running or queued, nothing owed (``evictable``), least recently used first (``choose_evictions``) — and
``CapacityMeter``: counts of sessions closed for the cap and of conversations that came back after their session
was closed (their next request had to be told the conversation again, or resumed), with a summary at most once a
minute for the log. It reads no clock (callers pass ``now``) and does no I/O.

Imports nothing of lmbridge.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

__all__ = ["CAP_REASON", "CapSummary", "CapacityMeter", "Evictable", "choose_evictions"]

CAP_REASON = "session cap reached"
REPORT_INTERVAL = 60.0  # seconds: the log's summary of the cap's closes comes at most this often


class Evictable(Protocol):
    @property
    def evictable(self) -> bool:
        """Nobody waits on the session: it may be closed without losing or cancelling anything."""

    @property
    def last_used(self) -> float: ...


E = TypeVar("E", bound=Evictable)


def choose_evictions(sessions: Iterable[E], *, open_count: int, limit: int) -> list[E]:
    """The sessions to close so that ``open_count`` comes down to ``limit``: the least recently used evictable ones.
    Fewer (even none) when not enough are evictable: the cap is then overshot until turns end."""
    excess = open_count - limit
    if excess <= 0:
        return []
    candidates = sorted((s for s in sessions if s.evictable), key=lambda s: s.last_used)
    return candidates[:excess]


@dataclass(frozen=True, slots=True)
class CapSummary:
    """What the cap did in one reporting window (for the log) and since the start (for ``daemon/status``)."""

    window_seconds: float
    closed: int  # sessions closed to stay under the cap, in the window
    came_back: int  # of the conversations whose session the cap closed, requests that came back, in the window
    closed_total: int
    came_back_total: int
    peak_open: int  # the most sessions open at once in the window (above the cap while turns ran)


class CapacityMeter:
    """Counts the cap's closes and the conversations that come back for a session the cap closed.

    A closed session's conversation is remembered by its fingerprints (``session.history`` digest chains: the history
    the agent answered, and the same followed by its answer), at most ``memory`` of them, oldest forgotten first. A
    request that found no session is checked against them by its own digest chain: any prefix that is a remembered
    fingerprint means the conversation had a session the cap took away.
    """

    def __init__(self, *, memory: int = 4096) -> None:
        self._memory = memory
        self._evicted: OrderedDict[bytes, None] = OrderedDict()
        self.closed_total = 0
        self.came_back_total = 0
        self.taken_back_total = 0
        self._window_start: float | None = None
        self._closed = 0
        self._came_back = 0
        self._peak_open = 0

    @property
    def watching(self) -> bool:
        """Whether a request without a session needs checking (its digest chain computed) at all."""
        return bool(self._evicted)

    def closed(self, fingerprints: Sequence[bytes], now: float) -> None:
        """A session was closed for the cap; its conversation is known by ``fingerprints``."""
        self._open_window(now)
        self.closed_total += 1
        self._closed += 1
        for fingerprint in fingerprints:
            self._evicted[fingerprint] = None
            self._evicted.move_to_end(fingerprint)
        while len(self._evicted) > self._memory:
            self._evicted.popitem(last=False)

    def request_without_session(self, chain: Sequence[bytes], now: float) -> bool:
        """A request found no session: True (and counted) if its history continues a conversation the cap closed.
        Each closed conversation counts once."""
        for fingerprint in reversed(chain):
            if fingerprint in self._evicted:
                del self._evicted[fingerprint]
                self._open_window(now)
                self.came_back_total += 1
                self._came_back += 1
                return True
        return False

    def taken_back(self) -> None:
        """A request took back a session whose close had been asked but not begun."""
        self.taken_back_total += 1

    def open_sessions(self, count: int, now: float) -> None:
        if self._window_start is not None:
            self._peak_open = max(self._peak_open, count)

    def report(self, now: float) -> CapSummary | None:
        """The window's summary once it has lasted ``REPORT_INTERVAL`` (then a new window opens with the next close);
        None before that, or when the cap closed nothing."""
        start = self._window_start
        if start is None or now - start < REPORT_INTERVAL:
            return None
        summary = CapSummary(
            round(now - start, 1),
            self._closed,
            self._came_back,
            self.closed_total,
            self.came_back_total,
            self._peak_open,
        )
        self._window_start = None
        self._closed = self._came_back = self._peak_open = 0
        return summary

    def _open_window(self, now: float) -> None:
        if self._window_start is None:
            self._window_start = now
