"""The benchmark suite runs (its quick mode): the numbers themselves live in docs/performance.md, not in tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_quick_benchmark_run_completes(tmp_path: Path) -> None:
    output = tmp_path / "quick.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--output", str(output)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(output.read_text())
    assert not report["errors"]
    assert "throughput" in done.stdout.lower()
