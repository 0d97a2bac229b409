"""The check groups of ``lmbridge conform``: each drives one fresh agent process and decides the requirements of
its group (``requirements.Requirement.group``). A group records an ``Outcome`` per requirement it decided; the
runner marks whatever a group did not reach NOT_TESTED, with the reason (the agent exited, hung).

Judging is strict about what the spec says and silent about what it leaves open: a check that flags behaviour the
spec allows is a bug here, not in the agent. Every wait has a deadline (``Settings.timeout``).
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from bridge.acp.process import stop_process_group
from bridge.fakemodel.server import ModelRequest
from bridge.harness.validation import JsonSchema, validate
from wire.vocabulary import STOP_REASONS

from .agent import AgentGone, AgentSpec, Answer, ClientSide, LiveAgent, TranscriptLine, open_agent
from .requirements import BY_ID, Status
from .terminals import ClientTerminals, Terminal

__all__ = [
    "GROUPS",
    "MODEL_DRIVERS",
    "GroupRun",
    "ModelDriver",
    "Outcome",
    "Settings",
    "advertised",
    "conform_workspace",
    "judge_transcripts",
    "run_group",
]

CLIENT_INFO = {"name": "lmbridge-conform", "version": "1"}
PROTOCOL_VERSION = 1
UNSUPPORTED_VERSION = 99
SHUTDOWN_SECONDS = 5.0
META = {"dev.lmbridge/conform": {"probe": True}}
LATE_UPDATE_WINDOW = 0.5
_TURN_KINDS = ("agent_message_chunk", "agent_thought_chunk", "tool_call", "tool_call_update", "plan")
_REPLAY_KINDS = ("user_message_chunk", "agent_message_chunk", "agent_thought_chunk", "tool_call", "tool_call_update")


class Blocked(Exception):
    """The run cannot go on past the handshake: authentication required, or a protocol version the kit does not
    speak. The message says which."""


@dataclass(frozen=True)
class ModelDriver:
    """How the kit makes the agent's model do what a check needs. ``texts``: the prompt for each kind of turn —
    ``short`` (a short answer), ``long`` (a turn a cancel interrupts), ``tool`` (call the probe MCP server's
    ``echo`` with ``{token}``), ``shell`` (run ``{command}`` with the agent's shell tool), ``read`` (read the file
    ``{path}`` with its file tool). A scripted model is
    scripted by ``before`` ahead of each prompt, and its ``requests`` show what the model was sent. ``none`` has
    no driver: the checks that need a model are skipped."""

    name: str
    texts: Mapping[str, str]
    description: str
    before: Callable[[str, Mapping[str, str]], None] | None = None
    answer: str | None = None  # what the model answers a short prompt, when the kit knows it (a scripted model)
    scripted: bool = False  # the model does what the kit asks, always (a script, directives): no inconclusive turns
    requests: Callable[[], list[ModelRequest]] | None = None

    @property
    def short(self) -> str:
        return self.texts["short"]

    def can(self, kind: str) -> bool:
        return kind in self.texts

    def prompt(self, session: str, kind: str, **values: str) -> dict[str, Any]:
        if self.before is not None:
            self.before(kind, values)
        text = self.texts[kind]
        for name, value in values.items():
            text = text.replace("{" + name + "}", value)
        return _prompt(session, text)


_PLAIN = {
    "short": "Reply with the single word: pong",
    "long": "Count from 1 to 400, one number per line, with no other text.",
    "tool": "Call the echo tool of the MCP server named conform with the text {token}, then reply: done.",
    "shell": "Run this shell command, then reply: done. {command}",
    "read": "Read the file {path} with your file-reading tool, then reply with its content.",
}
MODEL_DRIVERS = {
    "own": ModelDriver("own", _PLAIN, "the agent's own model, as configured (its login or API key; costs tokens)"),
    "fake": ModelDriver(
        "fake",
        _PLAIN,
        "lmbridge's fake model, scripted per check (the agent pointed at it by its recipe: docs/fake-model.md)",
        answer="pong",
        scripted=True,
    ),
    "directives": ModelDriver(
        "directives",
        {
            "short": "/say pong",
            "long": "/say counting\n/sleep 60000\n/say done",
            "tool": '/tool echo {"text": "{token}"}',
            "shell": "/shell {command}",
            "read": "/read {path}",
        },
        "lmbridge's demo directives (the built-in demo agent, or an agent that speaks them)",
        answer="pong",
        scripted=True,
    ),
}


@dataclass
class Settings:
    spec: AgentSpec
    timeout: float = 30.0  # per request
    startup_timeout: float = 60.0  # for the initialize answer
    auth_method: str | None = None
    model: ModelDriver | None = None
    schema: JsonSchema | None = None
    workspace: Path = field(default_factory=lambda: Path(tempfile.gettempdir()))
    agent_env: dict[str, str] = field(default_factory=dict)  # --agent-env, applied last (``{model_url}`` filled in)
    session_mode: str | None = None  # set on each session the model-driven groups open (a recipe's choice)
    logout: bool = False  # --logout: call logout (it ends the agent's login on this machine)


@dataclass
class Outcome:
    requirement: str
    status: Status
    detail: str = ""
    seconds: float | None = None  # a measured figure (INFORMATIONAL timings)

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"status": self.status.value, "detail": self.detail}
        if self.seconds is not None:
            entry["seconds"] = round(self.seconds, 3)
        return entry


@dataclass
class GroupRun:
    """What one group found, with the wire it found it on."""

    group: str
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    transcripts: dict[str, list[TranscriptLine]] = field(default_factory=dict)  # per process of the group
    stderr_tail: str = ""
    stderr_bytes: int = 0
    seconds: float = 0.0
    exempt: list[tuple[str, int, int]] = field(default_factory=list)  # transcript ranges not judged as ACP
    problem: str | None = None  # why the group stopped early
    blocked: str | None = None  # auth or version: the run cannot be judged past the handshake
    capabilities: dict[str, Any] | None = None  # agentCapabilities, from the initialize group
    initialize: dict[str, Any] | None = None  # the whole initialize result, from the initialize group
    model_requests: list[dict[str, Any]] = field(default_factory=list)  # what a scripted model was asked meanwhile

    def set(self, requirement: str, status: Status, detail: str = "", seconds: float | None = None) -> None:
        assert requirement in BY_ID, requirement
        if requirement not in self.outcomes:  # the first finding decides
            self.outcomes[requirement] = Outcome(requirement, status, detail, seconds)

    def fail(self, requirement: str, expected: str, got: str) -> None:
        self.set(requirement, Status.FAIL, f"expected {expected}; got {got}")


@dataclass
class _Group:
    run: GroupRun
    agent: LiveAgent
    settings: Settings
    capabilities: dict[str, Any]
    asked_before: int = 0  # the scripted model's requests before the group began
    opened: dict[str, dict[str, Any]] = field(default_factory=dict)  # session id → its session/new result

    def model_asked(self) -> bool | None:
        """Whether the agent has asked the scripted model anything during this group (None: not a scripted model
        the kit can see). An agent not pointed at it answers from elsewhere: what its model did is not the kit's."""
        model = self.settings.model
        if model is None or model.requests is None:
            return None
        return len(model.requests()) > self.asked_before

    def undriven(self, requirements: tuple[str, ...]) -> bool:
        """True (the requirements SKIPPED, saying why) when the agent never asked the fake model."""
        if self.model_asked() is not False:
            return False
        why = (
            "the agent's model requests never reached the fake model (it is not pointed at it: give what it reads "
            "with --agent-env NAME={model_url})"
        )
        for requirement in requirements:
            self.run.set(requirement, Status.SKIPPED, why)
        return True

    async def request(self, method: str, params: Any, timeout: float | None = None) -> Answer:
        return await self.agent.request(method, params, timeout=timeout or self.settings.timeout)

    async def new_session(self, requirement: str | None = "LMB-SESS-001", **extra: Any) -> str | None:
        params: dict[str, Any] = {"cwd": str(self.settings.workspace), "mcpServers": [], **extra}
        answer = await self.request("session/new", params)
        if answer.error_code() == -32000:
            raise Blocked("authentication required: session/new answered -32000 (pass --auth-method)")
        session_id = answer.field("sessionId")
        if requirement is not None:
            problems = _invalid("NewSessionResponse", answer, self.settings.schema)
            if problems:
                self.run.fail(requirement, "a valid NewSessionResponse", problems)
            else:
                self.run.set(requirement, Status.PASS)
        if isinstance(session_id, str):
            self.opened[session_id] = answer.result
        if not isinstance(session_id, str):
            if requirement is None:  # what the group's requirements needed: they are not tested, and this is why
                self.run.problem = f"session/new failed: {answer.describe()}"
            return None
        if requirement is None and self.settings.session_mode:
            await self._set_mode(session_id, answer.result, self.settings.session_mode)
        return session_id

    async def _set_mode(self, session_id: str, result: dict[str, Any], mode: str) -> None:
        """Put a session in ``mode`` when it offers one (``session/set_mode``, else its ``mode`` config option)."""
        modes = (result.get("modes") or {}).get("availableModes") or []
        if any(isinstance(m, dict) and m.get("id") == mode for m in modes):
            await self.request("session/set_mode", {"sessionId": session_id, "modeId": mode})
            return
        options = result.get("configOptions") or []
        if any(isinstance(o, dict) and o.get("id") == "mode" for o in options):
            params = {"sessionId": session_id, "configId": "mode", "value": mode}
            await self.request("session/set_config_option", params)


# -- the handshake ---------------------------------------------------------------------------------------------------


def initialize_params(version: int = PROTOCOL_VERSION, client: ClientSide | None = None) -> dict[str, Any]:
    capabilities = client.capabilities() if client else ClientSide(Path("/")).capabilities()
    return {"protocolVersion": version, "clientCapabilities": capabilities, "clientInfo": CLIENT_INFO}


async def _handshake(agent: LiveAgent, settings: Settings) -> tuple[Answer, float]:
    """``initialize`` (and ``authenticate`` when asked); the answer and how long it took. ``Blocked`` when the
    agent answers another protocol version."""
    started = agent.now()
    answer = await agent.request("initialize", initialize_params(client=agent.client), timeout=settings.startup_timeout)
    took = agent.now() - started
    version = answer.field("protocolVersion")
    if answer.ok and _is_int(version) and version != PROTOCOL_VERSION:
        raise Blocked(f"the agent speaks protocol version {version}; the kit speaks {PROTOCOL_VERSION}")
    if answer.ok and settings.auth_method:
        auth = await agent.request("authenticate", {"methodId": settings.auth_method}, timeout=settings.timeout)
        if not auth.ok:
            raise Blocked(f"authenticate with method {settings.auth_method!r} failed: {auth.describe()}")
    return answer, took


# -- the groups ------------------------------------------------------------------------------------------------------


async def _model_session(g: _Group, **extra: Any) -> tuple[ModelDriver, str] | None:
    """For a group that needs the model: the handshake and a session (None when session/new failed: the group's
    problem says why)."""
    model = g.settings.model
    assert model is not None
    await _handshake(g.agent, g.settings)
    session = await g.new_session(None, **extra)
    return None if session is None else (model, session)


