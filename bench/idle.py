"""How much slower this machine runs work that follows a pause: the "idle-cold" cost behind figures with waits.

    python -m bench.idle [--reps N]

The same small piece of Python (encoding and decoding 50 short chat messages as JSON, filling a 300-entry dict: the
kind of work lmbridge does per message) is timed right after pauses of increasing length, then the runs after one
long pause one by one. On a machine whose caches survive a pause the times barely change; on a virtual machine
whose CPU loses them while it sleeps, the first run after a pause is many times slower (2026-11-26, the benchmark
machine: 0.12 ms back to back, 2.7 ms after 0.7 s). Standard library only; nothing of lmbridge is imported.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

_MESSAGES = [{"role": "user", "content": [{"type": "text", "value": "x" * 50}]} for _ in range(50)]
_PAUSES = (0.0, 0.001, 0.01, 0.05, 0.2, 0.7)
_LONG_PAUSE = 0.7
_IN_A_ROW = 4  # runs timed one by one after a long pause


def work() -> float:
    """One piece of work; its duration in microseconds."""
    started = time.perf_counter()
    json.loads(json.dumps(_MESSAGES))
    table = {}
    for index in range(300):
        table[str(index)] = [index, str(index)]
    return (time.perf_counter() - started) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=15, help="pauses of each length (default 15)")
    args = parser.parse_args()
    warm = statistics.median(work() for _ in range(args.reps))
    print(f"{'pause before the work':>24}  {'median':>9}  {'vs back to back':>15}")
    for pause in _PAUSES:
        samples = []
        for _ in range(args.reps):
            time.sleep(pause)
            samples.append(work())
        median = statistics.median(samples)
        print(f"{pause * 1000:>21.0f} ms  {median:>6.0f} µs  {median / warm:>14.1f}×")
    rows = []
    for _ in range(args.reps):
        time.sleep(_LONG_PAUSE)
        rows.append([work() for _ in range(_IN_A_ROW)])
    runs = ", ".join(f"{statistics.median(row[index] for row in rows):.0f}" for index in range(_IN_A_ROW))
    print(f"after {_LONG_PAUSE * 1000:.0f} ms, runs 1 to {_IN_A_ROW} in a row: {runs} µs (medians)")


if __name__ == "__main__":
    main()
