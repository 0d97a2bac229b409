"""11. One key's flood and another key's turns: a shared daemon with per-key limits keeps a flooding key to its share.

The daemon runs the bench agent as a team's daemon would (``isolation = "key"``: an agent process per key) with
``[limits.keys.flood] concurrent_turns = 4``. The quiet key's first-token latency
(a new conversation each time, ``POST /v1/chat/completions`` streamed) is measured alone, then while the flooding key
— in a process of its own, so that its client does not share the measuring process's interpreter — sends requests as
fast as it can from 16 connections: at most 4 of its turns run (each streaming ``flood 2000`` chunks), the rest are
refused 429 before any work. Alone and flooded alternate in windows. Goal: the quiet key's median within 1.5 × alone.

Also ``python -m bench.team --flood URL KEY SECONDS``: the flooding process itself.
"""

from __future__ import annotations

import argparse
import http.client
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

from .common import Row, Workspace, summarize
from .wire import clock

FLOOD_CONNECTIONS = 16
FLOOD_LIMIT = 4  # the flooding key's concurrent_turns


def team(ws: Workspace, plan: object) -> list[Row]:
    from bridge.daemon.keys import KeysFile

    from .benchmarks import _tag
    from .daemon import Daemon, HttpStreamer

    reps = getattr(plan, "first_token_reps", 30)
    config = ws.config(max_sessions=5000)
    # A team's daemon as docs/daemon.md sets it up: an agent process per key, and the flooding key limited.
    text = config.read_text().replace("[agents.bench]\n", '[agents.bench]\nisolation = "key"\n')
    config.write_text(text + f"\n[limits.keys.flood]\nconcurrent_turns = {FLOOD_LIMIT}\n")
    keys = KeysFile(ws.path / "keys.json")  # beside the token file: the daemon finds it
    flood_key, quiet_key = keys.add("flood")[1], keys.add("quiet")[1]
    script = Path(sys.executable).with_name("lmbridge")
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "bridge"]
    daemon = Daemon(
        [*argv, "serve", "--config", str(config)], env=ws.env, stderr=ws.log("team"), token_file=ws.path / "token"
    )
    timings: dict[str, list[float]] = {"alone": [], "flooded": []}
    flood_counts: list[dict[str, int]] = []
    try:
        client = HttpStreamer(daemon.http_url, quiet_key)

        def first_token() -> float:
            started = clock()
            deltas = client.chat_deltas("bench", [{"role": "user", "content": f"#{_tag()}\nsay first"}])
            next(deltas)
            took = (client.read_at - started) * 1000
            for _ in deltas:
                pass
            return took

        for _ in range(3):  # warm-up: the agent started, the paths taken once
            first_token()
        window = max(3, reps // 6)
        for rep in range(6):
            flooded = rep % 2 == 1
            flood = None
            if flooded:
                flood = subprocess.Popen(
                    [sys.executable, "-m", "bench.team", "--flood", daemon.http_url, flood_key, "600"],
                    stdout=subprocess.PIPE,
                    env=ws.env,
                )
                time.sleep(1.0)  # its connections open and its turns start before the quiet key is timed
            try:
                timings["flooded" if flooded else "alone"] += [first_token() for _ in range(window)]
            finally:
                if flood is not None:
                    flood.terminate()
                    out, _ = flood.communicate(timeout=30)
                    flood_counts.append(json.loads(out or b"{}"))
        client.close()
    finally:
        daemon.close()
    alone, flooded = summarize(timings["alone"]), summarize(timings["flooded"])
    ratio = flooded.median / alone.median if alone.median else None
    turns = sum(count.get("200", 0) for count in flood_counts)
    refused = sum(count.get("429", 0) for count in flood_counts)
    return [
        Row(
            "11 one key's flood",
            "another key's first token, new conversation, /v1/chat/completions stream",
            "ms",
            flooded,
            alone,
            "the same key's, no flood",
            goal="≤ 1.5 × alone (median)",
            passed=ratio is not None and ratio <= 1.5,
            notes=(
                f"{len(timings['flooded'])} flooded / {len(timings['alone'])} alone, in alternating windows; the "
                f"flooding key (concurrent_turns = {FLOOD_LIMIT}, {FLOOD_CONNECTIONS} connections) had {turns} turns "
                f"and {refused} requests refused 429 meanwhile"
            ),
            extra={"flood": flood_counts},
        )
    ]


def _flood(url: str, key: str, seconds: float) -> dict[str, int]:
    """Requests as fast as ``FLOOD_CONNECTIONS`` connections take them, until ``seconds`` pass or the process is
    terminated (then the counts so far are printed)."""
    parts = urlsplit(url)
    counts: dict[str, int] = {}
    lock = threading.Lock()
    stop = time.monotonic() + seconds
    body = json.dumps({"model": "bench", "messages": [{"role": "user", "content": "flood 2000"}], "stream": True})
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}

    def worker() -> None:
        connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        while time.monotonic() < stop:
            try:
                connection.request("POST", "/v1/chat/completions", body=body, headers=headers)
                response = connection.getresponse()
                response.read()
                status = str(response.status)
            except (OSError, http.client.HTTPException):
                status = "error"
                connection.close()
                connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
            with lock:
                counts[status] = counts.get(status, 0) + 1

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(FLOOD_CONNECTIONS)]
    for thread in threads:
        thread.start()

    import signal

    def report(*_: object) -> None:
        with lock:
            sys.stdout.write(json.dumps(counts))
            sys.stdout.flush()
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, report)
    for thread in threads:
        thread.join()
    report()
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.team")
    parser.add_argument("--flood", nargs=3, metavar=("URL", "KEY", "SECONDS"), required=True)
    args = parser.parse_args()
    url, key, seconds = args.flood
    _flood(url, key, float(seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