async def _group_initialize(g: _Group) -> None:
    run = g.run
    answer, took = await _handshake(g.agent, g.settings)
    problems = _invalid("InitializeResponse", answer, g.settings.schema)
    if problems:
        run.fail("LMB-INIT-001", "a valid InitializeResponse", problems)
    else:
        run.set("LMB-INIT-001", Status.PASS)
    result = answer.result if answer.ok and isinstance(answer.result, dict) else {}
    version = result.get("protocolVersion")
    if not answer.ok:
        run.fail("LMB-INIT-002", f"protocolVersion {PROTOCOL_VERSION}", answer.describe())
    elif not _is_int(version):
        run.fail("LMB-INIT-002", "an integer protocolVersion", f"protocolVersion {json.dumps(version)}")
    else:
        run.set("LMB-INIT-002", Status.PASS)
    info = result.get("agentInfo")
    if isinstance(info, dict) and info.get("name") and info.get("version"):
        run.set("LMB-INIT-004", Status.PASS, f"{info.get('name')} {info.get('version')}")
    elif answer.ok:
        run.fail("LMB-INIT-004", "agentInfo with name and version", f"agentInfo {json.dumps(info)}")
    run.set("LMB-INIT-005", Status.PASS, f"{took:.3f} s", seconds=took)
    run.initialize = result
    capabilities = result.get("agentCapabilities")
    run.capabilities = capabilities if isinstance(capabilities, dict) else {}


async def _group_negotiation(g: _Group) -> None:
    params = initialize_params(UNSUPPORTED_VERSION, g.agent.client)
    answer = await g.agent.request("initialize", params, timeout=g.settings.startup_timeout)
    version = answer.field("protocolVersion")
    asked = f"asked for protocolVersion {UNSUPPORTED_VERSION}"
    if not answer.ok:
        g.run.fail("LMB-INIT-003", f"the latest version it supports ({asked})", answer.describe())
    elif not isinstance(version, int) or isinstance(version, bool) or not 1 <= version < UNSUPPORTED_VERSION:
        g.run.fail("LMB-INIT-003", f"a version it supports, below {UNSUPPORTED_VERSION} ({asked})", f"{version!r}")
    else:
        g.run.set("LMB-INIT-003", Status.PASS, f"answered {version}")


async def _group_sessions(g: _Group) -> None:
    run = g.run
    await _handshake(g.agent, g.settings)
    deleting = advertised(g.capabilities, "sessionCapabilities.delete")
    first = await g.new_session()
    if first is not None:
        await _session_options(g, first, g.opened.get(first, {}))
    if first is None:
        # What builds on a working session/new cannot be judged: saying it fails would blame the wrong thing.
        why = "session/new itself failed (LMB-SESS-001)"
        for requirement in (
            "LMB-SESS-002",
            "LMB-EXT-004",
            "LMB-SESS-004",
            "LMB-SESS-005",
            *_OPTION_IDS,
            *(DELETE_REQUIREMENTS if deleting else ()),
        ):
            run.set(requirement, Status.NOT_TESTED, why)
    else:
        second = await g.new_session(None)
        if second is None:
            run.set("LMB-SESS-002", Status.NOT_TESTED, "a second session/new failed")
        elif first == second:
            run.fail("LMB-SESS-002", "two different session ids", f"{first!r} twice")
        else:
            run.set("LMB-SESS-002", Status.PASS)
        if deleting:
            await _session_delete(g, second, first)
        answer = await g.request("session/new", {"cwd": str(g.settings.workspace), "mcpServers": [], "_meta": META})
        if answer.ok:
            run.set("LMB-EXT-004", Status.PASS)
        else:
            run.fail("LMB-EXT-004", "session/new with a _meta object answered like one without", answer.describe())
        if advertised(g.capabilities, "sessionCapabilities.additionalDirectories"):
            extra = Path(g.settings.workspace, "extra-root")
            extra.mkdir(exist_ok=True)
            await g.new_session("LMB-SESS-005", additionalDirectories=[str(extra)])
        if advertised(g.capabilities, "sessionCapabilities.close"):
            answer = await g.request("session/close", {"sessionId": first})
            _judge(run, "LMB-SESS-004", "CloseSessionResponse", answer, g.settings.schema)
    if advertised(g.capabilities, "sessionCapabilities.list"):
        answer = await g.request("session/list", {})
        _judge(run, "LMB-SESS-003", "ListSessionsResponse", answer, g.settings.schema)


DELETE_REQUIREMENTS = ("LMB-SESS-009", "LMB-SESS-011")  # the sessions group's; LMB-SESS-010 is the history's
_LIST_PAGES = 20  # session/list pages read looking for a session (an agent with a long history pages it)


async def _session_delete(g: _Group, session: str | None, first: str) -> None:
    """Delete ``session``, the kit's second (never prompted): the answer, then deleting it again and a session that
    never existed (both should succeed silently). Whether the list forgets it is judged on a session with a history
    (``_deleted_from_list``): agents may list only those."""
    run = g.run
    if session is None or session == first:
        for requirement in DELETE_REQUIREMENTS:
            if session is None:
                run.set(requirement, Status.NOT_TESTED, "no second session to delete (LMB-SESS-002)")
            else:  # one id for both: deleting it would take the first session (and what is judged on it) too
                run.set(requirement, Status.SKIPPED, "the agent gave both sessions one id (LMB-SESS-002)")
        return
    answer = await g.request("session/delete", {"sessionId": session})
    _judge(run, "LMB-SESS-009", "DeleteSessionResponse", answer, g.settings.schema)
    again = await g.request("session/delete", {"sessionId": session})
    never = await g.request("session/delete", {"sessionId": f"lmbridge-conform-never-{uuid.uuid4().hex[:8]}"})
    refused = [f"{what}: {a.describe()}" for what, a in (("again", again), ("never existed", never)) if not a.ok]
    if refused:
        run.fail("LMB-SESS-011", "success (an empty result) both times", "; ".join(refused))
    else:
        run.set("LMB-SESS-011", Status.PASS)


async def _deleted_from_list(g: _Group, session: str) -> None:
    """In a fresh process: session/list has ``session`` (it has a history), session/delete, and the list no longer
    has it."""
    if not advertised(g.capabilities, "sessionCapabilities.list"):
        g.run.set("LMB-SESS-010", Status.SKIPPED, "sessionCapabilities.list is not advertised: nothing to look in")
        return
    async with open_agent(g.settings.spec, ClientSide(g.settings.workspace)) as fresh:
        g.run.transcripts["delete"] = fresh.transcript
        await _handshake(fresh, g.settings)
        before = await _listed(fresh, session, g.settings.timeout)
        if not before:
            why = "session/list failed" if before is None else "session/list did not have it"
            g.run.set("LMB-SESS-010", Status.SKIPPED, f"before its deletion {why}")
            return
        answer = await fresh.request("session/delete", {"sessionId": session}, timeout=g.settings.timeout)
        if not answer.ok:
            g.run.fail("LMB-SESS-010", "session/delete to succeed", answer.describe())
        elif await _listed(fresh, session, g.settings.timeout):
            g.run.fail("LMB-SESS-010", "the deleted session gone from session/list", f"{session!r} still listed")
        else:
            g.run.set("LMB-SESS-010", Status.PASS)


async def _listed(agent: LiveAgent, session: str, timeout: float) -> bool | None:
    """Whether session/list names ``session`` (following its cursor); None when listing fails."""
    params: dict[str, Any] = {}
    for _page in range(_LIST_PAGES):
        answer = await agent.request("session/list", params, timeout=timeout)
        sessions = answer.field("sessions")
        if not answer.ok or not isinstance(sessions, list):
            return None
        if any(isinstance(item, dict) and item.get("sessionId") == session for item in sessions):
            return True
        cursor = answer.field("nextCursor")
        if not isinstance(cursor, str) or not cursor:
            return False
        params = {"cursor": cursor}
    return False


_OPTION_IDS = ("LMB-MODE-001", "LMB-MODE-002", "LMB-CONFIG-001", "LMB-CONFIG-002")


async def _session_options(g: _Group, session: str, opened: dict[str, Any]) -> None:
    """The session's modes and config options: each set to what it already is (the methods work and say so), then
    to another value and back (the change is taken, and what the agent says of it agrees)."""
    modes = opened.get("modes")
    if isinstance(modes, dict) and isinstance(modes.get("currentModeId"), str):
        params = {"sessionId": session, "modeId": modes["currentModeId"]}
        answer = await _answer_or_fail(g, "LMB-MODE-001", "session/set_mode", params)
        if answer is None:
            why = "not tried: session/set_mode to the current mode went unanswered (LMB-MODE-001)"
            g.run.set("LMB-MODE-002", Status.NOT_TESTED, why)
        else:
            _judge(g.run, "LMB-MODE-001", "SetSessionModeResponse", answer, g.settings.schema)
            await _mode_switch(g, session, modes)
    else:
        g.run.set("LMB-MODE-001", Status.SKIPPED, "its sessions offer no modes")
        g.run.set("LMB-MODE-002", Status.SKIPPED, "its sessions offer no modes")
    options = [o for o in opened.get("configOptions") or () if isinstance(o, dict)]
    select = next((o for o in options if o.get("type", "select") == "select" and "currentValue" in o), None)
    if select is None:
        g.run.set("LMB-CONFIG-001", Status.SKIPPED, "its sessions offer no select config option")
        g.run.set("LMB-CONFIG-002", Status.SKIPPED, "its sessions offer no select config option")
        return
    params = {"sessionId": session, "configId": select.get("id"), "value": select["currentValue"]}
    answer = await _answer_or_fail(g, "LMB-CONFIG-001", "session/set_config_option", params)
    if answer is None:
        why = "not tried: session/set_config_option to the current value went unanswered (LMB-CONFIG-001)"
        g.run.set("LMB-CONFIG-002", Status.NOT_TESTED, why)
        return
    problems = _invalid("SetSessionConfigOptionResponse", answer, g.settings.schema)
    listed = _options_by_id(answer)
    missing = [o.get("id") for o in options if o.get("id") not in listed]
    if problems:
        g.run.fail("LMB-CONFIG-001", "a valid SetSessionConfigOptionResponse", problems)
    elif missing:
        g.run.fail("LMB-CONFIG-001", "every option of the session in the answer", f"{missing} missing")
    elif listed[select.get("id")].get("currentValue") != select["currentValue"]:
        value = listed[select.get("id")].get("currentValue")
        g.run.fail("LMB-CONFIG-001", f"{select.get('id')} = {select['currentValue']!r}", repr(value))
    else:
        g.run.set("LMB-CONFIG-001", Status.PASS, f"{len(listed)} option(s)")
    await _config_switch(g, session, options)


async def _answer_or_fail(g: _Group, requirement: str, method: str, params: dict[str, Any]) -> Answer | None:
    """The agent's answer; None, with ``requirement`` failed, when none came in time. The group goes on while the
    agent still answers other requests: a hang here is this requirement's failure, not the end of the others'."""
    try:
        return await g.request(method, params)
    except TimeoutError as exc:
        g.run.fail(requirement, f"an answer to {method}", str(exc))
        await _unless_hung(g, exc)
        return None


async def _unless_hung(g: _Group, unanswered: TimeoutError) -> None:
    """After a request went unanswered: return when the agent still answers another, else end the group (its other
    requirements NOT_TESTED), rather than wait as long again for each of them."""
    problem = await _still_answers(g)
    if problem is not None:
        raise TimeoutError(f"{unanswered}; {problem}")


