"""``lmbridge conform --model fake`` against the four pinned agents: the kit points each at lmbridge's fake model
by its recipe and judges every requirement. What it finds in each is listed here, each finding checked by hand
against the spec (docs/conformance.md, "Found so far"); anything else it reports is either a new defect of the
agent or a false positive of the kit, and fails this test either way."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bridge.conform.agent import AgentSpec
from bridge.conform.checks import MODEL_DRIVERS, Settings
from bridge.conform.kit import run_kit
from bridge.conform.requirements import REQUIREMENTS, Status

from .installs import PINS, Installed
from .kits import AgentKit

pytestmark = pytest.mark.interop

_ARGS = {"claude": (), "codex": (), "gemini": ("--acp",), "opencode": ("acp",)}
FINDINGS = {
    "claude": set[str](),
    # An unknown extension notification answered with an error without an id; still running 5 s after stdin closed.
    "codex": {"LMB-RPC-003", "LMB-EXT-003", "LMB-SHUT-001"},
    # session/load in a fresh process: its start rewrites the session file without the history, then fails.
    "gemini": {"LMB-SESS-006"},
    "opencode": set[str](),
}
# Passed by every agent: the model-driven requirements, so the fake model really drove each one.
ALWAYS = {
    *("LMB-PROMPT-001", "LMB-PROMPT-002", "LMB-PROMPT-003", "LMB-CANCEL-001", "LMB-CANCEL-002", "LMB-CAP-001"),
    *("LMB-MCP-001", "LMB-MCP-002", "LMB-MCP-003", "LMB-TOOL-001", "LMB-PERM-001", "LMB-PERM-002", "LMB-PERM-003"),
    "LMB-MCP-004",  # all four advertise HTTP MCP
    *("LMB-CONTENT-001", "LMB-CONTENT-002", "LMB-CONTENT-004", "LMB-CONTENT-005"),  # all four take images, resources
    "LMB-CANCEL-005",  # all four run commands themselves, and stop them when the turn is cancelled
}
# The agents that advertise logout: it succeeds, and a new session opens after it (their key is in the environment).
LOGGING_OUT = {"claude", "codex"}


async def test_the_kit_judges_the_agent_against_the_fake_model(
    agent: str, kit: AgentKit, installed: dict[str, Installed], tmp_path: Path
) -> None:
    env = dict(os.environ)
    node = PINS[agent].node
    if node is not None:  # a `#!/usr/bin/env node` launcher: the pinned node first on PATH
        env["PATH"] = f"{PINS[node].executable.parent}{os.pathsep}{env.get('PATH', '')}"
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    spec = AgentSpec((str(kit.executable), *_ARGS[agent]), env)
    # --logout: with the fake model the kit runs the agent from a private HOME it removes afterwards.
    settings = Settings(spec, timeout=60, model=MODEL_DRIVERS["fake"], workspace=workspace, logout=True)
    result = await run_kit(settings, list(REQUIREMENTS))
    found = {rid for rid, outcome in result.outcomes.items() if outcome.status in (Status.FAIL, Status.NOT_TESTED)}
    assert found == FINDINGS[agent], {rid: result.outcomes[rid].detail for rid in found ^ FINDINGS[agent]}
    passed = {rid for rid, outcome in result.outcomes.items() if outcome.status is Status.PASS}
    assert passed >= ALWAYS
    assert ({"LMB-AUTH-001", "LMB-AUTH-002"} <= passed) == (agent in LOGGING_OUT)
