"""The harness's worked example (docs/harness.md) with the real agents, offline: ``lmbridge test`` runs
examples/real-agent/weather.toml against Claude Code, Codex and Gemini CLI pointed at the fake model, records it,
and the recording replayed by ``lmbridge replay`` — with no model and no Node.js — gives the editor the same
output. Part of the real-agents suite: runs with ``make interop`` / ``make test`` (``-m interop`` or
``LMBRIDGE_INTEROP=1``), skipped otherwise."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import trio
from conftest import processes_with_marker
from interop.installs import InstallError, ensure_installed, npm_missing
from interop.kits import KITS, write_config

from bridge.fakemodel.server import call, open_fake_model, say

pytestmark = pytest.mark.interop

REPO = Path(__file__).resolve().parents[1]
SCENARIO = REPO / "examples" / "real-agent" / "weather.toml"


@pytest.fixture(scope="module")
def installed() -> None:
    problem = npm_missing()
    if problem:
        pytest.skip(f"INTEROP SUITE SKIPPED: {problem}")
    try:
        ensure_installed(list(KITS))
    except InstallError as exc:
        pytest.fail(f"installing the pinned agents failed:\n{exc}", pytrace=False)


async def lmbridge_test(*args: str) -> tuple[int, str]:
    with trio.fail_after(180):
        process = await trio.run_process(
            [sys.executable, "-m", "bridge", "test", *args],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            cwd=str(REPO),
        )
    return process.returncode, process.stdout.decode() + process.stderr.decode()


@pytest.mark.parametrize("agent", list(KITS))
async def test_the_worked_example_records_and_replays_offline(
    installed: None, agent: str, tmp_path: Path, marker: str
) -> None:
    kit = KITS[agent]
    script = json.loads((REPO / "examples" / "real-agent" / "weather-model.json").read_text())
    turns = [call(kit.editor_tool(t["tool"], t["arguments"])) if "tool" in t else say(t["say"]) for t in script]
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    async with open_fake_model(turns) as model:
        table = kit.agent_table(model_url=model.base_url, home=home, project=project, marker=marker)
        config = write_config(tmp_path / "agents.toml", {agent: table})
        code, out = await lmbridge_test(
            "--config",
            str(config),
            "--agent",
            agent,
            "--workspace",
            str(project),
            str(SCENARIO),
            "--record",
            str(tmp_path / "rec"),
            "--json",
            str(tmp_path / "live.json"),
        )
    assert code == 0, out
    assert model.errors == []
    assert processes_with_marker(marker) == [], "an agent process outlived lmbridge"

    transcript = tmp_path / "rec" / "weather.ndjson"
    code, out = await lmbridge_test(
        "--agent-cmd",
        f"{sys.executable} -m bridge replay {transcript}",
        str(SCENARIO),
        "--json",
        str(tmp_path / "replay.json"),
    )
    assert code == 0, out
    live, replayed = (
        json.loads((tmp_path / name).read_text())["scenarios"][0]["turns"] for name in ("live.json", "replay.json")
    )
    assert [t["editorView"] for t in replayed] == [t["editorView"] for t in live]
    assert live[0]["toolCalls"] == [{"name": "get_weather", "input": {"city": "Paris"}}]