def _options_by_id(answer: Answer) -> dict[Any, dict[str, Any]]:
    return {o.get("id"): o for o in (answer.result or {}).get("configOptions") or () if isinstance(o, dict)}


async def _mode_switch(g: _Group, session: str, modes: dict[str, Any]) -> None:
    """session/set_mode to the first other available mode, then back. The last current_mode_update the agent sends
    after the set-back request (it need not send any) must name the mode set back: what came before that request
    is about the first change, which the set-back supersedes."""
    current = modes["currentModeId"]
    available = [m.get("id") for m in modes.get("availableModes") or () if isinstance(m, dict)]
    other = next((mode for mode in available if isinstance(mode, str) and mode != current), None)
    if other is None:
        g.run.set("LMB-MODE-002", Status.SKIPPED, "its sessions offer one mode")
        return
    failed: tuple[str, str] | None  # (expected, got)
    for mode in (other, current):
        request_id = await g.agent.start_request("session/set_mode", {"sessionId": session, "modeId": mode})
        unanswered: TimeoutError | None = None
        try:
            answer = await g.agent.answer(request_id, g.settings.timeout)
        except TimeoutError as exc:  # judged here: the group goes on (what follows does not build on it)
            failed, unanswered = (f"an answer to session/set_mode to {mode!r}", str(exc)), exc
        else:
            problems = _invalid("SetSessionModeResponse", answer, g.settings.schema)
            failed = (f"a valid SetSessionModeResponse to {mode!r}", problems) if problems else None
        if failed is not None:
            set_back = {"sessionId": session, "modeId": current} if mode == other else None
            await _switch_failed(g, "LMB-MODE-002", failed, unanswered, "session/set_mode", set_back)
            return

    def said() -> list[Any]:
        """What the current_mode_updates since the set-back request (``request_id``, the loop's last) named."""
        transcript = g.agent.transcript
        return [
            line.message["params"]["update"].get("currentModeId")
            for line in transcript[_sent_index(transcript, request_id) + 1 :]
            if line.dir == "in"
            and _is_update(line.message, session)
            and _update_kind(line.message) == "current_mode_update"
        ]

    if said():  # it reports client-made changes: wait for the last report
        await trio.sleep(LATE_UPDATE_WINDOW)
    reported = said()
    if reported and reported[-1] != current:
        expected = f"the last current_mode_update after the set-back naming {current!r}"
        g.run.fail("LMB-MODE-002", expected, f"after it: {reported}")
    else:
        how = f"current_mode_update {reported}" if reported else "no current_mode_update (none is required)"
        g.run.set("LMB-MODE-002", Status.PASS, f"{current!r} → {other!r} → {current!r}; after the set-back, {how}")


async def _switch_failed(
    g: _Group,
    requirement: str,
    failed: tuple[str, str],
    unanswered: TimeoutError | None,
    method: str,
    set_back: dict[str, Any] | None,
) -> None:
    """A step of a switch and back failed (``failed``: expected, got): ``requirement`` fails; after no answer at all
    the group goes on only while the agent still answers (``_unless_hung``); ``set_back``, the params of the set-back
    when it was never sent, is sent unjudged (``_restore``)."""
    g.run.fail(requirement, *failed)
    if unanswered is not None:
        await _unless_hung(g, unanswered)
    if set_back is not None:
        await _restore(g, method, set_back)


async def _restore(g: _Group, method: str, params: dict[str, Any]) -> None:
    """Put a mode or option back after a change that failed before its set-back, in case it was taken all the same:
    an agent may keep it beyond the session, as the default of the user's next. Not judged; a hang here only costs
    the wait."""
    try:
        await g.request(method, params)
    except TimeoutError:
        pass


def _select_values(option: dict[str, Any]) -> list[Any]:
    """A select option's values, its groups' included."""
    values = []
    for entry in option.get("options") or ():
        if isinstance(entry, dict) and "value" in entry:
            values.append(entry["value"])
        elif isinstance(entry, dict):
            values += [v["value"] for v in entry.get("options") or () if isinstance(v, dict) and "value" in v]
    return values


def _option_to_switch(options: list[dict[str, Any]]) -> tuple[dict[str, Any], Any] | None:
    """The first select option (the type when none is given) with a current value and another, its groups' values
    included; with that other value."""
    for option in options:
        if option.get("type", "select") != "select" or "currentValue" not in option:
            continue
        other = next((value for value in _select_values(option) if value != option["currentValue"]), None)
        if other is not None:
            return option, other
    return None


async def _config_switch(g: _Group, session: str, options: list[dict[str, Any]]) -> None:
    """The first select option with another value: set to it, then back; each answer has the value set."""
    chosen = _option_to_switch(options)
    if chosen is None:
        g.run.set("LMB-CONFIG-002", Status.SKIPPED, "no select config option has a second value")
        return
    option, other = chosen
    current, name = option["currentValue"], option.get("id")
    failed: tuple[str, str] | None  # (expected, got)
    for value in (other, current):
        params = {"sessionId": session, "configId": name, "value": value}
        unanswered: TimeoutError | None = None
        try:
            answer = await g.request("session/set_config_option", params)
        except TimeoutError as exc:  # judged here: the group goes on (what follows does not build on it)
            failed, unanswered = (f"an answer to session/set_config_option of {name} to {value!r}", str(exc)), exc
        else:
            got = _options_by_id(answer).get(name, {}).get("currentValue")
            if not answer.ok:
                failed = (f"{name} set to {value!r}", answer.describe())
            elif got != value:
                failed = (f"{name}'s currentValue {value!r} in the answer", repr(got))
            else:
                failed = None
        if failed is not None:
            set_back = {**params, "value": current} if value == other else None
            await _switch_failed(g, "LMB-CONFIG-002", failed, unanswered, "session/set_config_option", set_back)
            return
    g.run.set("LMB-CONFIG-002", Status.PASS, f"{name}: {current!r} → {other!r} → {current!r}")


async def _group_robustness(g: _Group) -> None:
    run = g.run
    await _handshake(g.agent, g.settings)

    answer = await g.request("lmbridge.conform/no_such_method", {})
    _judge_unknown_method(run, answer, "LMB-RPC-001", "LMB-RPC-002")
    answer = await g.request("_lmbridge.conform/no_such_extension", {"probe": True})
    _judge_unknown_method(run, answer, "LMB-EXT-001", "LMB-EXT-002")

    mark = len(g.agent.transcript)
    await g.agent.notify("_lmbridge.conform/no_such_notification", {"probe": True})
    alive = await _still_answers(g)
    replies = _stray_responses(g.agent.transcript[mark:])
    if alive is not None:
        run.fail("LMB-EXT-003", "the next request answered after an unknown extension notification", alive)
    elif replies:
        run.fail("LMB-EXT-003", "the notification ignored", f"an answer to it: {json.dumps(replies[0])[:200]}")
    else:
        run.set("LMB-EXT-003", Status.PASS)

    params = {"sessionId": "lmbridge-conform-no-such-session", "prompt": [{"type": "text", "text": "hello"}]}
    try:
        answer = await g.request("session/prompt", params)
    except TimeoutError:
        run.set("LMB-SESS-008", Status.FAIL, f"no answer within {g.settings.timeout:g} s")
    else:
        if answer.ok:
            run.set("LMB-SESS-008", Status.FAIL, "answered with a result for a session that does not exist")
        else:
            alive = await _still_answers(g)
            run.set("LMB-SESS-008", Status.PASS if alive is None else Status.FAIL, alive or answer.describe())

    # Deep and large, but valid: reported (informational), and what the agent answers is not judged as an envelope
    # (a parser that gives up may rightly answer -32700 with a null id).
    found = []
    for request_id, what, value in (
        ("conform-deep", "nested 10,000 deep", "[" * DEEP + "]" * DEEP),
        ("conform-large", "of 8 MiB", json.dumps("x" * LARGE)),
    ):
        line = _extension_line(request_id, value)
        sent = {"jsonrpc": "2.0", "id": request_id, "method": EXTENSION_PROBE}  # (its id counts as sent: RPC-003)
        alive, mark = None, len(g.agent.transcript)
        try:
            with trio.move_on_after(g.settings.timeout) as stuck:
                await g.agent.send_line(line, sent, shown=f"{line[:120]}… ({len(line):,} bytes: a request {what})")
            mark = len(g.agent.transcript)
            if stuck.cancelled_caught:
                alive = f"it did not read the request within {g.settings.timeout:g} s"
            else:
                alive = await _still_answers(g)
        except AgentGone as exc:
            alive = str(exc)
        run.exempt.append(("main", mark, len(g.agent.transcript)))  # its answers (the request line is judged)
        if alive is not None:
            found.append(f"after a request {what}: {alive}")
            break
        found.append(f"took a request {what}")
    gone = any("after a request" in line for line in found)
    run.set("LMB-STDIO-004", Status.FAIL if gone else Status.PASS, "; ".join(found))
    if gone:
        run.set("LMB-STDIO-002", Status.SKIPPED, "the agent stopped answering on a request before (LMB-STDIO-004)")
        return

    # Last, since an agent may well exit on it. The client MUST NOT send this, so what the agent answers to it is
    # reported here (informational) and not held against it in LMB-RPC-003.
    mark = len(g.agent.transcript)
    await g.agent.send_line('{"jsonrpc": "2.0", "id": "conform-truncated", "method": "session/new", "par')
    try:
        alive = await _still_answers(g)
    except AgentGone as exc:
        alive = str(exc)
    run.exempt.append(("main", mark, len(g.agent.transcript)))
    replies = _stray_responses(g.agent.transcript[mark:])
    answered = f"; it answered the line: {json.dumps(replies[0])[:200]}" if replies else ""
    if alive is None:
        run.set("LMB-STDIO-002", Status.PASS, "the next request was answered" + answered)
    else:
        run.set("LMB-STDIO-002", Status.FAIL, alive + answered)


DEEP = 10_000  # nesting of the deep request (Python's json gives up near 1,000; V8's JSON.parse goes deeper)
LARGE = 8 * 1024 * 1024  # bytes of the large request's string


EXTENSION_PROBE = "_lmbridge.conform/probe"  # an extension method no agent has


def _extension_line(request_id: str, params_json: str) -> str:
    """A valid request of ``EXTENSION_PROBE``, with ``params_json`` as its ``params.value``."""
    head = f'{{"jsonrpc": "2.0", "id": "{request_id}", "method": "{EXTENSION_PROBE}", "params": {{"value": '
    return head + params_json + "}}"


async def _group_prompt(g: _Group) -> None:
    run = g.run
    opened = await _model_session(g)
    if opened is None:
        return
    model, session = opened
    for requirement in ("LMB-PROMPT-001", "LMB-PROMPT-003"):
        answer = await g.request("session/prompt", model.prompt(session, "short"))
        problems = _invalid("PromptResponse", answer, g.settings.schema)
        reason = answer.field("stopReason")
        if problems:
            run.fail(requirement, "a valid PromptResponse", problems)
        elif reason == "cancelled" or reason not in STOP_REASONS:
            run.fail(requirement, "a stop reason of a turn that was not cancelled", repr(reason))
        else:
            run.set(requirement, Status.PASS, f"stopReason {reason}")
    _judge_updates(run, g.agent, {session}, g.settings.schema)
    _judge_client_calls(run, g.agent.client)


