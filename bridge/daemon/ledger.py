"""The usage ledger: one row per turn (``bridge.service.usage.TurnRecord``) in a SQLite file, and the reports
``lmbridge usage`` prints from one or several of them.

Owns the file (``usage.db`` beside the token file unless told, 0600 with its WAL files, in WAL mode so a report can
read while the daemon writes), its schema, writing rows in batches (the daemon hands the rows a turn left to a
worker thread once a second: a turn never waits for the disk), today's tokens per principal (a restarted daemon's
daily budgets go on from there), and the reports: per key, agent, model, front or day, over one ledger or the
ledgers of several nodes merged. Nothing of a conversation's content is stored.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridge.service.usage import TurnRecord

from .security import ServeError, check_private

__all__ = ["GROUPS", "UsageLedger", "UsageRow", "ledger_path_for", "usage_report"]

SCHEMA_VERSION = 1
# A row: a TurnRecord's fields (``limit`` is an SQL word: ``limit_name``), and how many requests it stands for.
_COLUMNS = (*("limit_name" if name == "limit" else name for name in TurnRecord._fields), "count")
_Row = list[Any]
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS turns (
    time REAL NOT NULL,
    principal TEXT NOT NULL,
    key TEXT NOT NULL,
    front TEXT NOT NULL,
    agent TEXT NOT NULL,
    model TEXT NOT NULL,
    session TEXT NOT NULL,
    input_tokens INTEGER,
    output_tokens INTEGER,
    cached_tokens INTEGER,
    total_tokens INTEGER,
    estimated INTEGER NOT NULL,
    session_cost REAL,
    currency TEXT,
    seconds REAL NOT NULL,
    first_part_seconds REAL,
    outcome TEXT NOT NULL,
    error_code INTEGER,
    tool_calls INTEGER NOT NULL,
    limit_name TEXT NOT NULL,
    count INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS turns_by_time ON turns (time);
CREATE INDEX IF NOT EXISTS turns_by_session ON turns (session, currency, time) WHERE session_cost IS NOT NULL;
PRAGMA user_version = {SCHEMA_VERSION};
"""
_INSERT = f"INSERT INTO turns ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' for _ in _COLUMNS)})"
MAX_PENDING = 100_000  # rows kept for a later write while the disk refuses them; beyond, the oldest are dropped
REFUSED_ROW_SECONDS = 1.0  # requests refused by one limit of one key within this long share one row (a flood)

# What a report groups by: a column, or an expression of one.
GROUPS = {
    "key": "key",
    "agent": "agent",
    "model": "model",
    "front": "front",
    "day": "date(time, 'unixepoch')",
}


def ledger_path_for(token_path: Path) -> Path:
    return token_path.with_name("usage.db")


class UsageLedger:
    """The daemon's ledger. ``record`` (the service's ``Recorder``) only keeps the row; ``take`` and ``write`` move
    kept rows to the file (``write`` in a worker thread, one transaction a batch)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pending: list[_Row] = []
        self._refusing: dict[tuple[str, str], _Row] = {}  # the pending row counting a key's refusals by a limit
        self.dropped = 0  # rows lost because the disk refused them for too long
        self._db: sqlite3.Connection | None = None

    def open(self) -> None:
        """Create the file (0600) or check it; ``ServeError`` says what is wrong with it."""
        self._db = _connect(self.path, create=True)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def record(self, record: TurnRecord) -> None:
        """A turn's row; requests refused by one limit of one key within a second are counted in one row, so that a
        flood of them costs the disk a row a second, not a row a request."""
        if record.outcome == "refused":
            refusing = (record.principal, record.limit)
            open_row = self._refusing.get(refusing)
            if open_row is not None and record.time - open_row[0] < REFUSED_ROW_SECONDS:
                open_row[-1] += 1
                return
            self._refusing[refusing] = row = [*record, 1]
            self._pending.append(row)
            return
        self._pending.append([*record, 1])

    def take(self) -> list[_Row]:
        rows, self._pending = self._pending, []
        self._refusing.clear()  # a row taken is being written: refusals from now on go to a new one
        return rows

    def give_back(self, rows: list[_Row]) -> None:
        """Rows a write failed on, kept for the next (newest first when there are too many)."""
        self._pending = rows + self._pending
        if len(self._pending) > MAX_PENDING:
            self.dropped += len(self._pending) - MAX_PENDING
            self._pending = self._pending[-MAX_PENDING:]

    def write(self, rows: list[_Row]) -> None:
        """Append ``rows`` in one transaction (``sqlite3.Error`` / ``OSError`` when the disk refuses)."""
        if not rows:
            return
        assert self._db is not None, "open() first"
        with self._db:
            self._db.executemany(_INSERT, rows)

    def tokens_today(self, since: float) -> dict[str, int]:
        """Tokens per principal in the turns asked for since ``since`` (Unix seconds: the day's start)."""
        assert self._db is not None, "open() first"
        query = "SELECT principal, SUM(total_tokens) FROM turns WHERE time >= ? AND principal != '' GROUP BY 1"
        return {principal: int(tokens or 0) for principal, tokens in self._db.execute(query, (since,))}


def _connect(path: Path, *, create: bool) -> sqlite3.Connection:
    if create:
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):  # SQLite's own files (WAL) follow its mode
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except OSError as exc:
            raise ServeError(
                f"cannot create the usage ledger {path}: {exc.strerror or exc} (--ledger names another)"
            ) from None
    try:
        info = path.stat()
    except FileNotFoundError:
        raise ServeError(f"no usage ledger at {path} (the daemon writes it; --ledger names another)") from None
    if create:
        check_private(path, info, "usage ledger ")
    elif not stat.S_ISREG(info.st_mode):
        raise ServeError(f"{path} is not a regular file")
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    try:
        # Looked at before anything is written: a file that is another program's database is left as it was.
        version = db.execute("PRAGMA user_version").fetchone()[0]
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if version not in (0, SCHEMA_VERSION) or tables - {"turns"} or (version == 0 and tables):
            raise ServeError(f"{path} is not a usage ledger of this lmbridge (schema {version}); move it away")
        if create:
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")  # WAL: a crash may lose the last batch, never corrupt
            db.executescript(_SCHEMA)
            db.isolation_level = "DEFERRED"
        else:
            db.execute("SELECT 1 FROM turns LIMIT 1")
    except sqlite3.DatabaseError as exc:
        db.close()
        raise ServeError(f"{path} is not a usage ledger ({exc}); move it away") from None
    except ServeError:
        db.close()
        raise
    return db


