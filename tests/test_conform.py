"""``lmbridge conform``: the kit finds each defect of the deliberately broken test agent (tests/conform_agent.py)
and nothing else, passes the conformant agents (that agent as written, the demo agent), and its command line and
reports work through a real subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
import trio
from conftest import HANG

from bridge.acp.spawn import agent_environment
from bridge.config import demo_agent
from bridge.conform.agent import AgentSpec
from bridge.conform.checks import MODEL_DRIVERS, GroupRun, Settings
from bridge.conform.kit import KitResult, run_kit, select
from bridge.conform.requirements import BY_ID, REQUIREMENTS, Status, Tier
from bridge.conform.terminals import ClientTerminals, keep_last
from tests.conform_agent import DEFECTS

AGENT = str(Path(__file__).with_name("conform_agent.py"))
# How long the kit waits for an answer a hang defect never gives; the test agent answers everything else at once.
HANG_WAIT = 5

wire = pytest.mark.wire  # agents as processes: make test; make check runs the smoke ones


def _settings(
    tmp_path: Path, *argv: str, model: str | None = "directives", env: dict[str, str] | None = None
) -> Settings:
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    spec = AgentSpec((sys.executable, AGENT, *argv), {**os.environ, "CONFORM_AGENT_STATE": str(state)})
    workspace = tmp_path / "workspace"
    workspace.mkdir(exist_ok=True)
    # --logout: the test agent's login is its own process's, nobody's on this machine.
    return Settings(spec, timeout=30, model=MODEL_DRIVERS.get(model or ""), workspace=workspace, logout=True)


def _sent(run: GroupRun) -> list[dict[str, Any]]:
    """What the kit sent the agent in one group."""
    return [
        line.message
        for transcript in run.transcripts.values()
        for line in transcript
        if line.dir == "out" and isinstance(line.message, dict)
    ]


def _with(result: KitResult, *statuses: Status) -> set[str]:
    return {rid for rid, outcome in result.outcomes.items() if outcome.status in statuses}


@wire
@pytest.mark.smoke
async def test_the_conformant_test_agent_passes_everything_that_applies(tmp_path: Path) -> None:
    result = await run_kit(_settings(tmp_path), list(REQUIREMENTS))
    assert _with(result, Status.FAIL, Status.NOT_TESTED) == set(), {
        rid: o.detail for rid, o in result.outcomes.items() if o.status in (Status.FAIL, Status.NOT_TESTED)
    }
    # It advertises everything but additionalDirectories: that one is skipped, and says why; what reached its model
    # is not visible with the directives (no model of the kit's); it runs commands in the client's terminals, so
    # what a cancel does to a command it runs itself is not seen.
    assert _with(result, Status.SKIPPED) == {"LMB-SESS-005", "LMB-CONTENT-005", "LMB-CANCEL-005"}
    assert "not advertised" in result.outcomes["LMB-SESS-005"].detail
    assert "client terminal" in result.outcomes["LMB-CANCEL-005"].detail
    assert result.verdict().conformant
    workspace = tmp_path / "workspace"
    assert not list(workspace.glob("conform-*")), "what the checks' commands made is left"
    assert not list(workspace.glob(".conform-*")), "the MCP probe's log is left"


@wire
@pytest.mark.parametrize("defect", sorted(DEFECTS))
async def test_each_defect_is_found_and_nothing_else(tmp_path: Path, defect: str) -> None:
    settings = _settings(tmp_path, "--defect", defect)
    if defect.startswith("hangs-"):
        # The answer that never comes is waited for once; every other request of the whole run may take as long (the
        # test agent answers at once, but a loaded machine may start its processes slowly).
        settings.timeout = 3 * HANG_WAIT
    result = await run_kit(settings, list(REQUIREMENTS))
    failing = _with(result, Status.FAIL, Status.NOT_TESTED)
    assert failing == DEFECTS[defect], {rid: result.outcomes[rid].detail for rid in failing}
    for rid in failing:
        assert result.outcomes[rid].detail, rid  # every failure says what was expected and what came
    held = {rid for rid in failing if BY_ID[rid].tier in (Tier.MANDATORY, Tier.CAPABILITY)}
    assert result.verdict().conformant == (not held)


@wire
@pytest.mark.parametrize("flags", [(), ("--relative-paths",), ("--prompt-in-argv",)])
async def test_a_command_the_agent_runs_itself_is_judged_by_its_processes(
    tmp_path: Path, flags: tuple[str, ...]
) -> None:
    """With --own-shell the test agent runs commands itself: a cancel must leave no process of the command (found
    by the file's name on its command line, however the path is spelt there; a process that only carries the
    prompt is not the command), and the client-terminal requirements do not apply."""
    wanted = [r for r in REQUIREMENTS if r.id in ("LMB-TERM-004", "LMB-CANCEL-005")]
    result = await run_kit(_settings(tmp_path, "--own-shell", *flags), wanted)
    assert result.outcomes["LMB-CANCEL-005"].status is Status.PASS, result.outcomes["LMB-CANCEL-005"].detail
    assert result.outcomes["LMB-TERM-004"].status is Status.SKIPPED
    assert "process of the agent's own" in result.outcomes["LMB-TERM-004"].detail


@wire
async def test_what_the_agent_leaves_of_the_cancelled_command_is_killed_by_the_kit(tmp_path: Path) -> None:
    """The test agent with detaches-own-command leaves the command running in a session of its own, which the
    agent's process group does not take with it: the kit kills it, and says so."""
    from bridge.conform.checks import _processes_with

    wanted = [r for r in REQUIREMENTS if r.id in ("LMB-TERM-004", "LMB-CANCEL-005")]
    workspace = str(tmp_path / "workspace")  # (on the command's command line)
    try:
        result = await run_kit(_settings(tmp_path, "--defect", "detaches-own-command"), wanted)
        outcome = result.outcomes["LMB-CANCEL-005"]
        assert outcome.status is Status.FAIL and "the kit then killed" in outcome.detail, outcome.detail
        with trio.fail_after(HANG):  # (a process signalled is gone once it has exited)
            while _processes_with(workspace):
                await trio.sleep(0.05)
    finally:
        for process in _processes_with(workspace):  # what a failure above left running
            os.kill(process.pid, signal.SIGKILL)