async def _group_cancel(g: _Group) -> None:
    run = g.run
    opened = await _model_session(g)
    if opened is None:
        return
    model, session = opened
    seen = len(g.agent.notifications)
    request_id = await g.agent.start_request("session/prompt", model.prompt(session, "long"))

    # The cancel goes out once the turn is under way: its first content (the model streaming, a tool call), not
    # just any update (available_commands_update may come before the agent even asked its model).
    def under_way() -> bool:
        return any(_is_update(m, session) and _update_kind(m) in _TURN_KINDS for m in g.agent.notifications[seen:])

    await g.agent.wait_until(lambda: g.agent.answered(request_id) is not None or under_way(), g.settings.timeout)
    if g.undriven(("LMB-CANCEL-001", "LMB-CANCEL-002", "LMB-CANCEL-003", "LMB-CANCEL-004")):
        return
    if g.agent.answered(request_id) is not None:
        run.set("LMB-CANCEL-001", Status.SKIPPED, "the turn ended before the cancel was sent (nothing to judge)")
    else:
        await g.agent.notify("session/cancel", {"sessionId": session})
        answer = await g.agent.answer(request_id, g.settings.timeout)
        reason = answer.field("stopReason")
        if reason == "cancelled":
            run.set("LMB-CANCEL-001", Status.PASS)
        else:
            run.fail("LMB-CANCEL-001", "stopReason cancelled", answer.describe() if not answer.ok else repr(reason))
    # A window for stragglers before the next prompt: an update that comes later still is missed (never
    # misjudged), since it cannot be told from the next turn's.
    await trio.sleep(LATE_UPDATE_WINDOW)
    next_id = await g.agent.start_request("session/prompt", model.prompt(session, "short"))
    answer = await g.agent.answer(next_id, g.settings.timeout)
    reason = answer.field("stopReason")
    if answer.ok and reason in STOP_REASONS:
        run.set("LMB-CANCEL-003", Status.PASS, f"stopReason {reason}")
    else:
        run.fail("LMB-CANCEL-003", "the next prompt answered with a stop reason", answer.describe())
    if run.outcomes["LMB-CANCEL-001"].status is not Status.PASS:
        run.set("LMB-CANCEL-002", Status.SKIPPED, "judged only after a turn that ended cancelled (LMB-CANCEL-001)")
        return
    # Content and tool-call updates between the cancelled prompt's answer and the next prompt going out belong to
    # the cancelled turn (other kinds, such as available_commands_update, may come at any time).
    lines = g.agent.transcript
    start = _answer_index(lines, request_id)
    end = next(i for i, line in enumerate(lines) if line.dir == "out" and _request_id(line.message) == next_id)
    late = [
        line.message
        for line in lines[start:end]
        if line.dir == "in" and _is_update(line.message, session) and _update_kind(line.message) in _TURN_KINDS
    ]
    if late:
        kinds = ", ".join(sorted({str(m["params"]["update"].get("sessionUpdate")) for m in late}))
        run.fail("LMB-CANCEL-002", "no session/update after the cancelled prompt's answer", f"{len(late)} ({kinds})")
    else:
        run.set("LMB-CANCEL-002", Status.PASS)
    await _early_cancel(g, model, session)


async def _early_cancel(g: _Group, model: ModelDriver, session: str) -> None:
    """The cancel race: session/cancel right behind the prompt, before the agent has done anything of the turn."""
    request_id = await g.agent.start_request("session/prompt", model.prompt(session, "long"))
    await g.agent.notify("session/cancel", {"sessionId": session})
    answer = await g.agent.answer(request_id, g.settings.timeout)
    reason = answer.field("stopReason")
    if not answer.ok or reason not in STOP_REASONS:
        g.run.fail("LMB-CANCEL-004", "stopReason cancelled", answer.describe() if not answer.ok else repr(reason))
    else:
        g.run.set("LMB-CANCEL-004", Status.PASS, f"stopReason {reason}")


_HISTORY_IDS = ("LMB-SESS-006", "LMB-SESS-007", "LMB-SESS-010", "LMB-SESS-012")


async def _group_history(g: _Group) -> None:
    """A session with one turn, then loaded (and resumed) by fresh processes of the agent."""
    run = g.run
    opened = await _model_session(g)
    if opened is None:
        return
    model, session = opened
    answer = await g.request("session/prompt", model.prompt(session, "short"))
    if g.undriven(_HISTORY_IDS):
        return
    if not answer.ok:
        for requirement in _HISTORY_IDS:
            run.set(
                requirement, Status.NOT_TESTED, f"the turn that gives the session a history failed: {answer.describe()}"
            )
        return
    # What must come back: the model's answer when the kit scripted it (an agent may add notices of its own that
    # are not part of the conversation), else something of what the agent said.
    said = model.answer or _agent_text(g.agent.notifications, session)
    if advertised(g.capabilities, "sessionCapabilities.fork"):
        await _forked(g, model, session)
    # Load and resume as after a restart: the process that held the session is gone.
    await g.agent.stop()
    params = {"sessionId": session, "cwd": str(g.settings.workspace), "mcpServers": []}
    if advertised(g.capabilities, "loadSession"):
        answer, before = await _in_fresh_process(g, "session/load", params)
        problems = _invalid("LoadSessionResponse", answer, g.settings.schema)
        replayed_user = _text_of(before, "user_message_chunk")
        replayed_agent = _text_of(before, "agent_message_chunk")
        if problems:
            run.fail("LMB-SESS-006", "a valid LoadSessionResponse", problems)
        elif _squash(model.short) not in _squash(replayed_user):
            run.fail(
                "LMB-SESS-006",
                f"the user's prompt {model.short!r} replayed as user_message_chunk before the answer",
                f"{len(before)} update(s) before the answer; user text {replayed_user[:120]!r}",
            )
        elif said and not _replayed(said, replayed_agent, exact=model.answer is not None):
            run.fail(
                "LMB-SESS-006",
                f"the agent's answer {said[:80]!r} replayed as agent_message_chunk before the answer",
                f"agent text {replayed_agent[:120]!r}",
            )
        else:
            run.set("LMB-SESS-006", Status.PASS, f"{len(before)} update(s) replayed")
    if advertised(g.capabilities, "sessionCapabilities.resume"):
        answer, before = await _in_fresh_process(g, "session/resume", params)
        history = [m for m in before if _update_kind(m) in _REPLAY_KINDS]
        problems = _invalid("ResumeSessionResponse", answer, g.settings.schema)
        if problems:
            run.fail("LMB-SESS-007", "a valid ResumeSessionResponse", problems)
        elif history:
            run.fail("LMB-SESS-007", "no history replayed before the answer", f"{len(history)} update(s)")
        else:
            run.set("LMB-SESS-007", Status.PASS)
    if advertised(g.capabilities, "sessionCapabilities.delete"):
        await _deleted_from_list(g, session)


async def _forked(g: _Group, model: ModelDriver, session: str) -> None:
    """session/fork (unstable) of the session with one turn, then a prompt in the fork: answered, and the fork's
    model request carries the first turn's prompt as well as its own (when the kit sees the model's requests)."""
    run = g.run
    params = {"sessionId": session, "cwd": str(g.settings.workspace), "mcpServers": []}
    try:  # (a hang is judged here: the group goes on to load and resume, which do not build on the fork)
        answer = await g.request("session/fork", params)
    except TimeoutError as exc:
        run.fail("LMB-SESS-012", "an answer to session/fork", str(exc))
        await _unless_hung(g, exc)
        return
    problems = _invalid("ForkSessionResponse", answer, g.settings.schema)
    fork = answer.field("sessionId")
    if problems:
        run.fail("LMB-SESS-012", "a valid ForkSessionResponse", problems)
        return
    if fork == session:
        run.fail("LMB-SESS-012", "a new session id", f"{fork!r}, the forked session's own")
        return
    asked = len(model.requests()) if model.requests else 0
    try:
        reply = await g.request("session/prompt", model.prompt(str(fork), "short"))
    except TimeoutError as exc:
        run.fail("LMB-SESS-012", "an answer to the fork's prompt", str(exc))
        await _unless_hung(g, exc)
        return
    if not reply.ok:  # (whether its stop reason is valid is LMB-PROMPT-001's)
        run.fail("LMB-SESS-012", "the fork's prompt answered", reply.describe())
        return
    if model.requests is None:
        run.set("LMB-SESS-012", Status.PASS, "forked; its prompt answered (what reached the model is not visible)")
        return
    # The fork's prompt is the first turn's again: its model request has it twice when the history came along.
    carried = any(json.dumps(r.body).count(model.short) >= 2 for r in model.requests()[asked:])
    if carried:
        run.set("LMB-SESS-012", Status.PASS, "forked; its model request carries the first turn")
    else:
        run.fail("LMB-SESS-012", "the first turn in the fork's model request", "only the fork's own prompt")


async def _in_fresh_process(g: _Group, method: str, params: dict[str, Any]) -> tuple[Answer, list[dict[str, Any]]]:
    """``method`` on a fresh process of the agent (after the handshake): its answer, and the session's updates
    that came before it. The process's wire is kept under the method's name."""
    async with open_agent(g.settings.spec, ClientSide(g.settings.workspace)) as fresh:
        g.run.transcripts[method.removeprefix("session/")] = fresh.transcript
        await _handshake(fresh, g.settings)
        request_id = await fresh.start_request(method, params)
        answer = await fresh.answer(request_id, g.settings.timeout)
        return answer, _before_answer(fresh.transcript, request_id, params["sessionId"])


PROBE_TOOL = "*conform*echo"  # the probe server's echo tool, however the agent names it for its model
_PROBE = Path(__file__).with_name("mcp_probe.py")


def _probe_server(log: Path) -> dict[str, Any]:
    """The probe MCP server as ``session/new`` names it: this Python, no site packages, logging to ``log``."""
    args = ["-I", "-S", str(_PROBE), "--log", str(log)]
    return {"name": "conform", "command": sys.executable, "args": args, "env": []}


def _probe_log(log: Path) -> list[dict[str, Any]]:
    try:
        lines = log.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    return [json.loads(line) for line in lines if line.strip()]


@dataclass
class _ProbeSeen:
    """What the probe MCP server received in a turn, with what the scripted model was offered and sent back."""

    received: list[dict[str, Any]]
    asked: list[ModelRequest] | None  # the model's requests (None: not a model the kit sees)

    @classmethod
    def read(cls, log: Path, model: ModelDriver) -> _ProbeSeen:
        return cls(_probe_log(log), model.requests() if model.requests else None)

    @property
    def calls(self) -> list[dict[str, Any]]:
        return [m for m in self.received if m.get("method") == "tools/call" and _params(m).get("name") == "echo"]

    @property
    def offered(self) -> bool | None:
        """Whether the model was offered the probe's echo tool (None: not known)."""
        if self.asked is None:
            return None
        return any(r.tool(name) for r in self.asked for name in _matching(r, PROBE_TOOL))

    def call_problem(self, token: str) -> tuple[str, str] | None:
        """(expected, got) when the first echo call did not carry the model's arguments, or its result did not
        reach the model; None when both did."""
        arguments = _params(self.calls[0]).get("arguments")
        results = [t.text for r in self.asked or () for t in r.tool_results]
        if arguments != {"text": token}:
            return f"arguments {{'text': {token!r}}}", json.dumps(arguments)
        if self.asked is not None and not any(f"echo: {token}" in text for text in results):
            return f"the result 'echo: {token}' in the model's next request", f"results {results}"
        return None


