"""11. One key's flood and another key's turns: a shared daemon with per-key limits keeps a flooding key to its share.

The daemon runs the bench agent as a team's daemon would (``isolation = "key"``: an agent process per key) with
``[limits.keys.flood] concurrent_turns = 4``. The quiet key's first-token latency
(a new conversation each time, ``POST /v1/chat/completions`` streamed) is measured alone, then while the flooding key
— in a process of its own, so that its client does not share the measuring process's interpreter — sends requests as
fast as it can from 16 connections, ignoring the retry time: at most 4 of its turns run, the rest are refused 429
(answered late once the key has been refused a few times a second). Alone and flooded alternate in windows.

Three floods, by what each of the flooding key's turns streams (its 4 turns at once: the agent carries out each
prompt ``apart``, as a real agent serves several sessions): 100 parts at 200 a second (a fast model sending each token
as it comes; the goal: the quiet key's median within 1.5 × alone); 400 parts at 1,000 a second; 2,000 parts as fast
as the pipe takes them. The last two are stress figures: there the key's allowed turns alone keep the daemon's one
event loop busy. Between windows the flooding key's last turns are waited out (a request of it admitted).

Each flood also runs, in windows of its own, against a second daemon with the same config and keys: the quiet key's
daemon then shares nothing with the flood but the machine (its cores, its scheduler, the flood's agent and client
processes). That figure is the machine's own share, the floor of any design inside one daemon (a worker process per
key included); each row reports the shared daemon against it as well as against alone.

Also ``python -m bench.team --flood URL KEY SECONDS PROMPT``: the flooding process itself.
"""

from __future__ import annotations