@wire
async def test_a_mode_change_never_answered_fails_mode_002_and_the_rest_of_the_group_is_judged(tmp_path: Path) -> None:
    settings = _settings(tmp_path, "--defect", "hangs-on-mode-change")
    settings.timeout = HANG_WAIT
    result = await run_kit(settings, [r for r in REQUIREMENTS if r.group == "sessions"])
    outcome = result.outcomes["LMB-MODE-002"]
    assert outcome.status is Status.FAIL, outcome.detail
    assert "an answer to session/set_mode to 'code'" in outcome.detail and "no answer within 5 s" in outcome.detail
    later = {"LMB-CONFIG-001", "LMB-CONFIG-002", "LMB-SESS-002", "LMB-EXT-004", "LMB-SESS-004", "LMB-SESS-003"}
    assert later <= _with(result, Status.PASS), {rid: result.outcomes[rid].detail for rid in later}


@wire
@pytest.mark.parametrize(
    ("defect", "failed", "not_tried", "later"),
    [
        ("hangs-on-set-mode", "LMB-MODE-001", "LMB-MODE-002", {"LMB-CONFIG-001", "LMB-CONFIG-002", "LMB-SESS-002"}),
        ("hangs-on-set-config", "LMB-CONFIG-001", "LMB-CONFIG-002", {"LMB-SESS-002", "LMB-EXT-004", "LMB-SESS-004"}),
    ],
)
async def test_a_set_to_the_current_value_never_answered_fails_that_requirement_alone(
    tmp_path: Path, defect: str, failed: str, not_tried: str, later: set[str]
) -> None:
    """MODE-001's or CONFIG-001's own request hangs: that requirement fails, the switch that would follow it is not
    tried (NOT_TESTED, saying why), and the group's other requirements are still judged."""
    settings = _settings(tmp_path, "--defect", defect)
    settings.timeout = HANG_WAIT
    result = await run_kit(settings, [r for r in REQUIREMENTS if r.group == "sessions"])
    outcome = result.outcomes[failed]
    assert outcome.status is Status.FAIL and f"no answer within {HANG_WAIT} s" in outcome.detail, outcome.detail
    untried = result.outcomes[not_tried]
    assert untried.status is Status.NOT_TESTED and "went unanswered" in untried.detail, untried.detail
    assert later <= _with(result, Status.PASS), {rid: result.outcomes[rid].detail for rid in later}