def _params(message: dict[str, Any]) -> dict[str, Any]:
    params = message.get("params")
    return params if isinstance(params, dict) else {}


async def _group_tools(g: _Group) -> None:
    await _stdio_tools(g)
    if advertised(g.capabilities, "mcpCapabilities.http") and g.run.problem is None:
        await _http_tools(g)


async def _http_tools(g: _Group) -> None:
    """A second session whose one MCP server is the probe over HTTP, with a bearer token in its headers."""
    run, model = g.run, g.settings.model
    assert model is not None
    token, secret = f"conform-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    log = Path(g.settings.workspace, f".conform-mcp-http-{token}.ndjson")
    command = [sys.executable, "-I", "-S", str(_PROBE), "--log", str(log), "--http", secret]
    process = await trio.lowlevel.open_process(command, stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert process.stdout is not None
        url = ""
        with trio.move_on_after(g.settings.timeout):
            url = (await process.stdout.receive_some(4096)).decode(errors="replace").partition("\n")[0]
        await process.stdout.aclose()
        if not url.startswith("http://127.0.0.1:"):
            run.problem = f"the HTTP MCP probe did not start (it printed {url!r})"  # the kit's trouble, not judged
            return
        server = {"type": "http", "name": "conform", "url": url, "headers": [
            {"name": "Authorization", "value": f"Bearer {secret}"}]}  # fmt: skip
        session = await g.new_session(None, mcpServers=[server])
        if session is None:
            return
        await g.request("session/prompt", model.prompt(session, "tool", token=token))
        if g.undriven(("LMB-MCP-004",)):
            return
        seen = _ProbeSeen.read(log, model)
    finally:
        with trio.CancelScope(shield=True):
            await stop_process_group(process, 2.0)
        log.unlink(missing_ok=True)
    methods = [m.get("method") for m in seen.received if m.get("authorized")]
    refused = [m.get("method") for m in seen.received if not m.get("authorized")]
    calls, offered = seen.calls, seen.offered
    problem = seen.call_problem(token) if calls else None
    if refused:
        run.fail("LMB-MCP-004", "the Authorization header given in session/new on every request", f"none on {refused}")
    elif not ("initialize" in methods and "tools/list" in methods):
        if calls or offered or model.scripted:
            run.fail("LMB-MCP-004", "initialize and tools/list on the HTTP MCP server", f"methods {methods}")
        else:
            run.set("LMB-MCP-004", Status.SKIPPED, "the model never asked for the tool (inconclusive)")
    elif not calls:
        if offered is False:
            run.set("LMB-MCP-004", Status.SKIPPED, f"connected; no offered tool matched {PROBE_TOOL}: not judged")
        elif model.scripted:
            run.fail("LMB-MCP-004", "the model's call of the echo tool at the HTTP server", "no tools/call arrived")
        else:
            run.set("LMB-MCP-004", Status.SKIPPED, "connected; the model did not call the tool (inconclusive)")
    elif problem is not None:
        run.fail("LMB-MCP-004", *problem)
    else:
        run.set("LMB-MCP-004", Status.PASS, f"{len(seen.received)} message(s) over HTTP, each with the header")


async def _stdio_tools(g: _Group) -> None:
    """The probe's log in a directory of the kit's own (0700), removed afterwards: the agent owns the probe's
    process, which may outlive the check (it keeps its file open, which is no matter) or start late (then it finds
    no directory to write in and exits), and the workspace may be the user's (--workspace)."""
    token = f"conform-{uuid.uuid4().hex[:8]}"
    directory = Path(tempfile.mkdtemp(prefix="lmbridge-conform-mcp-"))
    try:
        await _judge_stdio_tools(g, token, directory / f"{token}.ndjson")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def _judge_stdio_tools(g: _Group, token: str, log: Path) -> None:
    run = g.run
    opened = await _model_session(g, mcpServers=[_probe_server(log)])
    if opened is None:
        return
    model, session = opened
    start = len(g.agent.transcript)
    answer = await g.request("session/prompt", model.prompt(session, "tool", token=token))
    if g.undriven(("LMB-MCP-001", "LMB-MCP-002", "LMB-MCP-003", "LMB-TOOL-001")):
        return
    seen = _ProbeSeen.read(log, model)
    methods = [m.get("method") for m in seen.received]
    calls, offered = seen.calls, seen.offered
    if "initialize" in methods and "tools/list" in methods:
        run.set("LMB-MCP-001", Status.PASS, f"{len(seen.received)} message(s) reached the server")
    elif calls or offered or model.scripted:
        run.fail("LMB-MCP-001", "initialize and tools/list on the stdio MCP server", f"methods {methods}")
    else:
        run.set("LMB-MCP-001", Status.SKIPPED, "the model never asked for the tool (inconclusive)")
    if calls:
        problem = seen.call_problem(token)
        if problem is not None:
            run.fail("LMB-MCP-002", *problem)
        else:
            run.set("LMB-MCP-002", Status.PASS)
    elif offered is False:
        # Not offered directly: the agent may defer MCP tools behind a tool-search tool of its own (Qwen Code does),
        # which a script cannot follow. The spec does not say how tools reach the model: inconclusive.
        why = f"no offered tool matched {PROBE_TOOL}: the agent may defer MCP tools (a tool search); not judged"
        run.set("LMB-MCP-002", Status.SKIPPED, why)
    elif model.scripted:
        run.fail("LMB-MCP-002", "the model's call of the echo tool at the server", "no tools/call arrived")
    else:
        run.set("LMB-MCP-002", Status.SKIPPED, "the model did not call the tool (inconclusive: not a scripted model)")
    if not calls and not (model.scripted and offered is not False):
        why = "judged only when the model called the tool"
        run.set("LMB-MCP-003", Status.SKIPPED, why)
        run.set("LMB-TOOL-001", Status.SKIPPED, why)
        return
    turn = [
        line.message
        for line in g.agent.transcript[start:]
        if line.dir == "in" and isinstance(line.message, dict) and _about_tools(line.message, session)
    ]
    if turn:
        run.set("LMB-MCP-003", Status.PASS)
    else:
        run.fail("LMB-MCP-003", "a tool_call update (or a permission request) for the MCP call", "none")
    problems = _tool_call_problems(turn, ended=answer.ok)
    if problems:
        run.fail("LMB-TOOL-001", "consistent tool call updates", "; ".join(problems[:3]))
    else:
        run.set("LMB-TOOL-001", Status.PASS)


def _matching(request: ModelRequest, globs: str) -> list[str]:
    return [name for name in request.tool_names if any(fnmatch.fnmatchcase(name, g) for g in globs.split("|"))]


def _about_tools(message: dict[str, Any], session: str) -> bool:
    """A tool call or its update for ``session``, or a permission request (which announces its tool call)."""
    if message.get("method") == "session/request_permission":
        params = message.get("params")
        return isinstance(params, dict) and params.get("sessionId") == session
    return _is_update(message, session) and _update_kind(message) in ("tool_call", "tool_call_update")


def _tool_call_problems(messages: list[dict[str, Any]], *, ended: bool) -> list[str]:
    """What is inconsistent in a turn's tool calls (``_about_tools`` messages, in order)."""
    order = {"pending": 0, "in_progress": 1, "completed": 2, "failed": 2}
    status: dict[str, str] = {}
    problems = []
    for message in messages:
        if message.get("method") == "session/request_permission":
            tool_call = message["params"].get("toolCall")
            if isinstance(tool_call, dict):
                status.setdefault(str(tool_call.get("toolCallId")), tool_call.get("status") or "pending")
            continue
        update = message["params"]["update"]
        kind, call_id = update.get("sessionUpdate"), update.get("toolCallId")
        if kind == "tool_call":
            status[call_id] = update.get("status") or "pending"
        elif kind == "tool_call_update":
            if call_id not in status:
                problems.append(f"tool_call_update for {call_id!r}, never announced")
                continue
            new, old = update.get("status"), status[call_id]
            if new is None or new == old:
                continue
            if order.get(new, 0) < order.get(old, 0) or old in ("completed", "failed"):
                problems.append(f"{call_id}: {old} -> {new}")
            status[call_id] = new
    if ended:
        problems += [
            f"{call_id} left {value}" for call_id, value in status.items() if value in ("pending", "in_progress")
        ]
    return problems


_PERMISSION_IDS = ("LMB-PERM-001", "LMB-PERM-002", "LMB-PERM-003", "LMB-PERM-004")


_PERMISSION_FILES = ("rejected", "cancelled", "always")  # conform-NAME-TOKEN: what each check's command touches


async def _group_permissions(g: _Group) -> None:
    opened = await _model_session(g)
    if opened is None:
        return
    model, session = opened
    token = uuid.uuid4().hex[:8]
    try:
        await _permissions(g, model, session, token)
    finally:  # (the workspace may be the user's: --workspace)
        for name in _PERMISSION_FILES:
            Path(g.settings.workspace, f"conform-{name}-{token}").unlink(missing_ok=True)


async def _permissions(g: _Group, model: ModelDriver, session: str, token: str) -> None:
    run, client = g.run, g.agent.client
    rejected = Path(g.settings.workspace, f"conform-rejected-{token}")
    client.permission_answer = "reject"
    await g.request("session/prompt", model.prompt(session, "shell", command=f"touch {rejected}"))
    if g.undriven(_PERMISSION_IDS):
        return
    asked = [params for method, params in client.requests if method == "session/request_permission"]
    if not asked:
        why = "the agent asked no permission before the command (its policy, or no shell call reached it)"
        for requirement in _PERMISSION_IDS:
            run.set(requirement, Status.SKIPPED, why)
        return
    problems = [p for params in asked for p in validate("RequestPermissionRequest", params, g.settings.schema)]
    foreign = [params.get("sessionId") for params in asked if params.get("sessionId") != session]
    if problems or foreign:
        run.fail("LMB-PERM-001", "valid permission requests for the session", "; ".join(problems) or f"{foreign}")
    else:
        run.set("LMB-PERM-001", Status.PASS, f"{len(asked)} request(s)")
    if rejected.exists():
        run.fail("LMB-PERM-002", f"no {rejected.name} (the command was rejected)", "the file was created")
    else:
        run.set("LMB-PERM-002", Status.PASS)
    await _cancel_while_asking(g, model, session, token)
    await _allowed_always(g, model, session, token)


async def _cancel_while_asking(g: _Group, model: ModelDriver, session: str, token: str) -> None:
    run, client = g.run, g.agent.client
    pending = Path(g.settings.workspace, f"conform-cancelled-{token}")
    client.permission_answer = "hold"
    request_id = await g.agent.start_request(
        "session/prompt", model.prompt(session, "shell", command=f"touch {pending}")
    )
    await g.agent.wait_until(lambda: bool(g.agent.held) or g.agent.answered(request_id) is not None, g.settings.timeout)
    if not g.agent.held:
        run.set("LMB-PERM-003", Status.SKIPPED, "no permission request was pending (the turn ended, or none came)")
        return
    await g.agent.notify("session/cancel", {"sessionId": session})
    for request in list(g.agent.held):
        await g.agent.respond(request, {"result": {"outcome": {"outcome": "cancelled"}}})
    answer = await g.agent.answer(request_id, g.settings.timeout)
    reason = answer.field("stopReason")
    if reason != "cancelled":
        run.fail("LMB-PERM-003", "stopReason cancelled", answer.describe() if not answer.ok else repr(reason))
    elif pending.exists():
        run.fail("LMB-PERM-003", f"no {pending.name} (the turn was cancelled)", "the file was created")
    else:
        run.set("LMB-PERM-003", Status.PASS)


async def _allowed_always(g: _Group, model: ModelDriver, session: str, token: str) -> None:
    """The same command twice in the session, the first allowed with the agent's allow_always option: the second
    should not be asked about (which operations "the choice" covers beyond the very same one is the agent's)."""
    run, client = g.run, g.agent.client
    client.permission_answer = "always"
    command = f"touch {Path(g.settings.workspace, f'conform-always-{token}')}"

    def asked_since(count: int) -> list[Any]:
        return [params for method, params in client.requests[count:] if method == "session/request_permission"]

    before = len(client.requests)
    await g.request("session/prompt", model.prompt(session, "shell", command=command))
    first = asked_since(before)
    kinds = {o.get("kind") for p in first if isinstance(p, dict) for o in p.get("options") or () if isinstance(o, dict)}
    if not first:
        run.set("LMB-PERM-004", Status.SKIPPED, "the agent asked no permission before the command this time")
        return
    if "allow_always" not in kinds:
        run.set("LMB-PERM-004", Status.SKIPPED, "its permission request offered no allow_always option")
        return
    again = len(client.requests)
    await g.request("session/prompt", model.prompt(session, "shell", command=command))
    if asked_since(again):
        run.fail("LMB-PERM-004", "no permission request for the same command", f"{len(asked_since(again))} request(s)")
    else:
        run.set("LMB-PERM-004", Status.PASS)


# A 1×1 PNG and eight samples of 8 kHz WAV: real files, for agents that look inside.
_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
_WAV = "UklGRiwAAABXQVZFZm10IBAAAAABAAEAQB8AAEAfAAABAAgAZGF0YQgAAACAgICAgICAgA=="


_CONTENT_IDS = tuple(f"LMB-CONTENT-00{number}" for number in range(1, 6))


def _content_blocks(workspace: Path, token: str) -> list[tuple[str, str | None, dict[str, Any], str]]:
    """(requirement, the capability it needs, the block, what of it the model should see) for each kind."""
    uri = (workspace / f"{token}-notes.md").as_uri()
    return [
        ("LMB-CONTENT-001", None, {"type": "resource_link", "uri": uri, "name": f"{token}-notes.md"}, token),
        ("LMB-CONTENT-002", "promptCapabilities.image", {"type": "image", "mimeType": "image/png", "data": _PNG}, _PNG),
        ("LMB-CONTENT-003", "promptCapabilities.audio", {"type": "audio", "mimeType": "audio/wav", "data": _WAV}, _WAV),
        (
            "LMB-CONTENT-004",
            "promptCapabilities.embeddedContext",
            {"type": "resource", "resource": {"uri": uri, "mimeType": "text/markdown", "text": f"notes {token}"}},
            f"notes {token}",
        ),
    ]


async def _group_content(g: _Group) -> None:
    """One prompt per kind of content block the agent takes (a resource link always; image, audio and embedded
    resources when advertised: a client must not send them otherwise), each beside a short text."""
    opened = await _model_session(g)
    if opened is None:
        return
    model, session = opened
    token = f"conform-{uuid.uuid4().hex[:8]}"
    kinds = _content_blocks(g.settings.workspace, token)
    linked = Path(g.settings.workspace, f"{token}-notes.md")  # what the resource link names: there, to be read
    linked.write_text(f"notes {token}\n")
    try:
        await _send_content(g, model, session, kinds)
    finally:
        linked.unlink(missing_ok=True)


async def _send_content(
    g: _Group, model: ModelDriver, session: str, kinds: list[tuple[str, str | None, dict[str, Any], str]]
) -> None:
    run = g.run
    plain = await g.request("session/prompt", model.prompt(session, "short"))
    if plain.field("stopReason") not in STOP_REASONS:  # what builds on a working prompt is not judged here: the
        why = f"a prompt of text alone did not end well either ({plain.describe()}): see LMB-PROMPT-001"  # prompt
        for requirement in _CONTENT_IDS:  # group says what failed
            run.set(requirement, Status.SKIPPED, why)
        return
    reached: list[str] = []
    for requirement, capability, block, mark in kinds:
        if capability is not None and not advertised(g.capabilities, capability):
            run.set(requirement, Status.SKIPPED, f"{capability} is not advertised")
            continue
        params = model.prompt(session, "short")
        params["prompt"].append(block)
        before = len(model.requests()) if model.requests else 0
        answer = await g.request("session/prompt", params)
        reason = answer.field("stopReason")
        if not answer.ok:
            run.fail(requirement, f"a stop reason for a prompt with its {block['type']} block", answer.describe())
        elif reason == "cancelled" or reason not in STOP_REASONS:
            run.fail(requirement, "a stop reason of a turn that was not cancelled", repr(reason))
        else:
            run.set(requirement, Status.PASS, f"stopReason {reason}")
        if model.requests is not None and answer.ok:
            got = any(mark in request.text for request in model.requests()[before:])
            reached.append(f"{block['type']}: {'reached' if got else 'did not reach'} the model")
    if g.undriven(_CONTENT_IDS):
        return
    if not reached:
        run.set("LMB-CONTENT-005", Status.SKIPPED, "the model's requests are not visible to the kit")
    else:
        missing = any("did not" in line for line in reached)
        run.set("LMB-CONTENT-005", Status.FAIL if missing else Status.PASS, "; ".join(reached))


_CLIENT_IDS = ("LMB-FS-001", "LMB-TERM-001", "LMB-TERM-002", "LMB-TERM-003", "LMB-TERM-004", "LMB-CANCEL-005")
_STARTED_GRACE = 5.0  # s from the turn's tool call to the command's terminal or process


async def _group_client(g: _Group) -> None:
    """The client advertises its file system and terminals (``_ADVERTISING``); the model runs a command and reads
    a file. What the agent asks of the client is judged; whether it asks at all is its choice (INFORMATIONAL)."""
    run, client = g.run, g.agent.client
    opened = await _model_session(g)
    if opened is None:
        return
    model, session = opened
    token = f"conform-{uuid.uuid4().hex[:8]}"
    readable = Path(g.settings.workspace, f"{token}.txt")
    readable.write_text(f"the file says {token}-read\n")
    try:
        await g.request("session/prompt", model.prompt(session, "shell", command=f"echo {token}-ran"))
        await g.request("session/prompt", model.prompt(session, "read", path=str(readable)))
    finally:
        readable.unlink(missing_ok=True)
    if g.undriven(_CLIENT_IDS):
        return
    files = [(method, params) for method, params in client.requests if method.startswith("fs/")]
    terminals = list(client.terminals.created)  # (the cancel check below adds its own)
    _judge_file_requests(g, session, files)
    _judge_terminal_requests(g, session, [p for m, p in client.requests if m == "terminal/create"])
    if terminals:
        await _judge_releases(g, session, terminals)
    else:
        run.set("LMB-TERM-002", Status.SKIPPED, "the agent created no terminal")
    _judge_what_reached(g, model, token, terminals, read=any(method == "fs/read_text_file" for method, _ in files))
    await _stopped_on_cancel(g, model)


def _judge_what_reached(g: _Group, model: ModelDriver, token: str, terminals: list[Terminal], *, read: bool) -> None:
    """LMB-TERM-003: whether the agent used the client's terminal and file system, and whether what they gave
    reached its model."""
    run = g.run
    found = [
        "ran the command in a client terminal" if terminals else "ran the command itself (no terminal/create)",
        "read the file through fs/read_text_file" if read else "read the file itself (no fs/read_text_file)",
    ]
    if not terminals and not read:
        run.set("LMB-TERM-003", Status.SKIPPED, "; ".join(found) + ": the spec allows it")
        return
    asked = model.requests() if model.requests else None
    results = " ".join(t.text for r in asked or () for t in r.tool_results)
    lost = [
        what
        for what, used, mark in (("the command's output", terminals, "ran"), ("the file's content", read, "read"))
        if asked is not None and used and f"{token}-{mark}" not in results
    ]
    if lost:
        run.set("LMB-TERM-003", Status.FAIL, "; ".join(found) + f"; {' and '.join(lost)} did not reach the model")
    else:
        run.set("LMB-TERM-003", Status.PASS, "; ".join(found))


async def _stopped_on_cancel(g: _Group, model: ModelDriver) -> None:
    """In a session of its own: a command that would run for minutes, cancelled once it runs — in a client
    terminal (LMB-TERM-004: the agent should stop it with terminal/kill, or terminal/release, which kills) or in a
    process of the agent's own (LMB-CANCEL-005: found by the followed file's name on its command line; gone by the
    time the prompt is answered, or right after)."""
    run = g.run
    session = await g.new_session(None)
    if session is None:
        for requirement in ("LMB-TERM-004", "LMB-CANCEL-005"):
            run.set(requirement, Status.NOT_TESTED, "a second session/new failed")
        return
    # A command that runs until it is killed, named by a file no other process on the machine has open (an agent
    # may refuse a long standalone sleep: Claude Code does).
    followed = Path(g.settings.workspace, f"conform-follow-{uuid.uuid4().hex[:8]}.log")
    prompt = model.prompt(session, "shell", command=f"tail -f {followed}")
    # The command's processes are found by the file's name, not its path: the name's random token makes it as
    # unique on the machine as the path, and it is found however the agent spells the path (relative to its cwd,
    # through a symlink, resolved), where the whole path is not.
    text = " ".join(block["text"] for block in prompt["prompt"] if block.get("type") == "text")
    watch = _CommandProcesses(followed.name, g.agent.client.terminals, _ancestry(g.agent.pid), text)
    followed.touch()
    try:
        await _cancel_the_command(g, session, prompt, watch)
    finally:
        # Whatever was decided, nothing of the command outlives the check: what the agent left running in a session
        # of its own would outlive its process group, and the kit. (The kit's own terminals it stops itself.)
        with trio.CancelScope(shield=True):
            try:
                killed = await watch.kill_left(g.settings.timeout)
            except TimeoutError:
                killed = []
        followed.unlink(missing_ok=True)
        outcome = run.outcomes.get("LMB-CANCEL-005")
        if killed and outcome is not None:
            said = f"the kit then killed what was still running: {'; '.join(map(str, killed))[:300]}"
            outcome.detail = f"{outcome.detail}; {said}" if outcome.detail else said


async def _cancel_the_command(g: _Group, session: str, prompt: dict[str, Any], watch: _CommandProcesses) -> None:
    run, terminals = g.run, g.agent.client.terminals
    before, seen = len(terminals.created), len(g.agent.notifications)
    request_id = await g.agent.start_request("session/prompt", prompt)

    def terminal() -> Terminal | None:
        """The session's terminal that runs the command (an agent may run others beside it, before it)."""
        return next((t for t in terminals.created[before:] if t.session == session and _runs(t, watch.marker)), None)

    async def agent_processes() -> list[_Process]:
        return await watch.decided(g.settings.timeout)

    async def started() -> bool:
        return terminal() is not None or g.agent.answered(request_id) is not None or bool(await agent_processes())

    async def reported_or_started() -> bool:
        told = any(_is_update(m, session) and _update_kind(m) == "tool_call" for m in g.agent.notifications[seen:])
        return told or await started()

    await _poll(reported_or_started, g.settings.timeout)
    await _poll(started, _STARTED_GRACE)
    used = terminal()
    if g.agent.answered(request_id) is not None or (used is None and not await agent_processes()):
        why = "the turn ended before the command ran" if g.agent.answered(request_id) else "the command never ran"
        for requirement in ("LMB-TERM-004", "LMB-CANCEL-005"):
            run.set(requirement, Status.SKIPPED, why)
        if g.agent.answered(request_id) is None:
            await g.agent.notify("session/cancel", {"sessionId": session})
            await g.agent.answer(request_id, g.settings.timeout)
        return
    requirement = "LMB-TERM-004" if used is not None else "LMB-CANCEL-005"
    other = "LMB-CANCEL-005" if used is not None else "LMB-TERM-004"
    how = "in a client terminal" if used is not None else "in a process of the agent's own"
    run.set(other, Status.SKIPPED, f"the agent ran the command {how} ({requirement})")

    async def stopped() -> bool:
        return used.stopped if used is not None else not await agent_processes()

    await g.agent.notify("session/cancel", {"sessionId": session})
    try:
        await g.agent.answer(request_id, g.settings.timeout)
    except TimeoutError as exc:  # it waits for the command to end by itself
        run.fail(requirement, "the command stopped and the prompt answered", f"{exc}; stopped: {await stopped()}")
        return
    if await stopped():
        run.set(requirement, Status.PASS, f"ran {how}; stopped before the prompt was answered")
        return
    if await _poll(stopped, LATE_UPDATE_WINDOW):
        run.set(requirement, Status.PASS, f"ran {how}; stopped right after the prompt was answered")
    elif used is not None:
        run.fail(requirement, "terminal/kill or terminal/release", "the command was left running")
    else:
        left = "; ".join(map(str, await agent_processes()))[:300]
        run.fail(requirement, "no process of the command left", f"still running: {left}")


def _runs(terminal: Terminal, marker: str) -> bool:
    """Whether the terminal's command line (its command and arguments, as the agent sent them) contains ``marker``."""
    parts = (terminal.request.get("command"), *(terminal.request.get("args") or ()))
    return any(isinstance(part, str) and marker in part for part in parts)


async def _poll(condition: Callable[[], Awaitable[bool]], timeout: float) -> bool:
    """Wait until ``condition()`` holds, looking every 50 ms (it may depend on more than the agent's messages)."""
    with trio.move_on_after(timeout):
        while not await condition():  # noqa: ASYNC110 (a process's end is not an event of ours)
            await trio.sleep(0.05)
        return True
    return False


@dataclass(frozen=True)
class _Process:
    """One process of the machine, as /proc shows it."""

    pid: int
    session: int  # its session's id
    argv: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.pid}: {' '.join(self.argv)}"