import argparse
import contextlib
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
FLOODS = {  # the flooding key's prompt: what each of its turns streams, and how the table names it
    "model": ("steady 100 200 apart", "parts at a fast model's pace"),
    "fast": ("steady 400 1000 apart", "1,000 parts/s"),
    "pipe": ("flood 2000 apart", "parts at pipe speed"),
}


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
    with contextlib.ExitStack() as stack:  # both daemons stopped, whatever fails
        daemon = Daemon(
            [*argv, "serve", "--config", str(config)], env=ws.env, stderr=ws.log("team"), token_file=ws.path / "token"
        )
        stack.callback(daemon.close)
        # The machine's share: the same flood on a daemon of its own (same config and keys, its own ledger).
        other_dir = ws.path / "other"
        other_dir.mkdir(mode=0o700)
        its_own = ["--keys-file", str(keys.path), "--ledger", str(other_dir / "usage.db")]
        other = Daemon(
            [*argv, "serve", "--config", str(config), *its_own],
            env=ws.env,
            stderr=ws.log("team-other"),
            token_file=other_dir / "token",
        )
        stack.callback(other.close)
        timings: dict[str, list[float]] = {"alone": [], **{kind: [] for kind in FLOODS}}
        apart: dict[str, list[float]] = {kind: [] for kind in FLOODS}  # flooded on the other daemon
        flood_counts: dict[str, list[dict[str, int]]] = {kind: [] for kind in FLOODS}
        client = HttpStreamer(daemon.http_url, quiet_key)

        def first_token() -> float:
            started = clock()
            deltas = client.chat_deltas("bench", [{"role": "user", "content": f"#{_tag()}\nsay first"}])
            next(deltas)
            took = (client.read_at - started) * 1000
            for _ in deltas:
                pass
            return took

        for _ in range(10):  # warm-up: the agent started, the paths taken
            first_token()
        window = max(5, reps // 3)
        # alone, model here, model apart, fast here, ...: each flood near a window alone and near its machine share
        windows = [("alone", None), *((kind, target) for kind in FLOODS for target in (daemon, other))]
        for rep in range(3 * len(windows)):
            kind, target = windows[rep % len(windows)]
            flood = None
            if target is not None:
                flood = subprocess.Popen(
                    [sys.executable, "-m", "bench.team", "--flood", target.http_url, flood_key, "600", FLOODS[kind][0]],
                    stdout=subprocess.PIPE,
                    env=ws.env,
                )
                time.sleep(1.0)  # its connections open and its turns start before the quiet key is timed
            try:
                (apart if target is other else timings)[kind] += [first_token() for _ in range(window)]
            finally:
                if flood is not None:
                    assert target is not None
                    flood.terminate()
                    out, _ = flood.communicate(timeout=30)
                    if target is daemon:
                        flood_counts[kind].append(json.loads(out or b"{}"))
                    _until_admitted(target.http_url, flood_key)  # its last turns over before the next window
                    for _ in range(3):  # and the quiet key's path warm again
                        first_token()
        client.close()
    alone = summarize(timings["alone"])
    rows = []
    for kind, (prompt, what) in FLOODS.items():
        flooded = summarize(timings[kind])
        share = summarize(apart[kind])
        ratio = flooded.median / alone.median if alone.median else None
        over_share = flooded.median / share.median if share.median else None
        turns = sum(count.get("200", 0) for count in flood_counts[kind])
        refused = sum(count.get("429", 0) for count in flood_counts[kind])
        rows.append(
            Row(
                f"11 one key's flood, {what}",
                "another key's first token, new conversation, /v1/chat/completions stream",
                "ms",
                flooded,
                alone,
                "the same key's, no flood",
                goal="≤ 1.5 × alone (median)" if kind == "model" else "",
                passed=(ratio is not None and ratio <= 1.5) if kind == "model" else None,
                notes=(
                    f"{len(timings[kind])} flooded / {len(timings['alone'])} alone, in alternating windows; the "
                    f"flooding key (concurrent_turns = {FLOOD_LIMIT}, {FLOOD_CONNECTIONS} connections, each turn "
                    f"{prompt!r}) had {turns} turns end and {refused} requests refused 429 meanwhile; the machine's "
                    f"share (the flood on a second daemon): median {share.median:.2f} ms, the shared daemon "
                    + (f"{over_share:.2f} × that" if over_share is not None else "not comparable")
                ),
                extra={
                    "flood": flood_counts[kind],
                    "samples": timings[kind],
                    "alone": timings["alone"],
                    "machine_share": apart[kind],
                    "over_machine_share": over_share,
                },
            )
        )
    return rows


def _until_admitted(url: str, key: str, timeout: float = 60.0) -> None:
    """Ask as ``key`` until a turn of it is admitted: its turns still running (a flood's, being cancelled) are over."""
    parts = urlsplit(url)
    body = json.dumps({"model": "bench", "messages": [{"role": "user", "content": "say settled"}]})
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    deadline = time.monotonic() + timeout
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        while True:
            connection.request("POST", "/v1/chat/completions", body=body, headers=headers)
            response = connection.getresponse()
            response.read()
            if response.status == 200:
                return
            if response.status != 429 or time.monotonic() > deadline:
                raise RuntimeError(f"the flooding key's turns did not end: {response.status}")
            time.sleep(0.05)
    finally:
        connection.close()


def _flood(url: str, key: str, seconds: float, prompt: str) -> dict[str, int]:
    """Requests as fast as ``FLOOD_CONNECTIONS`` connections take them, until ``seconds`` pass or the process is
    terminated (then the counts so far are printed)."""
    parts = urlsplit(url)
    counts: dict[str, int] = {}
    lock = threading.Lock()
    stop = time.monotonic() + seconds
    body = json.dumps({"model": "bench", "messages": [{"role": "user", "content": prompt}], "stream": True})
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
    parser.add_argument("--flood", nargs=4, metavar=("URL", "KEY", "SECONDS", "PROMPT"), required=True)
    args = parser.parse_args()
    url, key, seconds, prompt = args.flood
    _flood(url, key, float(seconds), prompt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
