"""``lmbridge demo`` (what ``make demo`` runs): a scripted editor through a real ``lmbridge stdio`` and the demo
agent, end to end."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trio

pytestmark = pytest.mark.wire  # lmbridge and its agents as processes: make test, not make check


async def test_the_demo_runs_its_four_turns_and_shows_what_the_agent_offers(tmp_path: Path) -> None:
    with trio.fail_after(60):
        done = await trio.run_process(
            [sys.executable, "-m", "bridge", "demo", "--log-level", "warning"],
            capture_stdout=True,
            capture_stderr=True,
            cwd=tmp_path,
            check=False,
        )
    out = done.stdout.decode()
    assert done.returncode == 0, out + done.stderr.decode()
    assert "models → demo (lmbridge demo agent)" in out
    assert "Streaming works: this sentence arrives in several chunks." in out
    assert "⏎ cancelled" in out and "Still here after the cancel: the session survived." in out
    assert "models now → demo/demo-small, demo/demo-large; slash commands → /say /stream" in out
    assert out.rstrip().endswith("done: 4 turns on one ACP session, one of them cancelled mid-stream.")