@dataclass
class _CommandProcesses:
    """The processes of the kit's long command that the agent runs itself: those whose command line contains
    ``marker``, but
    - those in the sessions of the kit's own terminals (each runs in a session of its own): the kit's, and judged
      as terminals;
    - ``ancestry``, the agent's process and its ancestors (the kit's among them): their command lines were set
      before the file existed, so they name it only by accident, and they are never the command;
    - those with an argument that carries ``prompt``, the prompt's text: an adapter that hands the turn to a CLI
      of its own (``cli -p PROMPT``) names the file on that CLI's command line without running the command.
    """

    marker: str
    terminals: ClientTerminals
    ancestry: frozenset[int] = frozenset()
    prompt: str | None = None

    async def scan(self) -> list[_Process] | None:
        """What runs now; None (not decided) while a kit terminal is being started, since its process may be among
        those found before it is listed as the kit's. The scan reads a file of every process on the machine: in a
        thread, so the kit answers the agent meanwhile."""
        found = await trio.to_thread.run_sync(_processes_with, self.marker, self.ancestry)
        if self.terminals.spawning:
            return None
        kits = {t.process.pid for t in self.terminals.created}  # (read after the scan: it lists what started during it)
        prompt = self.prompt
        return [p for p in found if p.session not in kits and not (prompt and any(prompt in a for a in p.argv))]

    async def kill_left(self, timeout: float) -> list[_Process]:
        """SIGKILL each process of the command still running; those signalled. Each alone, not its group: a command
        left in the agent's own process group would take the agent with it."""
        killed = []
        for process in await self.decided(timeout):
            try:
                os.kill(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue
            killed.append(process)
        return killed

    async def decided(self, timeout: float) -> list[_Process]:
        """``scan``, again once no kit terminal is being started (a start takes milliseconds)."""
        with trio.move_on_after(timeout):
            while (found := await self.scan()) is None:
                await self.terminals.settled()
            return found
        raise TimeoutError(f"a client terminal was still being started after {timeout:g} s")


def _processes_with(marker: str, but_pids: Collection[int] = ()) -> list[_Process]:
    """This machine's processes whose command line contains ``marker``, but ``but_pids`` and the kit's own process
    (Linux's /proc; none elsewhere)."""
    found = []
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid() or int(entry.name) in but_pids:
            continue
        try:
            with open(os.path.join(entry.path, "cmdline"), "rb") as handle:
                argv = tuple(handle.read().decode(errors="replace").split("\0"))
            if argv and not argv[-1]:  # (each argument ends with a NUL)
                argv = argv[:-1]
            if not any(marker in arg for arg in argv):
                continue
            with open(os.path.join(entry.path, "stat"), "rb") as handle:  # pid (comm) state ppid pgrp session …
                session = int(handle.read().rsplit(b")", 1)[1].split()[3])
        except (OSError, ValueError, IndexError):
            continue
        found.append(_Process(int(entry.name), session, argv))
    return found


def _ancestry(pid: int) -> frozenset[int]:
    """``pid`` and its ancestors, up to the first process (Linux's /proc; ``pid`` alone elsewhere)."""
    found = {pid}
    while pid > 1:
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:  # pid (comm) state ppid …
                pid = int(handle.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        found.add(pid)
    return frozenset(found)


def _judge_file_requests(g: _Group, session: str, files: list[tuple[str, Any]]) -> None:
    if not files:
        g.run.set("LMB-FS-001", Status.SKIPPED, "the agent made no fs/* request (it may read and write files itself)")
        return
    schemas = {"fs/read_text_file": "ReadTextFileRequest", "fs/write_text_file": "WriteTextFileRequest"}
    problems = []
    for method, params in files:
        path = params.get("path") if isinstance(params, dict) else None
        if method in schemas:
            problems += validate(schemas[method], params, g.settings.schema)
        if not isinstance(params, dict) or params.get("sessionId") != session:
            problems.append(f"{method} for session {params.get('sessionId') if isinstance(params, dict) else None!r}")
        if not isinstance(path, str) or not os.path.isabs(path):
            problems.append(f"{method} path {path!r} is not absolute")
    if problems:
        g.run.fail("LMB-FS-001", "the session's id and absolute paths", "; ".join(problems[:3]))
    else:
        g.run.set("LMB-FS-001", Status.PASS, f"{len(files)} request(s)")


def _judge_terminal_requests(g: _Group, session: str, creates: list[Any]) -> None:
    """Every ``terminal/create`` the agent sent, including those the client refused."""
    if not creates:
        g.run.set("LMB-TERM-001", Status.SKIPPED, "the agent created no terminal (it may run commands itself)")
        return
    problems = []
    for params in creates:
        if not isinstance(params, dict):
            problems.append(f"terminal/create params {params!r}")
            continue
        problems += validate("CreateTerminalRequest", params, g.settings.schema)
        if params.get("sessionId") != session:
            problems.append(f"terminal/create for session {params.get('sessionId')!r}")
        cwd = params.get("cwd")
        if cwd is not None and not (isinstance(cwd, str) and os.path.isabs(cwd)):
            problems.append(f"cwd {cwd!r} is not absolute")
    if problems:
        g.run.fail("LMB-TERM-001", "valid terminal/create requests for the session", "; ".join(problems[:3]))
    else:
        g.run.set("LMB-TERM-001", Status.PASS, f"{len(creates)} terminal(s)")


async def _judge_releases(g: _Group, session: str, terminals: list[Terminal]) -> None:
    """Released by the end of the turn, or at the latest when the session is closed (the spec's "when it's no longer
    needed": an agent may keep a terminal between turns, never past its session)."""

    def unreleased() -> list[str]:
        return [t.id for t in terminals if not t.released]

    if not unreleased():
        g.run.set("LMB-TERM-002", Status.PASS, f"{len(terminals)} terminal(s), each released in its turn")
        return
    if not advertised(g.capabilities, "sessionCapabilities.close"):
        left = ", ".join(unreleased())
        why = f"{left} outlived the turn; without session/close, when it is no longer needed is not known"
        g.run.set("LMB-TERM-002", Status.SKIPPED, why)
        return
    await g.request("session/close", {"sessionId": session})
    await g.agent.wait_until(lambda: not unreleased(), LATE_UPDATE_WINDOW)
    if unreleased():
        g.run.fail("LMB-TERM-002", "terminal/release for each terminal", f"{', '.join(unreleased())} never released")
    else:
        g.run.set("LMB-TERM-002", Status.PASS, "released when the session was closed")


async def _group_logout(g: _Group) -> None:
    """``logout``, then a new session: it opens (the agent needs no login) or is refused with ``auth_required``
    until ``authenticate``. Its own process: what follows a logout is not what the other groups test."""
    run = g.run
    await _handshake(g.agent, g.settings)
    answer = await g.request("logout", {})
    _judge(run, "LMB-AUTH-001", "LogoutResponse", answer, g.settings.schema)
    if not answer.ok:
        run.set("LMB-AUTH-002", Status.SKIPPED, f"logout did not succeed ({answer.describe()})")
        return
    after = await g.request("session/new", {"cwd": str(g.settings.workspace), "mcpServers": []})
    if after.ok:
        run.set("LMB-AUTH-002", Status.PASS, "a session opened without authenticating again")
    elif after.error_code() == -32000:
        run.set("LMB-AUTH-002", Status.PASS, "session/new answered auth_required (-32000): authenticate again")
    else:
        run.fail("LMB-AUTH-002", "a session, or error -32000 (auth_required)", after.describe())


async def _group_shutdown(g: _Group) -> None:
    await _handshake(g.agent, g.settings)
    started = g.agent.now()
    await g.agent.close_stdin()
    code = await g.agent.wait_exit(SHUTDOWN_SECONDS)
    took = g.agent.now() - started
    if code is None:
        g.run.set("LMB-SHUT-001", Status.FAIL, f"still running {SHUTDOWN_SECONDS:g} s after its stdin was closed")
    else:
        g.run.set("LMB-SHUT-001", Status.PASS, f"exited with status {code} after {took:.2f} s", seconds=took)


GroupFunction = Callable[[_Group], Awaitable[None]]
GROUPS: dict[str, GroupFunction] = {
    "initialize": _group_initialize,
    "negotiation": _group_negotiation,
    "sessions": _group_sessions,
    "robustness": _group_robustness,
    "prompt": _group_prompt,
    "content": _group_content,
    "cancel": _group_cancel,
    "history": _group_history,
    "tools": _group_tools,
    "permissions": _group_permissions,
    "client": _group_client,
    "logout": _group_logout,
    "shutdown": _group_shutdown,
}
# The groups whose client advertises its file system and terminals (the others: nothing, so that LMB-CAP-001 can
# be judged).
_ADVERTISING = ("client",)


async def run_group(name: str, settings: Settings, capabilities: dict[str, Any]) -> GroupRun:
    """One group on a fresh agent process. Never raises for the agent's behaviour: what went wrong is the
    group's ``problem`` (or ``blocked``)."""
    run = GroupRun(name)
    offers = name in _ADVERTISING
    client = ClientSide(settings.workspace, fs_read=offers, fs_write=offers, terminal=offers)
    client.terminals = ClientTerminals(str(settings.workspace), settings.spec.env)
    started = trio.current_time()
    asked = settings.model.requests if settings.model is not None else None
    before = len(asked()) if asked is not None else 0
    try:
        async with open_agent(settings.spec, client) as agent:
            run.transcripts["main"] = agent.transcript
            group = _Group(run, agent, settings, capabilities, before)
            try:
                await GROUPS[name](group)
            except Blocked as exc:
                run.blocked = str(exc)
            except TimeoutError as exc:
                run.problem = f"the agent did not answer: {exc}"
            except AgentGone as exc:
                run.problem = str(exc)
            finally:
                run.stderr_tail = agent.stderr_tail()
                run.stderr_bytes = agent.stderr_bytes
    except OSError as exc:
        run.problem = f"cannot start {settings.spec.argv[0]!r}: {exc.strerror or exc}"
    run.seconds = trio.current_time() - started
    if asked is not None:
        run.model_requests = [
            {"api": r.api, "path": r.path, "tools": r.tool_names[:40], "scripted": r.turn is not None}
            for r in asked()[before:]
        ]
    return run


# -- judging the whole run's wire ------------------------------------------------------------------------------------


def judge_transcripts(runs: list[GroupRun]) -> dict[str, Outcome]:
    """The requirements judged over every line of every group: envelope, stdout discipline, stderr volume."""
    envelope: list[str] = []
    stdout: list[str] = []
    ours: dict[str, set[Any]] = {}
    for run in runs:
        lines = [
            (label, line)
            for label, transcript in run.transcripts.items()
            for index, line in enumerate(transcript)
            if not any(label == e and start <= index < end for e, start, end in run.exempt)
        ]
        for label, line in lines:
            sent = ours.setdefault(f"{run.group}:{label}", set())
            if line.dir == "out":
                if isinstance(line.message, dict) and "method" in line.message and "id" in line.message:
                    sent.add(json.dumps(line.message["id"]))
                continue
            if line.message is None:
                stdout.append(f"[{run.group}] {line.raw[:160]!r}")
                continue
            problem = _envelope_problem(line.message, sent)
            if problem:
                envelope.append(f"[{run.group}] {problem}: {json.dumps(line.message)[:160]}")
    outcomes = {
        "LMB-RPC-003": _aggregate("LMB-RPC-003", envelope, "messages that are JSON-RPC 2.0"),
        "LMB-STDIO-001": _aggregate("LMB-STDIO-001", stdout, "only JSON-RPC messages on stdout"),
    }
    total = sum(run.stderr_bytes for run in runs)
    outcomes["LMB-STDIO-003"] = Outcome("LMB-STDIO-003", Status.PASS, f"{total} bytes over {len(runs)} process(es)")
    return outcomes


def _aggregate(requirement: str, findings: list[str], expected: str) -> Outcome:
    if not findings:
        return Outcome(requirement, Status.PASS)
    shown = "; ".join(findings[:3]) + (f"; and {len(findings) - 3} more" if len(findings) > 3 else "")
    return Outcome(requirement, Status.FAIL, f"expected {expected}; got {len(findings)} other(s): {shown}")


def _envelope_problem(message: Any, sent_ids: set[str]) -> str | None:
    if not isinstance(message, dict):
        return "not a JSON object"
    if message.get("jsonrpc") != "2.0":
        return 'jsonrpc is not "2.0"'
    if "method" in message:
        if not isinstance(message["method"], str):
            return "a method that is not a string"
        return None
    if "id" not in message:
        kind = "an error" if "error" in message else "a result" if "result" in message else "a message"
        return f"{kind} without an id (a response's id is required; null when the request's could not be read)"
    if ("result" in message) == ("error" in message):
        return "a response with both or neither of result and error"
    if json.dumps(message["id"]) not in sent_ids and message["id"] is not None:
        return f"a response to id {message['id']!r}, which the client never sent"
    if "error" in message:
        error = message["error"]
        if not isinstance(error, dict) or not _is_int(error.get("code")) or not isinstance(error.get("message"), str):
            return "an error without an integer code and a string message"
    return None


# -- helpers ---------------------------------------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def advertised(capabilities: dict[str, Any], path: str) -> bool:
    """Whether a capability is advertised: ``true``, or an object (``{}`` advertises a session capability)."""
    value: Any = capabilities
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value is True or isinstance(value, dict)


def _invalid(definition: str, answer: Answer, schema: JsonSchema | None) -> str:
    """What is wrong with ``answer`` as a successful ``definition``; empty when nothing is."""
    if not answer.ok:
        return answer.describe()
    result = answer.result
    if definition in ("CloseSessionResponse", "LoadSessionResponse") and result is None:
        result = {}  # the spec's own example answers session/load with null
    problems = validate(definition, result, schema)
    return "; ".join(problems)


def _judge(run: GroupRun, requirement: str, definition: str, answer: Answer, schema: JsonSchema | None) -> None:
    problems = _invalid(definition, answer, schema)
    if problems:
        run.fail(requirement, f"a valid {definition}", problems)
    else:
        run.set(requirement, Status.PASS)


def _judge_unknown_method(run: GroupRun, answer: Answer, answered: str, code: str) -> None:
    run.set(answered, Status.PASS, answer.describe())  # answered at all: what the MUST asks (an error or not)
    if answer.ok:
        run.fail(code, "error -32601 (Method not found)", "a result")
    elif answer.error_code() == -32601:
        run.set(code, Status.PASS)
    else:
        run.fail(code, "error -32601 (Method not found)", answer.describe())


async def _still_answers(g: _Group) -> str | None:
    """None when the agent still answers a request; else what happened."""
    try:
        await g.request("lmbridge.conform/ping", {})
    except TimeoutError:
        return f"the next request was not answered within {g.settings.timeout:g} s"
    return None


def _stray_responses(lines: list[TranscriptLine]) -> list[dict[str, Any]]:
    """Responses (no method) in ``lines`` that answer none of the kit's requests: no id, or a null one."""
    return [
        line.message
        for line in lines
        if line.dir == "in"
        and isinstance(line.message, dict)
        and "method" not in line.message
        and line.message.get("id") is None
    ]


def _prompt(session: str, text: str) -> dict[str, Any]:
    return {"sessionId": session, "prompt": [{"type": "text", "text": text}]}


def _is_update(message: Any, session: str | None = None) -> bool:
    if not isinstance(message, dict) or message.get("method") != "session/update":
        return False
    params = message.get("params")
    if not isinstance(params, dict) or not isinstance(params.get("update"), dict):
        return session is None
    return session is None or params.get("sessionId") == session


def _update_kind(message: dict[str, Any]) -> Any:
    update = message["params"].get("update")
    return update.get("sessionUpdate") if isinstance(update, dict) else None


def _judge_updates(run: GroupRun, agent: LiveAgent, sessions: set[str], schema: JsonSchema | None) -> None:
    findings: list[str] = []
    for message in agent.notifications:
        if message.get("method") != "session/update":
            continue
        params = message.get("params")
        problems = validate("SessionNotification", params, schema)
        if problems:
            findings.append("; ".join(problems))
        elif isinstance(params, dict) and params.get("sessionId") not in sessions:
            findings.append(f"an update for session {params.get('sessionId')!r}, which the agent did not create")
    if findings:
        shown = " | ".join(findings[:3]) + (f" | and {len(findings) - 3} more" if len(findings) > 3 else "")
        run.fail("LMB-PROMPT-002", "valid session/update notifications", shown)
    else:
        count = sum(1 for m in agent.notifications if m.get("method") == "session/update")
        run.set("LMB-PROMPT-002", Status.PASS, f"{count} update(s)")


def _judge_client_calls(run: GroupRun, client: ClientSide) -> None:
    offered = {"fs/read_text_file": client.fs_read, "fs/write_text_file": client.fs_write}
    wrong = [
        method
        for method, _ in client.requests
        if (method in offered and not offered[method]) or (method.startswith("terminal/") and not client.terminal)
    ]
    if wrong:
        run.fail("LMB-CAP-001", "no fs/terminal calls (the client advertised none)", ", ".join(sorted(set(wrong))))
    else:
        run.set("LMB-CAP-001", Status.PASS, f"{len(client.requests)} request(s) from the agent, none to fs/terminal")


def _request_id(message: Any) -> Any:
    return message.get("id") if isinstance(message, dict) and "method" in message else None


def _sent_index(transcript: list[TranscriptLine], request_id: int) -> int:
    """Where our request ``request_id`` is in the transcript."""
    return next(i for i, line in enumerate(transcript) if line.dir == "out" and _request_id(line.message) == request_id)


def _answer_index(transcript: list[TranscriptLine], request_id: int) -> int:
    """Where the answer to our request ``request_id`` is in the transcript (its length when absent)."""
    for index, line in enumerate(transcript):
        message = line.message
        if (
            line.dir == "in"
            and isinstance(message, dict)
            and "method" not in message
            and message.get("id") == request_id
        ):
            return index
    return len(transcript)


def _before_answer(transcript: list[TranscriptLine], request_id: int, session: str) -> list[dict[str, Any]]:
    """The session's updates that arrived before the answer to ``request_id``."""
    return [
        line.message
        for line in transcript[: _answer_index(transcript, request_id)]
        if line.dir == "in"
        and _is_update(line.message, session)
        and isinstance(line.message["params"].get("update"), dict)
    ]


def _text_of(updates: list[dict[str, Any]], kind: str) -> str:
    parts = []
    for message in updates:
        update = message["params"]["update"]
        content = update.get("content")
        if update.get("sessionUpdate") == kind and isinstance(content, dict) and content.get("type") == "text":
            parts.append(str(content.get("text", "")))
    return "".join(parts)


def _agent_text(notifications: list[dict[str, Any]], session: str) -> str:
    return _text_of([m for m in notifications if _is_update(m, session)], "agent_message_chunk")


def _replayed(said: str, replayed: str, *, exact: bool) -> bool:
    """Whether the replay has the agent's answer: the scripted answer within it, else any text at all."""
    return _squash(said) in _squash(replayed) if exact else bool(replayed.strip())


def _squash(text: str) -> str:
    return " ".join(text.split())


@contextmanager
def conform_workspace(path: str | None) -> Iterator[Path]:
    """The sessions' cwd: the given directory (made absolute), else a fresh temporary one, removed afterwards."""
    if path:
        yield Path(os.path.abspath(path))
        return
    with tempfile.TemporaryDirectory(prefix="lmbridge-conform-", ignore_cleanup_errors=True) as directory:
        yield Path(directory)