@dataclass
class UsageRow:
    """A report's line: the turns of one group."""

    group: str
    turns: int = 0  # turns that ran (refused requests are not turns)
    refused: int = 0
    errors: int = 0
    cancelled: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    total_tokens: int = 0
    estimated_tokens: int = 0  # of ``total_tokens``: estimated, the agent reported none
    seconds: float = 0.0  # summed over the turns
    first_part_seconds: float = 0.0  # summed over the turns that sent a part
    with_first_part: int = 0
    cost: dict[str, float] = field(default_factory=dict)  # by currency

    def to_json(self) -> dict[str, Any]:
        ran = self.turns or 1
        return {
            "group": self.group,
            "turns": self.turns,
            "refused": self.refused,
            "errors": self.errors,
            "cancelled": self.cancelled,
            "inputTokens": self.input_tokens,
            "outputTokens": self.output_tokens,
            "cachedTokens": self.cached_tokens,
            "totalTokens": self.total_tokens,
            "estimatedTokens": self.estimated_tokens,
            "meanSeconds": round(self.seconds / ran, 3),
            "meanFirstPartSeconds": round(self.first_part_seconds / (self.with_first_part or 1), 3),
            "cost": {currency: round(amount, 6) for currency, amount in sorted(self.cost.items())},
        }


_SUMS = """
SELECT {group},
    SUM(outcome != 'refused'), SUM(CASE WHEN outcome = 'refused' THEN count ELSE 0 END), SUM(outcome = 'error'),
    SUM(outcome = 'cancelled'),
    SUM(COALESCE(input_tokens, 0)), SUM(COALESCE(output_tokens, 0)), SUM(COALESCE(cached_tokens, 0)),
    SUM(COALESCE(total_tokens, 0)), SUM(CASE WHEN estimated THEN COALESCE(total_tokens, 0) ELSE 0 END),
    SUM(CASE WHEN outcome != 'refused' THEN seconds ELSE 0 END), SUM(COALESCE(first_part_seconds, 0)),
    COUNT(first_part_seconds)
FROM turns WHERE time >= ? AND time < ? GROUP BY 1
"""
_SUMMED = (  # the UsageRow fields _SUMS adds up, in its order
    "turns", "refused", "errors", "cancelled", "input_tokens", "output_tokens", "cached_tokens", "total_tokens",
    "estimated_tokens", "seconds", "first_part_seconds", "with_first_part",
)  # fmt: skip
# The agents report a session's cost so far: each turn added its report less the session's report before it (so a
# session spanning days or models is split among them, never counted twice).
_COSTS = """
SELECT {group}, currency, SUM(MAX(0, added)) FROM (
    SELECT *, session_cost - COALESCE(LAG(session_cost) OVER (PARTITION BY session, currency ORDER BY time), 0) AS added
    FROM turns WHERE session_cost IS NOT NULL AND session != ''
) WHERE time >= ? AND time < ? GROUP BY 1, 2
"""


def usage_report(paths: Iterable[Path], group: str, since: float, until: float) -> list[UsageRow]:
    """The turns of the ledgers at ``paths`` (several nodes' merged) from ``since`` to ``until``, one row per
    ``group`` (a key of ``GROUPS``), largest total tokens first."""
    expression = GROUPS[group]
    rows: dict[str, UsageRow] = {}
    for path in paths:
        with _reading(path) as db:
            for name, *sums in db.execute(_SUMS.format(group=expression), (since, until)):
                row = rows.setdefault(str(name), UsageRow(str(name)))
                for summed, value in zip(_SUMMED, sums, strict=True):
                    setattr(row, summed, getattr(row, summed) + (value or 0))
            for name, currency, amount in db.execute(_COSTS.format(group=expression), (since, until)):
                row = rows.setdefault(str(name), UsageRow(str(name)))
                row.cost[currency] = row.cost.get(currency, 0.0) + max(0.0, amount or 0.0)
    return sorted(rows.values(), key=lambda row: (-row.total_tokens, -row.turns, row.group))


@contextlib.contextmanager
def _reading(path: Path) -> Iterator[sqlite3.Connection]:
    db = _connect(path, create=False)
    try:
        yield db
    finally:
        db.close()
