"""Per-key limits on turns: how many run at once, how many start a minute, how many tokens a day.

Owns each principal's account (turns running, its token bucket, the tokens of its UTC day) and the rule that admits
a turn or refuses it — ``TooManyRequests`` (-32004; HTTP 429) naming the limit and when to retry — before any work
starts. A turn already admitted always finishes: the day's tokens are counted when it ends, so the turn that crosses
the budget is the last one admitted that day.

Also how long a refusal's answer is held (``hold``): a key's first refusals of a second are answered at once, later
ones only after a pause (up to their retry time, at most ``HOLD_AT_MOST``), so that a client which ignores the retry
time keeps its own connections waiting instead of the daemon busy refusing it.

Sans-IO: callers give the clocks (``now``: monotonic seconds, for the bucket; ``wall``: Unix seconds, for the day).
The limits come from ``[limits]`` in the configuration (``bridge.config.Limits``), looked up by the key's name. A
process with one user (``lmbridge stdio``, principal id "") is not limited.
"""

from __future__ import annotations

from dataclasses import dataclass

from bridge.config import Limits, LimitSettings
from bridge.service.principals import Principal
from wire.errors import TooManyRequests

__all__ = ["Admission", "TurnLimits"]

DAY = 86400.0
BUSY_RETRY = 1.0  # seconds to wait when every turn slot of a key is taken: nobody knows when one will end
REFUSALS_AT_ONCE = 5.0  # a key's refusals answered without a pause: a burst of this many, refilled this many a second
HOLD_AT_MOST = 1.0  # seconds a refusal's answer is held at most


@dataclass(slots=True)
class _Account:
    running: int = 0
    bucket: float = 0.0  # requests that may start now; refilled at requests_per_minute / 60 a second
    filled_at: float | None = None  # when ``bucket`` was last brought up to date (None: never used, full)
    day: int = -1  # the UTC day ``tokens`` counts (days since the epoch)
    tokens: int = 0
    answers: float = REFUSALS_AT_ONCE  # refusals that may be answered at once (a bucket like ``bucket``)
    answered_at: float = 0.0


@dataclass(frozen=True, slots=True)
class Admission:
    """A turn let in: hand it back to ``TurnLimits.finish`` when the turn ends, whatever its end."""

    principal_id: str
    limited: bool


class TurnLimits:
    def __init__(self, limits: Limits) -> None:
        self._limits = limits
        self._accounts: dict[str, _Account] = {}

    def settings(self, principal: Principal) -> LimitSettings:
        return self._limits.of(principal.name)

    def admit(self, principal: Principal, *, now: float, wall: float) -> Admission:
        """Let a turn of ``principal`` in, or raise ``TooManyRequests`` saying which limit it met and when to retry.
        Nothing is counted for a refused request."""
        limited = self._limited(principal)
        if limited is None:
            return Admission(principal.id, limited=False)
        settings, account = limited
        refusal = self._refusal(settings, account, now=now, wall=wall)
        if refusal is not None:
            raise refusal
        if settings.requests_per_minute:
            account.bucket -= 1.0
        account.running += 1
        return Admission(principal.id, limited=True)

    def check(self, principal: Principal, *, now: float, wall: float) -> None:
        """Raise what ``admit`` would raise now, taking nothing: a front refuses a request over a limit as soon as it
        knows whose it is, before the work of reading it (its turn is admitted, and counted, by ``admit``)."""
        limited = self._limited(principal)
        refusal = self._refusal(*limited, now=now, wall=wall) if limited is not None else None
        if refusal is not None:
            raise refusal

    def _limited(self, principal: Principal) -> tuple[LimitSettings, _Account] | None:
        """``principal``'s limits and account; None when nothing limits it (the one user of a process, no limits)."""
        settings = self._limits.of(principal.name)
        if not principal.id or settings == LimitSettings():
            return None
        return settings, self._accounts.setdefault(principal.id, _Account())

    def hold(self, principal: Principal, refusal: TooManyRequests, *, now: float) -> float:
        """Seconds to hold the answer of ``refusal`` (just raised for ``principal``): 0 for the first few of a
        second, then its retry time up to ``HOLD_AT_MOST`` — a client that ignores the retry time waits anyway."""
        account = self._accounts.get(principal.id)
        if account is None:
            return 0.0
        account.answers = min(REFUSALS_AT_ONCE, account.answers + (now - account.answered_at) * REFUSALS_AT_ONCE)
        account.answered_at = now
        if account.answers >= 1.0:
            account.answers -= 1.0
            return 0.0
        return max(0.0, min(refusal.retry_after or HOLD_AT_MOST, HOLD_AT_MOST))

    @staticmethod
    def _refusal(settings: LimitSettings, account: _Account, *, now: float, wall: float) -> TooManyRequests | None:
        """The limit a turn of this account would meet now (its bucket brought up to date), if any."""
        if settings.concurrent_turns and account.running >= settings.concurrent_turns:
            return TooManyRequests(
                f"this key has {account.running} turns running, its limit (limits: concurrent_turns); retry when one "
                "has finished",
                limit=settings.concurrent_turns,
                retry_after=BUSY_RETRY,
                name="concurrent_turns",
            )
        today = int(wall // DAY)
        if account.day != today:
            account.day, account.tokens = today, 0
        if settings.daily_tokens and account.tokens >= settings.daily_tokens:
            return TooManyRequests(
                f"this key has used {account.tokens} tokens today (UTC), its budget (limits: daily_tokens); it is "
                "renewed at midnight UTC",
                limit=settings.daily_tokens,
                retry_after=(today + 1) * DAY - wall,
                name="daily_tokens",
            )
        if settings.requests_per_minute:
            rate = settings.requests_per_minute / 60.0
            burst = float(settings.requests_per_minute)
            if account.filled_at is None:
                account.bucket = burst
            else:
                account.bucket = min(burst, account.bucket + (now - account.filled_at) * rate)
            account.filled_at = now
            if account.bucket < 1.0:
                return TooManyRequests(
                    f"this key has made {settings.requests_per_minute} requests in the last minute, its limit "
                    "(limits: requests_per_minute)",
                    limit=settings.requests_per_minute,
                    retry_after=(1.0 - account.bucket) / rate,
                    name="requests_per_minute",
                )
        return None

    def finish(self, admission: Admission, tokens: int, *, wall: float) -> None:
        """The admitted turn ended, having used ``tokens`` (as reported, else estimated)."""
        if not admission.limited:
            return
        account = self._accounts[admission.principal_id]
        account.running -= 1
        today = int(wall // DAY)
        if account.day != today:
            account.day, account.tokens = today, 0
        account.tokens += max(0, tokens)

    def seed(self, tokens: dict[str, int], *, wall: float) -> None:
        """Today's tokens per principal id so far (from the usage ledger, when the daemon starts)."""
        today = int(wall // DAY)
        for principal_id, used in tokens.items():
            account = self._accounts.setdefault(principal_id, _Account())
            account.day, account.tokens = today, used

    def used_today(self, principal_id: str, *, wall: float) -> int:
        account = self._accounts.get(principal_id)
        if account is None or account.day != int(wall // DAY):
            return 0
        return account.tokens
