"""Fixtures and reporting for the real-agent interop suite.

Owns: opting in (the suite runs only with ``-m interop`` or ``LMBRIDGE_INTEROP=1``: it installs ~600 MB of agents
and is run by ``make interop``, not ``make test``), installing the pinned agents once per session (skipping the
whole suite loudly when npm is missing), one fake model server and one ``lmbridge stdio`` per test with the agent
configured in lmbridge's config file, the check that no agent process outlives the bridge, and the one-line-per-
scenario report printed at the end of the run.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import processes_with_marker
from fakes import ScriptedEditorModel, user

from bridge.editor.client import ChatResult, ChatTurn, EditorClient, spawn_stdio
from bridge.fakemodel.server import FakeModel, open_fake_model

from .editor_served import ForwardingEditorModel
from .installs import PINS, Installed, InstallError, ensure_installed, npm_missing
from .kits import FOREIGN_ENV, KITS, AgentKit, write_config

FIRST_TURN_TIMEOUT = 60  # seconds: includes the agent's cold start (Gemini CLI takes ~5 s on an idle machine)
TURN_TIMEOUT = 30

# -- opting in -----------------------------------------------------------------------------------------------------


def _opted_in(config: pytest.Config) -> bool:
    markexpr = config.getoption("markexpr") or ""
    return os.environ.get("LMBRIDGE_INTEROP") == "1" or ("interop" in markexpr and "not interop" not in markexpr)


@pytest.hookimpl(trylast=True)  # after -k/-m deselection: only what runs is installed and reported
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    opted_in = _opted_in(config)
    skip = pytest.mark.skip(reason="real-agent interop suite: run `make interop` (or pytest -m interop)")
    for item in items:
        if item.get_closest_marker("interop") is None:
            continue
        if not opted_in:
            item.add_marker(skip)
            continue
        agent = getattr(item, "callspec", None) and item.callspec.params.get("agent")
        if agent:
            _REPORT.rows[item.nodeid] = _Row(agent, item.originalname.removeprefix("test_"))


# -- installs ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def installed() -> dict[str, Installed]:
    problem = npm_missing()
    if problem:
        _REPORT.skipped_all = problem
        pytest.skip(f"INTEROP SUITE SKIPPED: {problem}")
    needed = sorted({row.agent for row in _REPORT.rows.values()} or PINS)
    begun = time.monotonic()
    try:
        result = ensure_installed(needed)
    except InstallError as exc:
        pytest.fail(f"installing the pinned agents failed:\n{exc}", pytrace=False)
    _REPORT.installs = result
    _REPORT.install_seconds = time.monotonic() - begun
    return result


# -- one live bridge per test --------------------------------------------------------------------------------------


@pytest.fixture(params=list(KITS))
def agent(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def kit(agent: str) -> AgentKit:
    return KITS[agent]


@pytest.fixture(autouse=True)
def _no_foreign_model_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if FOREIGN_ENV.match(name):
            monkeypatch.delenv(name)


@pytest.fixture
async def model() -> AsyncIterator[FakeModel]:
    async with open_fake_model() as server:
        yield server
    assert server.errors == [], "the agent made model requests the test did not script"


@dataclass
class LiveBridge:
    """``lmbridge stdio`` with one real agent configured, initialized like an editor, next to its fake model."""

    kit: AgentKit
    model: FakeModel
    client: EditorClient
    process: trio.Process
    project: Path  # the workspace folder: the ACP session's cwd
    stderr_path: Path
    trace_dir: Path
    permission_tool: dict[str, Any]
    turns: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    @property
    def agent_pids(self) -> list[int]:
        """The agent processes lmbridge started (each leads its own process group)."""
        return [int(pid) for pid in re.findall(r"agent process started .*?pid=(\d+)", self.stderr)]

    async def start(
        self, *messages: dict[str, Any] | str, tools: list[dict[str, Any]] = (), **options: Any
    ) -> ChatTurn:
        """Send the conversation so far plus ``messages`` as one ``lm/chat`` (``options``: more of its options)."""
        self.history += [user(m) if isinstance(m, str) else m for m in messages]
        return await self.client.start_chat(self.kit.id, list(self.history), tools=tools, **options)

    async def finish(self, turn: ChatTurn, timeout: float | None = None) -> ChatResult:
        """The turn's result (bounded), added to the history as the editor would."""
        with trio.fail_after(timeout or (FIRST_TURN_TIMEOUT if self.turns == 0 else TURN_TIMEOUT)):
            result = await turn.result()
        self.turns += 1
        self.history.append(result.assistant_message())
        return result

    async def chat(
        self, *messages: dict[str, Any] | str, tools: list[dict[str, Any]] = (), **options: Any
    ) -> ChatResult:
        return await self.finish(await self.start(*messages, tools=tools, **options))

    def evidence(self) -> str:
        """What to read when a scenario fails: the bridge's log tail and where the wire traces are."""
        return f"\n--- lmbridge stderr (tail) ---\n{self.stderr[-6000:]}\n--- traces: {self.trace_dir}"


@pytest.fixture
def mcp_transport() -> str:
    """How the editor's tools reach the agent (``[agents.<id>] mcp_transport``; ``auto``, lmbridge's default, is what
    the kit's ``mcp_over`` says); a test may parametrize it."""
    return "auto"


@pytest.fixture
def prestart() -> bool:
    """``[agents.<id>] prestart``; a test may parametrize it."""
    return False


