"""What every benchmark shares: a scratch workspace (config files, logs, state), statistics, result rows."""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .wire import AGENT, ROOT, BridgeClient, DirectAgent, FloorClient

__all__ = [
    "RESULTS",
    "Row",
    "Summary",
    "Workspace",
    "balanced_orders",
    "children_of",
    "cpu_ms",
    "percentile",
    "rss_kib",
    "shift",
    "summarize",
    "tree_memory",
]

RESULTS = ROOT / "bench" / "results"


def balanced_orders(sides: int) -> list[list[int]]:
    """The orders in which to run ``sides`` sides of a paired benchmark, one order a round, cycled (a Williams
    design): over a full cycle each side runs at each position as often as every other, and directly after each
    other side as often. A side can leave something behind for the next (a process still exiting, caches): in a
    fixed rotation the same side always follows the same other one and carries that into the comparison. ``sides``
    orders when ``sides`` is even, twice that when it is odd and more than one."""
    if sides < 1:
        raise ValueError("at least one side")
    first = [0]
    for position in range(1, sides):  # 0, 1, n-1, 2, n-2, ...: every difference between neighbours once
        first.append((position + 1) // 2 if position % 2 else sides - position // 2)
    orders = [[(side + offset) % sides for side in first] for offset in range(sides)]
    if sides % 2 and sides > 1:
        orders += [order[::-1] for order in orders]
    return orders


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass
class Summary:
    median: float
    p99: float | None
    n: int
    min: float
    max: float

    def scaled(self, factor: float) -> Summary:
        return Summary(
            self.median * factor,
            None if self.p99 is None else self.p99 * factor,
            self.n,
            self.min * factor,
            self.max * factor,
        )


def summarize(values: Sequence[float], *, p99: bool = True) -> Summary:
    return Summary(
        statistics.median(values), percentile(values, 99) if p99 else None, len(values), min(values), max(values)
    )


def shift(bridge: Sequence[float], baseline: Sequence[float], *, resamples: int = 2000) -> tuple[float, float, float]:
    """What the bridge path adds, robustly: the Hodges-Lehmann estimate (the median of every difference between a
    bridge sample and a baseline sample) and its 90 % bootstrap interval. Unlike the difference of the two medians,
    it stays put when the samples are bimodal: Claude Code's own session start takes either ~350 or ~650 ms, at
    random, and the median of ten such samples lands in either mode, or between them."""
    import random

    def estimate(a: Sequence[float], b: Sequence[float]) -> float:
        return statistics.median([x - y for x in a for y in b])

    rng = random.Random(0)  # the same interval for the same samples
    estimates = sorted(
        estimate(rng.choices(bridge, k=len(bridge)), rng.choices(baseline, k=len(baseline))) for _ in range(resamples)
    )
    return estimate(bridge, baseline), percentile(estimates, 5), percentile(estimates, 95)


@dataclass
class Row:
    """One line of the table: a figure of the bridge path next to its baseline."""

    benchmark: str
    metric: str
    unit: str
    bridge: Summary
    baseline: Summary | None
    baseline_name: str
    goal: str = ""
    passed: bool | None = None  # None: no goal for this figure
    ratio: float | None = None  # bridge / baseline (medians) unless given
    added: dict[str, float] | None = None  # bridge minus baseline, at the median and p99
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.ratio is None and self.baseline is not None and self.baseline.median:
            self.ratio = self.bridge.median / self.baseline.median

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def options_to_set(session: dict[str, Any], options: Iterable[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The session options of an agent's ``session/new`` answer that differ from ``options``: what to set with
    ``session/set_config_option``, as lmbridge sets a config's options (only those that differ)."""
    current = {o.get("id"): o.get("currentValue") for o in session.get("configOptions") or () if isinstance(o, dict)}
    return [(key, value) for key, value in options if current.get(key) != value]


def with_bytecode_cache(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a Python subprocess that writes and uses ``.pyc`` files, as a normal installation does (this
    machine may set ``PYTHONDONTWRITEBYTECODE``, which would make every start recompile lmbridge's own modules),
    kept under ``bench/results/pycache`` so that nothing is written into the source tree. Set empty, not removed:
    it stays off when ``env`` is laid over ``os.environ`` (as ``spawn_stdio`` does), where a removed key would not."""
    env["PYTHONDONTWRITEBYTECODE"] = ""  # Python writes bytecode unless this is a non-empty string
    env["PYTHONPYCACHEPREFIX"] = str(RESULTS / "pycache")
    return env


class QuietLog:
    """A logger for lmbridge's parts run inside a benchmark's own process: quiet, but errors go to stderr."""

    def __init__(self, who: str) -> None:
        self.who = who

    def bind(self, **_: Any) -> QuietLog:
        return self

    def debug(self, *_: Any, **__: Any) -> None:
        pass

    info = warning = debug

    def error(self, event: str, **fields: Any) -> None:
        print(f"{self.who}: {event} {fields}", file=sys.stderr)

    exception = error


class Workspace:
    """A scratch directory for one run: config files, the bridge's stderr logs, XDG dirs, and a bytecode cache.

    Subprocesses get an environment like a normal installation's (``with_bytecode_cache``). The user's own
    lmbridge config and state are never read."""

    def __init__(self, keep: bool = False) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="lmbridge-bench-"))
        self.keep = keep
        self.env = with_bytecode_cache(dict(os.environ))
        self.env.pop("LMBRIDGE_CONFIG", None)
        self.env.pop("LMBRIDGE_LOG_LEVEL", None)
        self.env["XDG_CONFIG_HOME"] = str(self.path / "config")
        self.env["XDG_STATE_HOME"] = str(self.path / "state")
        pythonpath = self.env.get("PYTHONPATH")
        self.env["PYTHONPATH"] = str(ROOT) + (os.pathsep + pythonpath if pythonpath else "")
        self._logs: list[Any] = []
        self._count = 0

    def config(self, *, mcp_http: bool = False, serve: dict[str, Any] | None = None, **sessions: Any) -> Path:
        """A config file with the bench agent (``bench``; ``mcp_http``: it advertises HTTP MCP servers, so it gets
        one); ``sessions`` go to ``[sessions]``, ``serve`` to ``[serve]``."""
        self._count += 1
        path = self.path / f"config-{self._count}.toml"
        lines = [
            "[agents.bench]",
            'name = "bench agent"',
            f"command = {json.dumps(sys.executable)}",
            f"args = {json.dumps([AGENT, '--mcp-http'] if mcp_http else [AGENT])}",
            "",
            "[sessions]",
            "stop_grace = 2",
        ]
        lines += [f"{key} = {json.dumps(value)}" for key, value in sessions.items()]
        if serve:
            lines += ["", "[serve]", *(f"{key} = {json.dumps(value)}" for key, value in serve.items())]
        path.write_text("\n".join(lines) + "\n")
        return path

    def log(self, name: str) -> Any:
        handle = open(self.path / f"{name}-{len(self._logs)}.log", "wb")  # noqa: SIM115 (closed with the workspace)
        self._logs.append(handle)
        return handle

    def bridge(self, config: Path, name: str = "bridge", **kwargs: Any) -> BridgeClient:
        return BridgeClient(config, env=self.env, stderr=self.log(name), **kwargs)

    def floor(self, *, relay: bool, bare: bool = False, name: str = "floor") -> BridgeClient:
        return FloorClient(relay=relay, bare=bare, env=self.env, stderr=self.log(name))

    def direct(self, argv: list[str] | None = None, name: str = "agent") -> DirectAgent:
        return DirectAgent(argv, env=self.env, stderr=self.log(name))

    def close(self) -> None:
        for handle in self._logs:
            handle.close()
        if not self.keep:
            shutil.rmtree(self.path, ignore_errors=True)


def rss_kib(pid: int) -> int:
    """VmRSS of a process, in KiB."""
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_ms(pid: int) -> float:
    """CPU time a process has run so far, all its threads (``/proc/PID/task/*/schedstat``: nanoseconds), in ms."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(stat.read_text().split()[0])
        except (OSError, ValueError, IndexError):  # a thread that ended meanwhile
            continue
    return total / 1e6


def tree_memory(pid: int) -> tuple[int, int, int]:
    """PSS and RSS (KiB) of a process and every process under it, and how many processes that is."""
    pss = rss = count = 0
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            with open(f"/proc/{current}/smaps_rollup") as handle:
                fields = dict(line.split(":", 1) for line in handle if line[0].isupper() and ":" in line)
        except OSError:
            continue
        if "Pss" not in fields:  # a zombie (exited, not yet reaped) has no memory left to count
            continue
        pss += int(fields["Pss"].split()[0])
        rss += int(fields["Rss"].split()[0])
        count += 1
        pending += children_of(current)
    return pss, rss, count


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found
