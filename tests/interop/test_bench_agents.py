"""`make bench-agents` keeps working: one paired run with one real agent (the figures live in docs/performance.md)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench.agents import LATER_CITIES

from .installs import Installed

pytestmark = pytest.mark.interop

ROOT = Path(__file__).resolve().parents[2]


def test_the_real_agent_benchmark_runs(installed: dict[str, Installed], tmp_path: Path) -> None:
    output = tmp_path / "agents.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.agents", "--reps", "1", "--agents", "codex", "--output", str(output)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(output.read_text())
    assert report["errors"] == {}
    # The verdicts against an MCP server that shares no code with lmbridge (stdio), and the same figures against
    # lmbridge's own MCP code serving the direct side (the default's second baseline).
    figures = {row["metric"]: row for row in report["rows"] if row["benchmark"] == "codex"}
    same = {row["metric"]: row for row in report["rows"] if row["benchmark"] == "codex (same)"}
    assert (
        set(figures)
        == set(same)
        == {"cold first chat", "prestart chat", "text turn", "first tool turn", "later tool turn"}
    )
    assert all("independent stdio MCP server" in row["baseline_name"] for row in figures.values())
    assert all(
        row["bridge"] == same[name]["bridge"] and row["baseline"] != same[name]["baseline"]
        for name, row in figures.items()
    )
    assert all(row["bridge"]["median"] > 0 and row["baseline"]["median"] > 0 for row in figures.values())
    assert all(set(row["extra"]["samples"]) == {"lmbridge", "direct"} for row in figures.values())
    # Both sides run the agent alike: its requests to the model are the same size (within 1 %: paths differ).
    sizes = figures["cold first chat"]["extra"]["model_request_bytes"]
    assert sizes["direct"] > 1000 and abs(sizes["lmbridge"] - sizes["direct"]) <= 0.01 * sizes["direct"], sizes
    assert "NOT ALIKE" not in json.dumps(report["rows"])
    # lmbridge's own time, read off its traces in the two traced runs: for every figure but the cold start, each of
    # its turns (five later tool turns a run) a positive, finite time (how it compares with the figure is measured,
    # not judged: a busy machine stretches either).
    turns = {"later tool turn": 2 * len(LATER_CITIES)}
    for name, row in figures.items():
        own = row["extra"]["own_ms"]
        if name == "cold first chat":
            assert own == []
        else:
            assert len(own) == turns.get(name, 2) and all(0 < ms < math.inf for ms in own), (name, own)
    # The editor's own hop, read off the same traces: in each tool turn (one tool call answered), in no other figure.
    for name, row in figures.items():
        editor = row["extra"]["editor_ms"]
        if "tool turn" in name:
            assert len(editor) == turns.get(name, 2), (name, editor)
            assert all(0 < ms < math.inf for ms in editor), (name, editor)
        else:
            assert editor == ([] if name == "cold first chat" else [0.0, 0.0]), (name, editor)


def test_the_floor_of_a_real_agents_turns_runs(installed: dict[str, Installed], tmp_path: Path) -> None:
    """``--floor bare,parts``: two more sides in each round, the chats through bench/bare_floor.py (the standard
    library alone) and bench/tool_floor.py (lmbridge's transports alone) in lmbridge's place. Gemini CLI asks
    permission for each of its MCP calls: the floors allow them."""
    output = tmp_path / "floor.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.agents",
            "--reps",
            "1",
            "--agents",
            "gemini",
            "--floor",
            "bare,parts",
            "--baselines",
            "stdio,http",
            "--output",
            str(output),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(output.read_text())
    assert report["errors"] == {}
    lmbridge = {row["metric"] for row in report["rows"] if row["benchmark"] == "gemini"}
    # The second baseline asked for: the SDK's own server over streamable HTTP, started once for the run.
    http = {row["metric"] for row in report["rows"] if row["benchmark"] == "gemini (http)"}
    assert http == lmbridge
    assert lmbridge == {"cold first chat", "prestart chat", "text turn", "first tool turn", "later tool turn"}
    for kind, figures in (("bare", lmbridge), ("parts", lmbridge - {"cold first chat"})):
        floor = {row["metric"]: row for row in report["rows"] if row["benchmark"] == f"gemini {kind} floor"}
        assert set(floor) == figures, kind
        for row in floor.values():
            assert row["bridge"]["median"] > 0 and row["baseline"]["median"] > 0
            assert set(row["extra"]["samples"]) == {"floor", "direct"}
            assert set(row["extra"]["lmbridge_above_floor"]) == {"estimate", "low", "high"}
        # The bridge's CPU per later tool turn, each side's (the low-noise part of the figure: docs/performance.md).
        cpu = floor["later tool turn"]["extra"]["bridge_cpu_ms"]
        assert all(len(cpu[side]) == 1 and cpu[side][0] > 0 for side in ("lmbridge", "floor")), cpu
        assert "the bridge's CPU per later tool turn" in floor["later tool turn"]["notes"]
        # The agent runs alike through the floor: the same tools and prompts reach its model (and a tool turn that
        # did not reach the editor's tool fails the run: bench.agents checks it).
        sizes = floor["text turn"]["extra"]["model_request_bytes"]
        assert sizes["direct"] > 1000 and abs(sizes["floor"] - sizes["direct"]) <= 0.01 * sizes["direct"], sizes
    assert "NOT ALIKE" not in json.dumps(report["rows"])
