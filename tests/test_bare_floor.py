"""bench/bare_floor.py, the floor of the real agents' benchmark: a bridge that shares no code with lmbridge.

What it measures is only a floor if it is one: it imports nothing but the standard library, and it carries an
agent's conversation as lmbridge would (the agent started as the launch file says, the editor's tools offered over
the transport lmbridge would choose, each MCP call relayed to the editor and its result back, the agent stopped with
its process group). The figures themselves live in docs/performance.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from bench.benchmarks import _bridged_tool_timings
from bench.mcp_server import ECHO_TOOL
from bench.wire import FloorClient

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
SIBLINGS = {"bare_floor", "bare_shim", "agent", "mcp_server"}  # bench's standard-library-only programs


def test_the_bare_floor_and_its_shim_import_the_standard_library_alone() -> None:
    # No site-packages at all (-I -S): an import of lmbridge or of a third-party package would fail here.
    probe = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import bare_floor, bare_shim; "
        "print(json.dumps(sorted({name.partition('.')[0] for name in sys.modules})))"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", probe, str(BENCH)], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = set(json.loads(done.stdout))
    assert {"bare_floor", "bare_shim", "http"} <= loaded  # the probe did load them
    assert loaded - SIBLINGS <= set(sys.stdlib_module_names) | {"__main__"}, loaded - set(sys.stdlib_module_names)


def _agent_processes(marker: str) -> list[int]:
    """The processes whose environment holds ``marker`` (the launch file's ``env`` reached the agent)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:  # gone, or not ours
                pass
    return found


@pytest.mark.wire
@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_the_bare_floor_relays_an_agents_tool_calls_over_the_transport_lmbridge_would_choose(
    tmp_path: Path, transport: str
) -> None:
    """``--launch`` with ``transport = "auto"``: HTTP for an agent that advertises it, else the stdio relay (the
    agent starts ``bench/bare_shim.py``). Prestarted: "agent ready" once it answered ``initialize``. With
    ``BARE_FLOOR_TRACE_DIR``, every message of its three links is traced as lmbridge's ``--trace-dir`` traces."""
    marker = f"BARE_FLOOR_TEST_{uuid.uuid4().hex}"
    agent = [sys.executable, str(BENCH / "agent.py"), *(["--mcp-http"] if transport == "http" else [])]
    launch = tmp_path / "launch.json"
    launch.write_text(json.dumps({"argv": agent, "env": {marker: "1"}, "transport": "auto", "prestart": True}))
    stderr_path = tmp_path / "floor.stderr"
    traces = tmp_path / "traces"
    traces.mkdir()
    with open(stderr_path, "wb") as stderr:
        env = {**os.environ, "BARE_FLOOR_TRACE_DIR": str(traces)}
        floor = FloorClient(relay=False, launch=launch, stderr=stderr, env=env)
    try:
        info = floor.initialize()
        deadline = time.monotonic() + 60
        while "agent ready" not in stderr_path.read_text():
            assert time.monotonic() < deadline, stderr_path.read_text()
            time.sleep(0.02)
        assert _agent_processes(marker), "the launch file's environment did not reach the agent"
        tools = [ECHO_TOOL, info["permissionTool"]]
        # Two conversations, each a session of its own with its MCP server: three calls each (a warm-up and two
        # timed), every one relayed to this editor as a tool_call part and its result back to the agent.
        for _conversation in range(2):
            timings = _bridged_tool_timings(floor, 2, tools=tools)
            assert len(timings) == 2 and all(ms > 0 for ms in timings), timings
    finally:
        code = floor.close()
    assert code == 0, stderr_path.read_text()
    assert _agent_processes(marker) == [], "the agent outlived the floor"
    traced: dict[tuple[str, str], list[Any]] = {}
    for path in traces.iterdir():
        assert path.stat().st_mode & 0o777 == 0o600, path
        for line in path.read_text().splitlines():
            record = json.loads(line)
            assert isinstance(record["ts"], float), record
            traced.setdefault((record["conn"], record["dir"]), []).append(record["msg"].get("method"))
    assert traced[("editor", "in")].count("lm/chat") == 8  # two conversations: a prompt and three results each
    assert traced[("agent", "out")].count("session/prompt") == 2
    assert traced[("mcp", "in")].count("tools/call") == 6
    assert len(traced[("mcp", "out")]) == len([m for m in traced[("mcp", "in")] if m != "notifications/initialized"])
