"""``lmbridge usage``: what the daemon's turns used, from its usage ledger (docs/daemon.md#usage), per key, agent,
model, front or day; the ledgers of several nodes merged with ``--merge``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

__all__ = ["add_usage_parser", "run_usage"]

DEFAULT_SINCE = "30d"


def add_usage_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    usage = commands.add_parser("usage", help="what the daemon's turns used: tokens, cost, turns, per key or agent")
    usage.add_argument("--ledger", metavar="FILE", help="the usage ledger (default: usage.db beside the token file)")
    usage.add_argument("--token-file", metavar="FILE", help="the daemon's token file (the ledger is beside it)")
    usage.add_argument(
        "--merge",
        action="append",
        default=[],
        metavar="FILE",
        help="another node's ledger to count with it (repeatable): one report for a cluster",
    )
    usage.add_argument(
        "--since", default=DEFAULT_SINCE, metavar="WHEN", help="90m, 12h, 30d, 2w ago, or a date (UTC; default 30d)"
    )
    usage.add_argument("--until", metavar="WHEN", help="the period's end, as --since (default: now)")
    # Checked against the ledger's groups when the command runs: every lmbridge start builds this parser.
    usage.add_argument(
        "--by", default="key", metavar="GROUP", help="one line per key, agent, model, front or day (default: key)"
    )
    usage.add_argument("--json", action="store_true", help="print the report as JSON")


def run_usage(args: argparse.Namespace) -> int:
    from bridge.daemon.keys import parse_since, when
    from bridge.daemon.ledger import GROUPS, ledger_path_for, usage_report
    from bridge.daemon.security import ServeError, beside_token

    if args.by not in GROUPS:
        print(f"lmbridge usage: --by {args.by!r}: one of {', '.join(sorted(GROUPS))}", file=sys.stderr)
        return 2
    path = beside_token(args.ledger, args.token_file, ledger_path_for)
    paths = [path, *(Path(other).expanduser() for other in args.merge)]
    now = time.time()
    try:
        since = parse_since(args.since, now)
        until = parse_since(args.until, now) if args.until else now
        rows = usage_report(paths, args.by, since, until)
    except ServeError as exc:
        print(f"lmbridge usage: {exc}", file=sys.stderr)
        return 2
    if args.json:
        report = {"since": since, "until": until, "by": args.by, "ledgers": [str(p) for p in paths]}
        print(json.dumps({**report, "rows": [row.to_json() for row in rows]}, indent=2))
        return 0
    print(f"usage from {when(since)} to {when(until)} UTC, by {args.by} ({len(paths)} ledger(s))", file=sys.stderr)
    if not rows:
        print("no turns in that period", file=sys.stderr)
        return 0
    print(
        f"{args.by.upper():<24} {'TURNS':>7} {'REFUSED':>7} {'ERRORS':>6} {'INPUT':>11} {'OUTPUT':>10} "
        f"{'CACHED':>11} {'TOTAL':>11} {'EST.':>9} {'MEAN S':>7} {'FIRST S':>7}  COST"
    )
    for row in rows:
        shown = row.to_json()
        cost = ", ".join(f"{amount:.4f} {currency}" for currency, amount in shown["cost"].items()) or "-"
        print(
            f"{row.group:<24} {row.turns:>7} {row.refused:>7} {row.errors:>6} {row.input_tokens:>11} "
            f"{row.output_tokens:>10} {row.cached_tokens:>11} {row.total_tokens:>11} {row.estimated_tokens:>9} "
            f"{shown['meanSeconds']:>7} {shown['meanFirstPartSeconds']:>7}  {cost}"
        )
    return 0
