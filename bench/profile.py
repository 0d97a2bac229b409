"""Where the bridge's time goes: run one benchmark scenario against ``lmbridge stdio`` with py-spy attached to the
daemon, then print the hottest functions (self and inclusive time) and modules, as percentages of the samples.

    python -m bench.profile throughput|latency|tools|history [--py-spy PATH] [--rate HZ] [--save DIR] [--mcp-http]

py-spy is not a dependency of lmbridge; install it anywhere (``python -m venv /tmp/spy && /tmp/spy/bin/pip install
py-spy``) and pass ``--py-spy /tmp/spy/bin/py-spy`` or put it on PATH. The daemon is paused for each sample
(consistent stacks; ``--nonblocking`` perturbs less but yields partial stacks); idle time (waiting in epoll) is not
sampled, so percentages are of the daemon's CPU time during the scenario. For start-up time use
``python -X importtime`` instead.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = "bench"

from bench.benchmarks import _bridged_tool_timings, _history, _tag
from bench.common import Workspace
from bench.wire import ROOT, BridgeClient, assistant_message, user


def scenario_throughput(bridge: BridgeClient) -> None:
    for _ in range(3):
        bridge.count_chunks(bridge.start_chat("bench", [user(f"#{_tag()}\nflood 100000")]))


def scenario_latency(bridge: BridgeClient) -> None:
    for _ in range(3):
        for _item in bridge.text_lines(bridge.start_chat("bench", [user(f"#{_tag()}\nsteady 2000 1000")])):
            pass


def scenario_tools(bridge: BridgeClient) -> None:
    for _ in range(4):
        _bridged_tool_timings(bridge, 150)


def scenario_history(bridge: BridgeClient) -> None:
    messages = _history(9_999, _tag()) + [user("say ok")]
    parts, _ = bridge.chat("bench", messages)
    messages.append(assistant_message(parts))
    _PROFILE_HOOK["start"]()  # the seeding turn is not what we want to see
    for rep in range(15):
        messages.append(user(f"say ok {rep}"))
        parts, _ = bridge.chat("bench", messages)
        messages.append(assistant_message(parts))


SCENARIOS = {
    "throughput": scenario_throughput,
    "latency": scenario_latency,
    "tools": scenario_tools,
    "history": scenario_history,
}
_PROFILE_HOOK: dict[str, Any] = {}


def _frame(raw: str) -> tuple[str, str]:
    """py-spy's ``function (path:line)`` → (qualified function, module-ish path)."""
    name, _, where = raw.rpartition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("site-packages/", "lib/python3.11/", str(ROOT) + "/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{name} ({path})", path


# Leaf functions that are waits, not work: py-spy pauses the daemon to sample it, which hides the "sleeping" state
# it otherwise uses to drop idle samples, so they are dropped here (epoll_wait with a timeout, idle worker threads).
IDLE_LEAVES = ("EpollIOManager.get_events (", "WorkerThread._work (", "Condition.wait (", "Lock.acquire (")


def report(raw_file: Path, top: int = 25) -> str:
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    modules: collections.Counter[str] = collections.Counter()
    total = idle = 0
    for line in raw_file.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = [
            _frame(frame)
            for frame in stack.split(";")
            if frame and not frame.startswith("process ") and not frame.startswith("thread ")
        ]
        if not frames:
            continue
        if frames[-1][0].startswith(IDLE_LEAVES):
            idle += count
            continue
        total += count
        own[frames[-1][0]] += count
        modules[frames[-1][1]] += count
        for name in {frame[0] for frame in frames}:
            inclusive[name] += count
    if not total:
        return "no samples"

    def block(title: str, counter: collections.Counter[str]) -> list[str]:
        lines = [title]
        lines += [f"  {100 * value / total:5.1f}%  {name}" for name, value in counter.most_common(top)]
        return lines

    out = [f"{total} samples of the daemon's CPU time ({idle} more were waits: epoll, idle threads; not counted)"]
    out += block("self time by function:", own)
    out += block("self time by file:", modules)
    out += block("inclusive time by function:", inclusive)
    return "\n".join(out)


def _wait_traced(pid: int, spy: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """Wait until py-spy has attached: in blocking mode it ptrace-stops the daemon for each sample, which shows as
    TracerPid (the tracing thread) in /proc/PID/status; py-spy prints nothing to a pipe until it exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and spy.poll() is None:
        with open(f"/proc/{pid}/status") as handle:
            tracer = next((line.split()[1] for line in handle if line.startswith("TracerPid:")), "0")
        if tracer != "0" and os.path.exists(f"/proc/{spy.pid}/task/{tracer}"):  # one of py-spy's threads
            return
        time.sleep(0.001)  # polling an observable state
    raise RuntimeError("py-spy did not attach to the daemon (permissions? see py-spy's documentation on ptrace)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--py-spy", default=shutil.which("py-spy") or "py-spy")
    parser.add_argument("--rate", type=int, default=500, help="samples per second (default 500)")
    parser.add_argument(
        "--nonblocking",
        action="store_true",
        help="sample without pausing the daemon (less perturbation, but partial stacks)",
    )
    parser.add_argument("--save", type=Path, help="keep py-spy's raw output (collapsed stacks) in this directory")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--mcp-http",
        action="store_true",
        help="the bench agent takes HTTP MCP servers (tools: over HTTP, not the relay)",
    )
    args = parser.parse_args(argv)

    workspace = Workspace()
    window = {"tool_batch_window": 1e-6} if args.scenario == "tools" else {}
    bridge = workspace.bridge(workspace.config(mcp_http=args.mcp_http, max_sessions=5000, **window))
    out_dir = args.save or workspace.path
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = out_dir / f"{args.scenario}.collapsed.txt"
    spy: subprocess.Popen[bytes] | None = None

    def start() -> None:
        nonlocal spy
        if spy is None:
            spy = subprocess.Popen(
                [
                    args.py_spy,
                    "record",
                    "--pid",
                    str(bridge.pid),
                    "--rate",
                    str(args.rate),
                    *(["--nonblocking"] if args.nonblocking else []),
                    "--format",
                    "raw",
                    "--output",
                    str(raw),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            if not args.nonblocking:
                _wait_traced(bridge.pid, spy)

    _PROFILE_HOOK["start"] = start
    try:
        bridge.initialize()
        bridge.chat("bench", [user(f"#{_tag()}\nplan")])  # starts the agent, imports the ACP schema
        if args.scenario == "tools":
            _bridged_tool_timings(bridge, 2)
        if args.scenario != "history":
            start()
        SCENARIOS[args.scenario](bridge)
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            _out, err = spy.communicate(timeout=60)
            if spy.returncode not in (0, -signal.SIGINT) and not raw.exists():
                print(err.decode(errors="replace"), file=sys.stderr)
        bridge.close()
        text = report(raw, args.top) if raw.exists() else "py-spy wrote no samples"
        if args.save is None:
            workspace.close()
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