@wire
async def test_an_agent_that_answers_nothing_after_an_unanswered_request_ends_the_group_at_once(
    tmp_path: Path,
) -> None:
    """--freezes-on-set-mode: from its first session/set_mode on the test agent answers no request. MODE-001 fails;
    the kit's next request goes unanswered too, so the rest of the group is NOT_TESTED, saying why, instead of each
    requirement waiting the timeout in turn."""
    settings = _settings(tmp_path, "--freezes-on-set-mode")
    settings.timeout = HANG_WAIT
    result = await run_kit(settings, [r for r in REQUIREMENTS if r.group == "sessions"])
    assert result.outcomes["LMB-MODE-001"].status is Status.FAIL, result.outcomes["LMB-MODE-001"].detail
    for rid in ("LMB-CONFIG-001", "LMB-CONFIG-002"):
        outcome = result.outcomes[rid]
        assert outcome.status is Status.NOT_TESTED, (rid, outcome.detail)
        assert "the next request was not answered" in outcome.detail, outcome.detail  # (not waited for again)


@wire
async def test_mode_002_judges_the_mode_updates_sent_after_the_set_back(tmp_path: Path) -> None:
    """With --reports-first-mode-change the test agent reports the change to another mode, and not the change back
    (the spec requires no report): nothing came after the set-back request, and that passes."""
    result = await run_kit(_settings(tmp_path, "--reports-first-mode-change"), select(["MODE"], None))
    outcome = result.outcomes["LMB-MODE-002"]
    assert outcome.status is Status.PASS, outcome.detail
    assert "after the set-back, no current_mode_update" in outcome.detail


@wire
@pytest.mark.parametrize(
    ("defect", "method", "key", "values"),
    [
        ("refuses-other-modes", "session/set_mode", "modeId", ["ask", "code", "ask"]),
        ("config-keeps-value", "session/set_config_option", "value", ["small", "large", "small"]),
    ],
)
async def test_a_change_of_mode_or_option_that_failed_is_undone(
    tmp_path: Path, defect: str, method: str, key: str, values: list[str]
) -> None:
    """Set to its current value (MODE-001, CONFIG-001), then to another, which fails: the kit sets it back to the
    value it had (the set-back of MODE-002, CONFIG-002 was never sent)."""
    result = await run_kit(_settings(tmp_path, "--defect", defect), select(["MODE", "CONFIG"], None))
    sent = [m["params"][key] for m in _sent(result.groups["sessions"]) if m.get("method") == method]
    assert sent == values


@wire
async def test_the_demo_agent_is_conformant(tmp_path: Path) -> None:
    config = demo_agent()
    env = {**agent_environment(config), "LMBRIDGE_DEMO_STATE_DIR": str(tmp_path / "state")}
    settings = Settings(AgentSpec(tuple(config.argv), env), model=MODEL_DRIVERS["directives"], workspace=tmp_path)
    result = await run_kit(settings, list(REQUIREMENTS))
    assert _with(result, Status.FAIL, Status.NOT_TESTED) == set(), {
        rid: o.detail for rid, o in result.outcomes.items() if o.status in (Status.FAIL, Status.NOT_TESTED)
    }
    assert {"LMB-SESS-006", "LMB-SESS-007", "LMB-CANCEL-001"} <= _with(result, Status.PASS)


@wire
async def test_without_a_model_the_model_driven_requirements_are_skipped_with_the_reason(tmp_path: Path) -> None:
    result = await run_kit(_settings(tmp_path, model=None), list(REQUIREMENTS))
    needing = {r.id for r in REQUIREMENTS if r.needs_model}
    assert needing <= _with(result, Status.SKIPPED)
    assert all("--model" in result.outcomes[rid].detail for rid in needing)
    assert _with(result, Status.FAIL, Status.NOT_TESTED) == set()
    assert result.verdict().conformant


@wire
async def test_an_agent_that_requires_authentication_blocks_the_run_unless_authenticated(tmp_path: Path) -> None:
    blocked = await run_kit(_settings(tmp_path, "--require-auth"), list(REQUIREMENTS))
    verdict = blocked.verdict()
    assert not verdict.conformant and verdict.blocked and "authentication required" in verdict.blocked
    session_ids = {r.id for r in REQUIREMENTS if r.group in ("sessions", "prompt", "cancel", "history")}
    assert session_ids <= _with(blocked, Status.SKIPPED)  # never counted as passes
    assert blocked.outcomes["LMB-INIT-001"].status is Status.PASS

    settings = _settings(tmp_path, "--require-auth")
    settings.auth_method = "token"
    authenticated = await run_kit(settings, list(REQUIREMENTS))
    assert authenticated.verdict().conformant, authenticated.verdict().summary
    # Logged out, its next session/new asks for authenticate again: what the spec describes.
    assert authenticated.outcomes["LMB-AUTH-001"].status is Status.PASS
    assert "auth_required (-32000)" in authenticated.outcomes["LMB-AUTH-002"].detail


