"""The usage ledger as a file: rows in, reports out (per key, agent, day; several nodes merged; costs the agents
report as session totals), its permissions, and what it does with a file that is not a ledger."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bridge.daemon.ledger import MAX_PENDING, UsageLedger, usage_report
from bridge.daemon.security import ServeError
from bridge.service.limits import DAY
from bridge.service.usage import TurnRecord

MIDNIGHT = 20_000 * DAY


def turn(at: float, key: str, **fields: Any) -> TurnRecord:
    row: dict[str, Any] = {
        "time": MIDNIGHT + at,
        "principal": f"id-{key}",
        "key": key,
        "front": "http",
        "agent": "claude",
        "model": "claude",
        "session": "",
        "input_tokens": None,
        "output_tokens": None,
        "cached_tokens": None,
        "total_tokens": None,
        "estimated": False,
        "session_cost": None,
        "currency": None,
        "seconds": 1.0,
        "first_part_seconds": 0.25,
        "outcome": "end_turn",
        "error_code": None,
        "tool_calls": 0,
        "limit": "",
    }
    row.update(fields)
    return TurnRecord(**row)


def ledger_with(path: Path, *rows: TurnRecord) -> UsageLedger:
    ledger = UsageLedger(path)
    ledger.open()
    for row in rows:
        ledger.record(row)
    ledger.write(ledger.take())
    return ledger


def test_a_report_sums_each_keys_turns_and_tells_estimates_refusals_and_errors_apart(tmp_path: Path) -> None:
    ledger = ledger_with(
        tmp_path / "usage.db",
        turn(10, "alice", input_tokens=100, output_tokens=20, cached_tokens=80, total_tokens=120),
        turn(20, "alice", total_tokens=50, estimated=True, seconds=3.0, first_part_seconds=None),
        turn(30, "alice", outcome="refused", error_code=-32004, seconds=0.0, first_part_seconds=None),
        turn(40, "bob", agent="codex", model="codex/gpt-5", total_tokens=7, outcome="error", error_code=-32603),
        turn(50, "bob", agent="codex", model="codex/gpt-5", outcome="cancelled"),
    )
    ledger.close()
    rows = {row.group: row.to_json() for row in usage_report([ledger.path], "key", MIDNIGHT, MIDNIGHT + DAY)}
    assert rows["alice"] == {
        "group": "alice",
        "turns": 2,
        "refused": 1,
        "errors": 0,
        "cancelled": 0,
        "inputTokens": 100,
        "outputTokens": 20,
        "cachedTokens": 80,
        "totalTokens": 170,
        "estimatedTokens": 50,
        "meanSeconds": 2.0,
        "meanFirstPartSeconds": 0.25,
        "cost": {},
    }
    assert (rows["bob"]["turns"], rows["bob"]["errors"], rows["bob"]["cancelled"]) == (2, 1, 1)
    by_model = usage_report([ledger.path], "model", MIDNIGHT, MIDNIGHT + DAY)
    assert [row.group for row in by_model] == ["claude", "codex/gpt-5"]  # most tokens first
    # The period's bounds: turns outside it are not counted.
    assert [row.group for row in usage_report([ledger.path], "key", MIDNIGHT + 35, MIDNIGHT + DAY)] == ["bob"]


def test_a_flood_of_refused_requests_costs_a_row_a_second_and_is_counted_whole(tmp_path: Path) -> None:
    ledger = UsageLedger(tmp_path / "usage.db")
    ledger.open()
    refused = {"outcome": "refused", "error_code": -32004, "seconds": 0.0, "first_part_seconds": None}
    for n in range(1000):  # 1,000 requests in a second and a half: two rows
        ledger.record(turn(n * 0.0015, "flood", limit="requests_per_minute", **refused))
    ledger.record(turn(0.5, "flood", limit="concurrent_turns", **refused))  # another limit: its own row
    ledger.record(turn(0.7, "quiet", total_tokens=5))
    rows = ledger.take()
    assert sorted((row[2], row[-2], row[-1]) for row in rows) == [  # key, limit, count
        ("flood", "concurrent_turns", 1),
        ("flood", "requests_per_minute", 333),  # from 1.0015 s on
        ("flood", "requests_per_minute", 667),  # its first second
        ("quiet", "", 1),
    ]
    ledger.write(rows)
    ledger.close()
    report = {row.group: row for row in usage_report([ledger.path], "key", MIDNIGHT, MIDNIGHT + DAY)}
    assert (report["flood"].refused, report["flood"].turns, report["quiet"].turns) == (1001, 0, 1)


def test_the_cost_of_a_period_is_what_each_session_added_in_it(tmp_path: Path) -> None:
    # ACP reports a session's cost so far: 0.10 after its first turn, 0.25 after its second, 0.40 after its third.
    costs = [(100, 0.10), (DAY + 100, 0.25), (DAY + 200, 0.40)]
    rows = [turn(at, "alice", session="s1", session_cost=cost, currency="USD") for at, cost in costs]
    rows.append(turn(DAY + 300, "alice", session="s2", session_cost=0.05, currency="USD"))
    ledger = ledger_with(tmp_path / "usage.db", *rows)
    ledger.close()
    [first_day] = usage_report([ledger.path], "key", MIDNIGHT, MIDNIGHT + DAY)
    [second_day] = usage_report([ledger.path], "key", MIDNIGHT + DAY, MIDNIGHT + 2 * DAY)
    [both] = usage_report([ledger.path], "key", MIDNIGHT, MIDNIGHT + 2 * DAY)
    assert first_day.cost == pytest.approx({"USD": 0.10})
    assert second_day.cost == pytest.approx({"USD": 0.30 + 0.05})
    assert both.cost == pytest.approx({"USD": 0.45})
    by_day = usage_report([ledger.path], "day", MIDNIGHT, MIDNIGHT + 2 * DAY)  # a session over two days: split
    assert [row.cost["USD"] for row in by_day] == pytest.approx([0.35, 0.10])


def test_several_nodes_ledgers_merge_into_one_report(tmp_path: Path) -> None:
    one = ledger_with(tmp_path / "a.db", turn(1, "alice", total_tokens=10), turn(2, "bob", total_tokens=1))
    two = ledger_with(tmp_path / "b.db", turn(3, "alice", total_tokens=5))
    one.close()
    two.close()
    rows = {row.group: row for row in usage_report([one.path, two.path], "key", MIDNIGHT, MIDNIGHT + DAY)}
    assert (rows["alice"].turns, rows["alice"].total_tokens, rows["bob"].turns) == (2, 15, 1)
    by_day = usage_report([one.path, two.path], "day", MIDNIGHT, MIDNIGHT + DAY)
    assert [(row.group, row.turns) for row in by_day] == [("2024-10-04", 3)]


def test_todays_tokens_per_principal_come_back_after_a_restart(tmp_path: Path) -> None:
    ledger = ledger_with(
        tmp_path / "usage.db",
        turn(-10, "alice", total_tokens=1000),  # yesterday
        turn(10, "alice", total_tokens=300),
        turn(20, "alice", total_tokens=200, estimated=True),
        turn(30, "local", principal="", total_tokens=5),  # a process with one user: never limited
    )
    ledger.close()
    again = UsageLedger(ledger.path)
    again.open()
    assert again.tokens_today(MIDNIGHT) == {"id-alice": 500}
    again.close()


def test_the_ledger_and_its_wal_files_are_private(tmp_path: Path) -> None:
    ledger = ledger_with(tmp_path / "state" / "usage.db", turn(1, "alice"))
    files = [path for path in (tmp_path / "state").iterdir() if path.name.startswith("usage.db")]
    assert {path.name for path in files} >= {"usage.db", "usage.db-wal"}
    assert all(stat.S_IMODE(path.stat().st_mode) == 0o600 for path in files), files
    ledger.close()
    ledger.path.chmod(0o644)
    with pytest.raises(ServeError, match="accessible by other users"):
        UsageLedger(ledger.path).open()


def test_another_programs_database_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "usage.db"
    other = sqlite3.connect(path)
    other.execute("CREATE TABLE notes (text TEXT)")
    other.commit()
    other.close()
    path.chmod(0o600)
    before = path.read_bytes()
    with pytest.raises(ServeError, match="not a usage ledger of this lmbridge"):
        UsageLedger(path).open()
    assert path.read_bytes() == before
    with pytest.raises(ServeError, match="cannot create the usage ledger"):
        UsageLedger(Path("/proc/no-such-dir/usage.db")).open()


def test_a_file_that_is_not_a_ledger_is_refused_with_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "usage.db"
    path.write_text("not a database, just words" * 100)
    path.chmod(0o600)
    with pytest.raises(ServeError, match=r"is not a usage ledger .* move it away"):
        UsageLedger(path).open()
    with pytest.raises(ServeError, match="no usage ledger at"):
        usage_report([tmp_path / "absent.db"], "key", 0, 1)


def test_rows_a_write_failed_on_wait_for_the_next_and_the_oldest_go_past_the_bound() -> None:
    ledger = UsageLedger(Path("/nonexistent/usage.db"))
    ledger.record(turn(1, "alice"))
    ledger.give_back([turn(0, "bob")])  # a failed write's rows go before the ones recorded since
    assert [row[2] for row in ledger.take()] == ["bob", "alice"]  # (the key's name is a row's third value)
    ledger.give_back([turn(i, "alice") for i in range(MAX_PENDING + 5)])
    assert ledger.dropped == 5 and len(ledger.take()) == MAX_PENDING


def test_lmbridge_usage_prints_the_report_and_names_a_missing_ledger(tmp_path: Path) -> None:
    ledger = ledger_with(tmp_path / "usage.db", turn(1, "alice", total_tokens=42))
    ledger.close()
    command = [sys.executable, "-m", "bridge", "usage", "--ledger", str(ledger.path), "--since", "2024-10-01"]
    shown = subprocess.run(command, capture_output=True, text=True, check=True)
    assert shown.stdout.splitlines()[0].split()[:3] == ["KEY", "TURNS", "REFUSED"]
    assert shown.stdout.splitlines()[1].split()[:2] == ["alice", "1"] and " 42 " in shown.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "bridge", "usage", "--ledger", str(tmp_path / "none.db")], capture_output=True, text=True
    )
    assert missing.returncode == 2 and "no usage ledger at" in missing.stderr
    wrong = subprocess.run([*command, "--since", "yesterday"], capture_output=True, text=True)
    assert wrong.returncode == 2 and "--since 'yesterday': give a duration" in wrong.stderr