@pytest.fixture
def sessions() -> dict[str, Any]:
    """lmbridge's ``[sessions]`` table (none: its defaults); a test may parametrize it."""
    return {}


@pytest.fixture
def editor_model(request: pytest.FixtureRequest) -> ScriptedEditorModel | None:
    """A model the test editor shares (``initialize.editorModels``) and answers for: none unless a test parametrizes
    it (indirectly) with the model's id."""
    model_id = getattr(request, "param", None)
    return ScriptedEditorModel(model_id) if model_id else None


@pytest.fixture
def model_source() -> str:
    """``[agents.<id>] model_source``: "" (the agent's own model, pointed at the fake model), or "editor" — the
    agent thinks with a model the test editor shares, which passes each request on to the fake model
    (``editor_served``); a test may parametrize it."""
    return ""


@pytest.fixture
def via_editor(model_source: str, model: FakeModel) -> ForwardingEditorModel | None:
    """The editor's model the agent thinks with, when ``model_source`` is "editor"."""
    return ForwardingEditorModel(model.base_url) if model_source == "editor" else None


@pytest.fixture
async def live(
    installed: dict[str, Installed],
    kit: AgentKit,
    model: FakeModel,
    tmp_path: Path,
    marker: str,
    mcp_transport: str,
    prestart: bool,
    sessions: dict[str, Any],
    editor_model: ScriptedEditorModel | None,
    via_editor: ForwardingEditorModel | None,
) -> AsyncIterator[LiveBridge]:
    home, project, traces = tmp_path / "home", tmp_path / "project", tmp_path / "traces"
    home.mkdir()
    project.mkdir()
    table = kit.agent_table(model_url=model.base_url, home=home, project=project, marker=marker)
    if mcp_transport != "auto":
        table["mcp_transport"] = mcp_transport
    if prestart:
        table["prestart"] = True
    if via_editor is not None:
        table["model_source"] = f"editor:{via_editor.models[0]['id']}"
    config = write_config(tmp_path / "lmbridge.toml", {kit.id: table}, **({"sessions": sessions} if sessions else {}))
    stderr_path = tmp_path / "lmbridge.stderr"
    with open(stderr_path, "wb") as stderr:
        async with spawn_stdio(
            ["--config", str(config), "--log-level", "debug", "--trace-dir", str(traces)], stderr=stderr
        ) as (client, process):
            shared: dict[str, Any] = {}
            for shares in (editor_model, via_editor):
                if shares is not None:
                    client.serve_models(shares.answer)
                    shared["editorModels"] = shares.models
            with trio.fail_after(30):
                info = await client.initialize(workspaceFolders=[str(project)], **shared)
            bridge = LiveBridge(kit, model, client, process, project, stderr_path, traces, info["permissionTool"])
            yield bridge
    assert process.returncode == 0, f"lmbridge exited {process.returncode}" + bridge.evidence()
    assert processes_with_marker(marker) == [], "an agent process outlived lmbridge" + bridge.evidence()
    assert client.stray_parts == []


# -- the report ----------------------------------------------------------------------------------------------------


@dataclass
class _Row:
    agent: str
    scenario: str
    outcome: str = ""
    seconds: float = 0.0


@dataclass
class _Report:
    rows: dict[str, _Row] = field(default_factory=dict)
    installs: dict[str, Installed] = field(default_factory=dict)
    install_seconds: float = 0.0
    skipped_all: str | None = None
    started: float = field(default_factory=time.monotonic)


_REPORT = _Report()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    row = _REPORT.rows.get(report.nodeid)
    if row is None:
        return
    row.seconds += report.duration
    xfail = hasattr(report, "wasxfail")
    if report.when == "call":
        if report.passed:
            row.outcome = "XPASS" if xfail else "PASS"
        elif report.skipped:
            row.outcome = "XFAIL" if xfail else "SKIP"
        else:
            row.outcome = "FAIL"
    elif report.skipped:
        row.outcome = "SKIP"
    elif report.failed:
        row.outcome = "ERROR" if report.when == "setup" or row.outcome in ("", "PASS") else row.outcome + "+ERROR"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    write = terminalreporter.write_line
    if _REPORT.skipped_all:
        write(f"interop  SUITE SKIPPED: {_REPORT.skipped_all}", red=True, bold=True)
        return
    rows = [row for row in _REPORT.rows.values() if row.outcome]
    if not rows:
        return
    terminalreporter.section("interop: real agents through lmbridge")
    width = max(len(row.scenario) for row in rows)
    for agent, installed in sorted(_REPORT.installs.items()):
        how = "cached" if installed.cached else f"installed in {installed.seconds:.1f}s"
        write(f"interop  {agent:<7} {'install':<{width}} {installed.pin.spec}  {how}")
    for row in sorted(rows, key=lambda r: (list(KITS).index(r.agent), r.scenario)):
        colour = {"PASS": "green", "XFAIL": "yellow", "XPASS": "yellow", "SKIP": "yellow"}.get(row.outcome, "red")
        write(f"interop  {row.agent:<7} {row.scenario:<{width}} {row.outcome:<6} {row.seconds:5.1f}s", **{colour: True})
    write(
        f"interop  total: {len(rows)} scenarios, installs {_REPORT.install_seconds:.1f}s, "
        f"wall {time.monotonic() - _REPORT.started:.1f}s"
    )
