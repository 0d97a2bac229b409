"""Run the benchmarks, print one table, write it as JSON.

    python -m bench                 # the full run (a few minutes on 2 cores)
    python -m bench --quick         # a smoke run (seconds): tiny sizes, same code paths
    python -m bench --only tools,history
    python -m bench --check         # exit status 1 when a goal is missed

Results go to bench/results/latest.json (``--quick``: bench/results/quick.json; ``--output`` to choose). The exit
status is 2 when a benchmark failed to run, 1 with ``--check`` when a goal was missed, else 0.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: python bench/run.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = "bench"

from bench.benchmarks import BENCHMARKS, FULL, QUICK
from bench.common import RESULTS, Row, Workspace
from bench.wire import ROOT


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in lscpu.splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("Model name", "CPU(s)", "Thread(s) per core", "Hypervisor vendor", "CPU max MHz"):
                info[key.strip()] = value.strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    try:
        with open("/proc/meminfo") as handle:
            info["memory"] = handle.readline().split(":", 1)[1].strip()
    except OSError:
        pass
    try:
        import trio

        info["trio"] = trio.__version__
    except ImportError:
        pass
    try:
        info["commit"] = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        info["worktree"] = "modified" if dirty else "clean"
    except OSError:
        pass
    return info


# -- formatting ----------------------------------------------------------------------------------------------------


def _number(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if unit == "chunks/s":
        return f"{value:,.0f}/s"
    if unit == "ms":
        return f"{value:.3f} ms" if abs(value) < 10 else f"{value:,.1f} ms"
    if unit == "MiB":
        return f"{value:.1f} MiB"
    if unit == "KiB":
        return f"{value:,.0f} KiB"
    return f"{value:g} {unit}"


def _signed(value: float, unit: str) -> str:
    text = _number(abs(value), unit)
    return ("+" if value >= 0 else "−") + text


def _second(summary: Any, unit: str, worst: bool) -> str:
    """The p99 column: the p99, or for throughput the slowest run."""
    if summary is None or (not worst and summary.p99 is None):
        return "—"
    return _number(summary.min if worst else summary.p99, unit)


def table(rows: list[Row]) -> str:
    header = [
        "#",
        "benchmark",
        "figure",
        "lmbridge median",
        "p99",
        "baseline median",
        "p99",
        "ratio",
        "added p50 / p99",
        "goal",
        "result",
    ]
    body = []
    for number, row in enumerate(rows, 1):
        worst = row.unit == "chunks/s"  # throughput: the p99 column holds the slowest run
        b, base = row.bridge, row.baseline
        body.append(
            [
                str(number),
                row.benchmark,
                row.metric,
                _number(b.median, row.unit),
                _second(b, row.unit, worst),
                _number(base.median, row.unit) if base else "—",
                _second(base, row.unit, worst),
                f"{row.ratio:.2f}×" if row.ratio is not None else "—",
                f"{_signed(row.added['median'], row.unit)} / {_signed(row.added['p99'], row.unit)}"
                if row.added
                else "—",
                row.goal or "—",
                "—" if row.passed is None else ("PASS" if row.passed else "MISS"),
            ]
        )
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    right = {0, 3, 4, 5, 6, 7, 8}

    def fmt(line: list[str]) -> str:
        return (
            "| "
            + " | ".join(cell.rjust(widths[i]) if i in right else cell.ljust(widths[i]) for i, cell in enumerate(line))
            + " |"
        )

    lines = [
        fmt(header),
        "|" + "|".join(("-" * (w + 1) + ":") if i in right else ("-" * (w + 2)) for i, w in enumerate(widths)) + "|",
    ]
    lines += [fmt(line) for line in body]
    lines.append("")
    lines.append("Baselines and notes (throughput: the p99 columns hold the slowest run):")
    for number, row in enumerate(rows, 1):
        text = "; ".join(
            piece for piece in (f"baseline: {row.baseline_name}" if row.baseline_name else "", row.notes) if piece
        )
        if text:
            lines.append(f"  {number}. {text}")
    return "\n".join(lines)


# -- running -------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, a few seconds")
    parser.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(BENCHMARKS)}")
    parser.add_argument(
        "--output", type=Path, help="JSON results file (default bench/results/latest.json, or quick.json with --quick)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory (configs, bridge logs)")
    parser.add_argument("--check", action="store_true", help="exit with status 1 when a goal is missed")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    names = [name.strip() for name in args.only.split(",") if name.strip()] or list(BENCHMARKS)
    unknown = [name for name in names if name not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    output = args.output or RESULTS / ("quick.json" if args.quick else "latest.json")

    RESULTS.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    load_before = os.getloadavg()
    workspace = Workspace(keep=args.keep)
    rows: list[Row] = []
    errors: dict[str, str] = {}
    timings: dict[str, float] = {}
    try:
        for name in names:
            print(f"running {name} …", file=sys.stderr, flush=True)
            begun = time.monotonic()
            try:
                rows += BENCHMARKS[name](workspace, plan)
            except Exception:
                errors[name] = traceback.format_exc()
                print(f"{name} FAILED:\n{errors[name]}", file=sys.stderr, flush=True)
            timings[name] = round(time.monotonic() - begun, 1)
    finally:
        workspace.close()
        if args.keep:
            print(f"scratch directory kept: {workspace.path}", file=sys.stderr)
    seconds = time.monotonic() - started

    text = table(rows)
    print(text)
    print(
        f"\n{'quick' if args.quick else 'full'} run, {seconds:.1f} s "
        f"({', '.join(f'{name} {value:g} s' for name, value in timings.items())}); "
        f"load average before/after: {load_before[0]:.2f} / {os.getloadavg()[0]:.2f}"
    )
    missed = [row.metric for row in rows if row.passed is False]
    result = {
        "started": stamp,
        "mode": "quick" if args.quick else "full",
        "seconds": round(seconds, 1),
        "seconds_per_benchmark": timings,
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "machine": machine(),
        "plan": plan.__dict__,
        "rows": [row.to_json() for row in rows],
        "missed_goals": missed,
        "errors": errors,
        "table": text,
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    print(f"written: {output}", file=sys.stderr)
    if errors:
        return 2
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