@wire
async def test_logout_is_called_only_when_asked_for(tmp_path: Path) -> None:
    """logout ends a real agent's login on the machine it runs on: without --logout the kit does not call it, and
    says how to (the agent advertises it); never counted as a pass."""
    settings = _settings(tmp_path)
    settings.logout = False
    result = await run_kit(settings, list(REQUIREMENTS))
    for rid in ("LMB-AUTH-001", "LMB-AUTH-002"):
        assert result.outcomes[rid].status is Status.SKIPPED and "--logout" in result.outcomes[rid].detail
    assert not any(m.get("method") == "logout" for run in result.groups.values() for m in _sent(run))
    assert result.verdict().conformant


@wire
async def test_an_agent_that_cannot_start_is_not_tested_and_not_conformant(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    settings.spec = AgentSpec((str(tmp_path / "no-such-agent"),), dict(os.environ))
    result = await run_kit(settings, select(["INIT"], None))
    assert all(result.outcomes[rid].status is Status.NOT_TESTED for rid in ("LMB-INIT-001", "LMB-INIT-002"))
    assert "cannot start" in result.outcomes["LMB-INIT-001"].detail
    assert not result.verdict().conformant


def test_selection_by_pattern_and_tier() -> None:
    assert [r.id for r in select(["init-00?"], None)] == [f"LMB-INIT-00{n}" for n in range(1, 6)]
    assert {r.tier for r in select(None, [Tier.ADVISORY])} == {Tier.ADVISORY}
    assert select(["cancel"], [Tier.INFORMATIONAL]) == []


def test_every_requirement_cites_the_spec_and_belongs_to_a_group() -> None:
    from bridge.conform.checks import GROUPS

    for requirement in REQUIREMENTS:
        assert requirement.cites and all(c.url.startswith("https://") and c.text for c in requirement.cites)
        assert requirement.group in {*GROUPS, "all"}, requirement.id
        assert (requirement.tier is Tier.CAPABILITY) == (requirement.capability is not None), requirement.id


def _conform(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CONFORM_AGENT_STATE": str(tmp_path)}
    command = [sys.executable, "-m", "bridge", "conform", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)


@wire
@pytest.mark.smoke
def test_the_command_line_writes_every_report_and_exits_1_for_a_broken_agent(tmp_path: Path) -> None:
    reports = {name: tmp_path / name for name in ("report.json", "junit.xml", "table.md")}
    done = _conform(
        tmp_path,
        "--model", "directives",
        "--report-json", str(reports["report.json"]),
        "--junit", str(reports["junit.xml"]),
        "--markdown", str(reports["table.md"]),
        "--", sys.executable, AGENT, "--defect", "ext-wrong-code", "--defect", "same-session-id",
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "Verdict: NOT CONFORMANT: 1 failed (LMB-SESS-002)" in done.stdout
    report = json.loads(reports["report.json"].read_text())
    assert report["verdict"]["conformant"] is False
    assert report["agent"]["info"] == {"name": "conform-test-agent", "version": "1.0"}
    by_id = {entry["id"]: entry for entry in report["requirements"]}
    failed = by_id["LMB-SESS-002"]
    assert failed["status"] == "FAIL" and "twice" in failed["detail"]
    assert failed["citations"][0]["url"].startswith("https://agentclientprotocol.com/protocol/v1/session-setup")
    wire = [line for lines in failed["transcript"].values() for line in lines]
    assert any(line.get("msg", {}).get("method") == "session/new" for line in wire if line["dir"] == "out")
    assert "transcript" not in by_id["LMB-SESS-001"]  # only failures carry their wire
    assert by_id["LMB-EXT-002"]["status"] == "FAIL" and by_id["LMB-EXT-002"]["tier"] == "ADVISORY"

    suite = ElementTree.parse(reports["junit.xml"]).getroot()
    cases = {case.get("name", "").split()[0]: case for case in suite.iter("testcase")}
    assert len(cases) == len(REQUIREMENTS) and suite.get("failures") == "1"
    assert cases["LMB-SESS-002"].find("failure") is not None
    assert cases["LMB-EXT-002"].find("skipped") is not None  # an advisory finding does not fail CI
    assert "| LMB-SESS-002 | MANDATORY | FAIL |" in reports["table.md"].read_text()


@wire
def test_the_command_line_exits_0_for_a_conformant_agent(tmp_path: Path) -> None:
    done = _conform(tmp_path, "--model", "directives", "-k", "SESS", "--", sys.executable, AGENT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Verdict: CONFORMANT" in done.stdout


@wire
@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "name the agent"),
        (("--tier", "mandatory,bogus", "demo"), "--tier bogus: not a tier"),
        (("-k", "NOPE-*", "demo"), "no requirement matches"),
        (("no-such-agent",), "no agent 'no-such-agent' in the config"),
        (("--agent-env", "NOEQUALS", "demo"), "expected NAME=VALUE"),
        (("--timeout", "0", "demo"), "--timeout must be positive"),
    ],
)
def test_usage_errors_exit_2_with_a_clear_message(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    done = _conform(tmp_path, *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr


def test_with_the_fake_model_the_agent_is_pointed_at_it_by_its_recipe(tmp_path: Path) -> None:
    from bridge.conform.kit import _pointed_at
    from bridge.fakemodel.server import Call, FakeModel, say

    fake = FakeModel()
    fake.port = 4321
    env = {"PATH": "/bin", "OPENAI_API_KEY": "a real key", "ANTHROPIC_BASE_URL": "https://elsewhere"}
    settings = Settings(
        AgentSpec(("/opt/bin/codex-acp", "--flag"), env),
        model=MODEL_DRIVERS["fake"],
        workspace=tmp_path / "workspace",
        agent_env={"MY_MODEL_URL": "{model_url}/v1"},
    )
    pointed = _pointed_at(settings, fake, tmp_path / "home")
    assert pointed.spec.argv == ("/opt/bin/codex-acp", "--flag")
    assert pointed.spec.env["MY_MODEL_URL"] == "http://127.0.0.1:4321/v1"
    assert "OPENAI_API_KEY" not in pointed.spec.env and "ANTHROPIC_BASE_URL" not in pointed.spec.env  # no real key
    assert pointed.spec.env["HOME"] == str(tmp_path / "home") and pointed.spec.env["PATH"] == "/bin"
    assert 'base_url = "http://127.0.0.1:4321/v1"' in (tmp_path / "home" / ".codex" / "config.toml").read_text()
    assert pointed.model is not None and pointed.model.before is not None
    pointed.model.before("long", {})
    assert fake.script[0].stall  # a cancel's turn streams, then stays open until the agent hangs up
    pointed.model.before("short", {})
    assert fake.script == [say("pong", 1)]
    pointed.model.before("shell", {"command": "touch /tmp/x"})
    assert fake.script[0].calls == (Call("exec_command", {"cmd": "touch /tmp/x"}),)  # Codex's own shell tool
    pointed.model.before("tool", {"token": "t1"})
    assert fake.script[0].calls[0].offered == "*conform*echo"


@wire
async def test_an_agent_that_never_asks_the_fake_model_is_not_judged_on_what_its_model_did(tmp_path: Path) -> None:
    # The test agent has no model: with --model fake, the turns it answers are its own, not the script's.
    result = await run_kit(_settings(tmp_path, model="fake"), list(REQUIREMENTS))
    assert _with(result, Status.FAIL, Status.NOT_TESTED) == set(), {
        rid: o.detail for rid, o in result.outcomes.items() if o.status in (Status.FAIL, Status.NOT_TESTED)
    }
    undriven = {"LMB-CANCEL-001", "LMB-SESS-006", "LMB-MCP-001", "LMB-MCP-002", "LMB-PERM-001", "LMB-PERM-002"}
    assert undriven <= _with(result, Status.SKIPPED)
    assert all("never reached the fake model" in result.outcomes[rid].detail for rid in undriven)
    assert result.outcomes["LMB-PROMPT-001"].status is Status.PASS  # the ACP side of a turn is judged all the same


@wire
async def test_the_kits_sends_and_its_answers_to_the_agent_never_collide_on_the_pipe(tmp_path: Path) -> None:
    """The reader answers the agent's requests while the kit sends its own: one writer at a time on stdin."""
    from bridge.conform.agent import ClientSide, open_agent

    script = tmp_path / "chatty.py"
    script.write_text(
        "import json, sys\n"
        "for n in range(300):\n"
        "    print(json.dumps({'jsonrpc': '2.0', 'id': n, 'method': 'fs/read_text_file', 'params': {}}), flush=True)\n"
        "answers = sum(1 for line in sys.stdin if '\"result\"' in line or '\"error\"' in line)\n"
        "print(json.dumps({'jsonrpc': '2.0', 'method': 'done', 'params': {'answers': answers}}), flush=True)\n"
    )
    spec = AgentSpec((sys.executable, str(script)), dict(os.environ))
    async with open_agent(spec, ClientSide(tmp_path)) as agent:
        for _ in range(300):
            await agent.notify("_lmbridge.conform/noise", {"padding": "x" * 2000})
        await agent.wait_until(lambda: len(agent.client.requests) == 300, 60)
        await agent.close_stdin()
        assert await agent.wait_until(lambda: any(m.get("method") == "done" for m in agent.notifications), 60)
    done = next(m for m in agent.notifications if m.get("method") == "done")
    assert done["params"]["answers"] == 300


def test_a_client_terminal_keeps_the_last_bytes_of_its_output_on_a_character_boundary() -> None:
    assert keep_last(b"abc", 5) == (b"abc", False)
    assert keep_last("aé€x".encode(), 4) == ("€x".encode(), True)  # 'é' cut in two: dropped whole
    assert keep_last("aé€x".encode(), 3) == (b"x", True)  # the '€' cut in two, as well
    assert keep_last(b"abc", 0) == (b"", True)


async def test_client_terminals_run_wait_kill_and_release_and_stop_what_is_left(tmp_path: Path) -> None:
    terminals = ClientTerminals()
    async with trio.open_nursery() as nursery:
        terminals.attach(nursery)
        refused = await terminals.answer("terminal/create", {"sessionId": "s", "command": "true", "cwd": "rel"})
        assert refused["error"]["code"] == -32602 and "absolute" in refused["error"]["message"]
        made = await terminals.answer(
            "terminal/create",
            {"sessionId": "s", "command": "sh", "args": ["-c", "printf 0123456789; exit 3"], "cwd": str(tmp_path),
             "outputByteLimit": 4},
        )  # fmt: skip
        ended = {"sessionId": "s", "terminalId": made["result"]["terminalId"]}
        assert (await terminals.answer("terminal/wait_for_exit", ended))["result"] == {"exitCode": 3, "signal": None}
        output = (await terminals.answer("terminal/output", ended))["result"]
        assert output == {"output": "6789", "truncated": True, "exitStatus": {"exitCode": 3, "signal": None}}
        long = await terminals.answer("terminal/create", {"sessionId": "s", "command": "sleep", "args": ["60"]})
        running = {"sessionId": "s", "terminalId": long["result"]["terminalId"]}
        assert "exitStatus" not in (await terminals.answer("terminal/output", running))["result"]
        assert await terminals.answer("terminal/kill", running) == {"result": {}}
        killed = (await terminals.answer("terminal/wait_for_exit", running))["result"]
        assert killed == {"exitCode": None, "signal": "SIGKILL"}
        assert await terminals.answer("terminal/release", running) == {"result": {}}
        gone = await terminals.answer("terminal/output", running)
        assert gone["error"]["code"] == -32602  # a released terminal's id is no longer valid
        left = await terminals.answer("terminal/create", {"sessionId": "s", "command": "sleep", "args": ["60"]})
        assert "result" in left
        await terminals.aclose()  # what the agent never released is stopped with the run
        assert all(t.process.returncode is not None for t in terminals.created)
        nursery.cancel_scope.cancel()
    assert [t.released for t in terminals.created] == [False, True, False]


async def test_client_terminals_answer_malformed_requests_with_errors_and_kill_what_a_command_left(
    tmp_path: Path,
) -> None:
    terminals = ClientTerminals(str(tmp_path), {"PATH": os.environ["PATH"], "KIT": "1"})
    async with trio.open_nursery() as nursery:
        terminals.attach(nursery)
        for bad in (
            {"command": "true", "args": 5},
            {"command": "true", "env": 5},
            {"command": "tr\0ue"},
            {"command": "true", "env": [{"name": "A=B", "value": "x"}]},
            {"command": ""},
        ):
            answer = await terminals.answer("terminal/create", {"sessionId": "s", **bad})
            assert answer["error"]["code"] == -32602, bad
        made = await terminals.answer(
            "terminal/create",
            {"sessionId": "s", "command": "sh", "args": ["-c", 'pwd; echo "$KIT$AGENT"; sleep 60 & echo started'],
             "env": [{"name": "AGENT", "value": "2"}]},
        )  # fmt: skip
        left = {"sessionId": "s", "terminalId": made["result"]["terminalId"]}
        # The shell exits at once; the sleep it left behind keeps the output open until it is killed with its group.
        with trio.fail_after(HANG):
            while "started" not in (await terminals.answer("terminal/output", left))["result"]["output"]:
                await trio.sleep(0.05)
            assert await terminals.answer("terminal/kill", left) == {"result": {}}
            done = (await terminals.answer("terminal/wait_for_exit", left))["result"]
        assert done == {"exitCode": 0, "signal": None}  # the shell's own status
        output = (await terminals.answer("terminal/output", left))["result"]["output"]
        assert output.splitlines()[:2] == [str(tmp_path), "12"]  # the session's cwd; the kit's env, then the agent's
        await terminals.aclose()
        nursery.cancel_scope.cancel()


async def test_the_kit_starts_the_initialize_group_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bridge.conform import kit

    started: list[str] = []
    real = kit.run_group

    async def counting(name: str, *args: Any) -> Any:
        started.append(name)
        return await real(name, *args)

    monkeypatch.setattr(kit, "run_group", counting)
    await run_kit(_settings(tmp_path), select(["INIT", "RPC-001"], None))
    assert started == ["initialize", "negotiation", "robustness"], started  # (INIT-003 is negotiation's)


async def test_a_client_terminal_being_started_is_not_taken_for_a_process_of_the_agents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between its spawn and its listing in ``created``, a terminal's process runs unlisted: a scan for the command's
    processes then decides nothing, and once it is listed it is the kit's, not the agent's."""
    from bridge.conform.checks import _CommandProcesses

    followed = tmp_path / f"conform-follow-{uuid.uuid4().hex}.log"
    followed.touch()
    terminals = ClientTerminals(str(tmp_path))
    watch = _CommandProcesses(followed.name, terminals)
    spawned, release, listed = trio.Event(), trio.Event(), trio.Event()
    real = trio.lowlevel.open_process

    async def held(*args: Any, **kwargs: Any) -> trio.Process:
        process = await real(*args, **kwargs)  # (returns once the command runs: exec succeeded)
        spawned.set()
        await release.wait()
        return process

    async def create() -> None:
        await terminals.answer("terminal/create", {"sessionId": "s", "command": "tail", "args": ["-f", str(followed)]})
        listed.set()

    monkeypatch.setattr(trio.lowlevel, "open_process", held)
    async with trio.open_nursery() as nursery:
        terminals.attach(nursery)
        nursery.start_soon(create)
        with trio.fail_after(HANG):
            await spawned.wait()
            assert await watch.scan() is None
            release.set()
            await listed.wait()
            assert await watch.scan() == []
        await terminals.aclose()
        nursery.cancel_scope.cancel()


@wire
async def test_the_cancelled_command_is_judged_by_the_terminal_that_runs_it(tmp_path: Path) -> None:
    """With --pwd-first the test agent runs ``pwd`` in a terminal before the command's, and releases it once the
    command is done: the command's own terminal, left running on the cancel, is what LMB-TERM-004 judges."""
    wanted = [r for r in REQUIREMENTS if r.id in ("LMB-TERM-004", "LMB-CANCEL-005")]
    result = await run_kit(_settings(tmp_path, "--pwd-first", "--defect", "keeps-terminal-on-cancel"), wanted)
    assert result.outcomes["LMB-TERM-004"].status is Status.FAIL, result.outcomes["LMB-TERM-004"].detail
    conformant = await run_kit(_settings(tmp_path, "--pwd-first"), wanted)
    assert conformant.outcomes["LMB-TERM-004"].status is Status.PASS, conformant.outcomes["LMB-TERM-004"].detail


async def test_the_commands_processes_are_the_agents_not_the_kits_nor_its_ancestors_nor_the_prompts(
    tmp_path: Path,
) -> None:
    """The scan for the cancelled command finds it by the file's name (here a relative path), and leaves out the
    kit's own terminals (by their session), the processes it is told are the agent and its ancestors, and those
    that carry the prompt's text."""
    from bridge.conform.checks import _ancestry, _CommandProcesses

    followed = tmp_path / f"conform-follow-{uuid.uuid4().hex}.log"
    followed.touch()
    prompt = f"Run this shell command, then reply: done. tail -f {followed}"
    terminals = ClientTerminals(str(tmp_path))
    spawn = trio.lowlevel.open_process
    async with trio.open_nursery() as nursery:
        terminals.attach(nursery)
        made = await terminals.answer(
            "terminal/create", {"sessionId": "s", "command": "tail", "args": ["-f", str(followed)]}
        )
        assert "result" in made
        own = await spawn(["tail", "-f", followed.name], cwd=tmp_path, start_new_session=True)
        carrier = await spawn([sys.executable, "-c", "import sys; sys.stdin.read()", prompt], stdin=subprocess.PIPE)
        ancestor = await spawn(["tail", "-f", str(followed)])
        try:
            watch = _CommandProcesses(followed.name, terminals, _ancestry(os.getpid()) | {ancestor.pid}, prompt)
            found = await watch.decided(HANG)
            assert [p.pid for p in found] == [own.pid], found
            assert found[0].session == own.pid  # (a session of its own)
            assert os.getppid() in _ancestry(os.getpid())
        finally:
            for process in (own, carrier, ancestor):
                process.kill()
                await process.wait()
            await terminals.aclose()
            nursery.cancel_scope.cancel()


def test_config_002_changes_the_first_select_option_with_a_second_value_grouped_values_included() -> None:
    from bridge.conform.checks import _option_to_switch, _select_values

    grouped = {"id": "model", "type": "select", "currentValue": "a", "options": [
        {"group": "small", "name": "Small", "options": [{"value": "a", "name": "A"}]},
        {"group": "large", "name": "Large", "options": [{"value": "b", "name": "B"}, {"value": "c", "name": "C"}]},
    ]}  # fmt: skip
    assert _select_values(grouped) == ["a", "b", "c"]
    options = [
        {"id": "flag", "type": "boolean", "currentValue": True},  # not a select
        {"id": "one", "currentValue": "x", "options": [{"value": "x", "name": "X"}]},  # a select: one value only
        {"id": "unset", "type": "select", "options": [{"value": "p", "name": "P"}, {"value": "q", "name": "Q"}]},
        grouped,
        {"id": "later", "type": "select", "currentValue": "m", "options": [{"value": "m", "name": "M"},
                                                                             {"value": "n", "name": "N"}]},
    ]  # fmt: skip
    assert _option_to_switch(options) == (grouped, "b")  # the second value is in its second group
    assert _option_to_switch(options[:3]) is None


def test_the_kits_client_answers_a_permission_request_with_the_kind_of_option_it_prefers(tmp_path: Path) -> None:
    from bridge.conform.agent import ClientSide

    always, once = {"optionId": "a", "kind": "allow_always"}, {"optionId": "o", "kind": "allow_once"}
    reject, never = {"optionId": "r", "kind": "reject_once"}, {"optionId": "n", "kind": "reject_always"}

    def chosen(answer: str, offered: list[dict[str, str]]) -> Any:
        reply = ClientSide(tmp_path, permission_answer=answer).answer(
            "session/request_permission", {"sessionId": "s", "options": offered}
        )
        return reply["result"]["outcome"] if isinstance(reply, dict) else reply

    def selected(option: dict[str, str]) -> dict[str, str]:
        return {"outcome": "selected", "optionId": option["optionId"]}

    everything = [always, once, reject, never]
    assert chosen("allow", everything) == selected(once)  # allow_once first, wherever it is listed
    assert chosen("allow", [always, reject]) == selected(always)
    assert chosen("always", everything) == selected(always)
    assert chosen("always", [once, reject]) == selected(once)
    assert chosen("reject", everything) == selected(reject)
    assert chosen("reject", [always, never]) == selected(never)
    assert chosen("allow", [reject, never]) == {"outcome": "cancelled"}  # nothing to allow with
    assert chosen("cancelled", everything) == {"outcome": "cancelled"}
    assert chosen("hold", everything) is None  # left for the kit to answer


def test_the_sweep_names_each_reason_once_with_the_requirements_it_stands_for() -> None:
    """An agent that hung leaves dozens of requirements NOT_TESTED for one reason: its row in the sweep's table
    says that reason once."""
    from tests.conform_sweep import summary

    hung = "the agent did not answer: no answer within 60 s"
    requirements = [
        {"id": "LMB-INIT-001", "tier": "MANDATORY", "status": "PASS", "detail": ""},
        {"id": "LMB-SESS-001", "tier": "MANDATORY", "status": "NOT_TESTED", "detail": hung},
        *(
            {"id": f"LMB-PROMPT-00{n}", "tier": "MANDATORY", "status": "NOT_TESTED", "detail": f"not started: {hung}"}
            for n in (1, 2, 3)
        ),
        {"id": "LMB-EXT-002", "tier": "ADVISORY", "status": "FAIL", "detail": "expected error -32601"},
        {"id": "LMB-EXT-003", "tier": "ADVISORY", "status": "FAIL", "detail": "expected the notification ignored"},
        {"id": "LMB-RPC-001", "tier": "MANDATORY", "status": "FAIL", "detail": hung},  # failed, not untested: apart
    ]
    report = {"requirements": requirements, "verdict": {"conformant": False, "blocked": ""}, "agent": {}}
    assert summary(report)["failing"] == [
        f"LMB-SESS-001 and 3 more: {hung}",
        "LMB-EXT-002: expected error -32601",
        "LMB-EXT-003: expected the notification ignored",
        f"LMB-RPC-001: {hung}",
    ]
