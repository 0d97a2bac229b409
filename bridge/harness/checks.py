"""Conformance checks: what any ACP agent must do, judged from its wire (the ``agent:<id>`` trace of a scenario),
selectable by name (``lmbridge test --check initialize,cancel`` or a scenario's ``[conformance]`` table).

- ``initialize``: no or an erroneous ``initialize`` answer, an answer that is not an ``InitializeResponse``, a
  version other than the one asked for when it is supported; and, asked directly (a probe without lmbridge) for
  protocol version 99, an error or anything but the latest version it supports
- ``session-new``: ``session/new`` (``load``, ``resume``) failing or answered without a usable, unique
  ``sessionId``; updates for sessions that do not exist
- ``stop-reason``: prompts answered with an error, with a stop reason ACP does not have, ``cancelled`` without a
  cancel, or never answered
- ``cancel``: after ``session/cancel``: the prompt not answered, answered with an error or another stop reason than
  ``cancelled``; permission requests left pending (the client must answer them ``cancelled``)
- ``update-schema``: ``session/update`` and ``session/request_permission`` messages that the ACP schema (SDK models;
  the JSON schema when given) refuses, and lines that are not JSON
- ``tool-calls``: ``tool_call_update`` for an unknown ``toolCallId``, statuses going backwards or changing after
  completion, tool calls still pending or in progress when their prompt ended (orphans)

Owns the checks and the version-negotiation probe; each finding is a ``Failure`` naming the turn it happened in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from bridge.acp.handshake import initialize_params
from bridge.acp.process import stop_process_group
from bridge.acp.spawn import agent_environment
from wire.errors import RpcError
from wire.rpc.connection import ACP_CANCEL, ConnectionClosed, JsonRpcConnection, MethodTable, StreamWire
from wire.vocabulary import STOP_REASONS

from .driver import SHUTDOWN_TURN, AgentUnderTest
from .expect import Failure
from .scenario import CHECK_NAMES
from .traces import AcpLog, Exchange, WireEvent, update_kind
from .validation import JsonSchema, validate

__all__ = ["PROBE_VERSION", "CheckResult", "ProbeResult", "probe_negotiation", "run_checks"]

PROBE_VERSION = 99  # a protocol version no agent supports yet
_STATUS_ORDER = {"pending": 0, "in_progress": 1, "completed": 2, "failed": 2}
MAX_FINDINGS = 10


@dataclass
class CheckResult:
    name: str
    status: str  # passed | failed | skipped
    failures: list[Failure] = field(default_factory=list)
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "note": self.note,
            "failures": [f.to_json() for f in self.failures],
        }


@dataclass
class ProbeResult:
    """The agent's answer to ``initialize`` with ``protocolVersion: 99``, asked directly."""

    answer: Any = None  # the response message
    problem: str | None = None  # could not ask (no answer, exited, ...)


class _Context:
    def __init__(
        self, file: str, log: AcpLog, turn_labels: dict[int, str], schema: JsonSchema | None, probe: ProbeResult | None
    ) -> None:
        self.file = file
        self.log = log
        self.turn_labels = turn_labels
        self.schema = schema
        self.probe = probe
        self._positions = {id(event): index for index, event in enumerate(log.events)}
        self._cancels = {id(event) for event in log.cancels}

    def pos(self, event: WireEvent) -> int:
        return self._positions[id(event)]

    def is_cancel(self, event: WireEvent) -> bool:
        return id(event) in self._cancels

    def where(self, event: WireEvent | None) -> str:
        if event is None:
            return "after the last turn"
        if event.turn == SHUTDOWN_TURN:
            return "at shutdown"
        if event.turn == 0:
            return "before the first turn"
        return self.turn_labels.get(event.turn, f"turn {event.turn}")

    def failure(self, check: str, event: WireEvent | None, expected: str, got: str) -> Failure:
        return Failure(self.file, self.where(event), f"check {check}", expected, got)


def run_checks(
    names: tuple[str, ...],
    log: AcpLog,
    *,
    file: str,
    turn_labels: dict[int, str],
    schema: JsonSchema | None = None,
    probe: ProbeResult | None = None,
) -> list[CheckResult]:
    context = _Context(file, log, turn_labels, schema, probe)
    results = []
    for name in names:
        assert name in CHECK_NAMES, name
        results.append(_CHECKS[name](context))
    return results


def _result(name: str, failures: list[Failure], note: str) -> CheckResult:
    if len(failures) > MAX_FINDINGS:
        extra = len(failures) - MAX_FINDINGS
        failures = failures[:MAX_FINDINGS]
        note = f"{note}; {extra} more finding(s) not shown"
    return CheckResult(name, "failed" if failures else "passed", failures, note)


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        return f"error {error.get('code')}: {error.get('message')}"
    return f"error {error!r}"


# -- initialize -------------------------------------------------------------------------------------------------


def _check_initialize(c: _Context) -> CheckResult:
    failures: list[Failure] = []
    exchanges = c.log.requests("initialize")
    notes = []
    for exchange in exchanges:
        asked = (exchange.params or {}).get("protocolVersion")
        if not exchange.answered:
            failures.append(c.failure("initialize", exchange.sent, "an answer to initialize", "no answer"))
            continue
        if exchange.error is not None:
            failures.append(
                c.failure("initialize", exchange.answer, "an InitializeResponse", _error_text(exchange.error))
            )
            continue
        for problem in validate("InitializeResponse", exchange.result, c.schema):
            failures.append(c.failure("initialize", exchange.answer, "an InitializeResponse (ACP schema)", problem))
        version = (exchange.result or {}).get("protocolVersion") if isinstance(exchange.result, dict) else None
        if version != asked:
            failures.append(
                c.failure(
                    "initialize",
                    exchange.answer,
                    f"protocolVersion {asked} (asked for {asked}, which it must answer when it supports it)",
                    f"protocolVersion {version!r}",
                )
            )
    if exchanges:
        notes.append(f"{len(exchanges)} initialize exchange(s)")
    probe = c.probe
    if probe is not None:
        if probe.problem is not None:
            failures.append(
                c.failure(
                    "initialize",
                    None,
                    f"an answer to initialize with protocolVersion {PROBE_VERSION} (version negotiation probe)",
                    probe.problem,
                )
            )
        else:
            answer = probe.answer or {}
            if "error" in answer:
                failures.append(
                    c.failure(
                        "initialize",
                        None,
                        f"the latest version it supports, in answer to "
                        f"protocolVersion {PROBE_VERSION} (negotiation, not an error)",
                        _error_text(answer["error"]),
                    )
                )
            else:
                version = (
                    (answer.get("result") or {}).get("protocolVersion")
                    if isinstance(answer.get("result"), dict)
                    else None
                )
                if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= PROBE_VERSION:
                    failures.append(
                        c.failure(
                            "initialize",
                            None,
                            f"a supported protocolVersion (1..{PROBE_VERSION}) in "
                            f"answer to protocolVersion {PROBE_VERSION}",
                            f"{version!r}",
                        )
                    )
                else:
                    notes.append(f"asked for version {PROBE_VERSION}, it answered {version}")
    if not exchanges and probe is None:
        return CheckResult("initialize", "skipped", note="the agent was never initialized")
    return _result("initialize", failures, "; ".join(notes))


# -- session/new --------------------------------------------------------------------------------------------------


def _check_session_new(c: _Context) -> CheckResult:
    failures: list[Failure] = []
    created: set[str] = set()
    opened = [e for e in c.log.client_requests if e.method in ("session/new", "session/load", "session/resume")]
    for exchange in opened:
        if not exchange.answered:
            failures.append(c.failure("session-new", exchange.sent, f"an answer to {exchange.method}", "no answer"))
            continue
        if exchange.error is not None:
            failures.append(
                c.failure("session-new", exchange.answer, f"a {exchange.method} result", _error_text(exchange.error))
            )
            continue
        model = {
            "session/new": "NewSessionResponse",
            "session/load": "LoadSessionResponse",
            "session/resume": "ResumeSessionResponse",
        }[exchange.method]
        for problem in validate(model, exchange.result, c.schema):
            failures.append(c.failure("session-new", exchange.answer, f"a {model} (ACP schema)", problem))
        if exchange.method == "session/new":
            session_id = (exchange.result or {}).get("sessionId") if isinstance(exchange.result, dict) else None
            if not isinstance(session_id, str) or not session_id:
                failures.append(
                    c.failure(
                        "session-new",
                        exchange.answer,
                        "a non-empty string sessionId",
                        json.dumps(exchange.result)[:200],
                    )
                )
                continue
            if session_id in created:
                failures.append(
                    c.failure(
                        "session-new", exchange.answer, "a new sessionId for each session/new", f"{session_id!r} again"
                    )
                )
            created.add(session_id)
        elif isinstance(exchange.session_id, str):
            created.add(exchange.session_id)
    reported: set[str] = set()
    for event in c.log.updates:
        session_id = (event.params or {}).get("sessionId") if isinstance(event.params, dict) else None
        if isinstance(session_id, str) and session_id not in created and session_id not in reported:
            reported.add(session_id)
            failures.append(
                c.failure(
                    "session-new",
                    event,
                    "updates only for sessions the agent created",
                    f"a session/update for unknown session {session_id!r}",
                )
            )
    if not opened:
        return CheckResult("session-new", "skipped", note="no session was opened")
    return _result("session-new", failures, f"{len(opened)} session(s) opened")


# -- stop reasons -------------------------------------------------------------------------------------------------


def _cancel_for(c: _Context, exchange: Exchange) -> WireEvent | None:
    """The first session/cancel for the prompt's session sent while the prompt was unanswered."""
    start = c.pos(exchange.sent)
    end = c.pos(exchange.answer) if exchange.answer is not None else len(c.log.events)
    for event in c.log.events[start:end]:
        if c.is_cancel(event) and (event.params or {}).get("sessionId") == exchange.session_id:
            return event
    return None


def _check_stop_reason(c: _Context) -> CheckResult:
    failures: list[Failure] = []
    prompts = c.log.requests("session/prompt")
    reasons: dict[str, int] = {}
    for exchange in prompts:
        cancel = _cancel_for(c, exchange)
        if not exchange.answered:
            if cancel is not None and cancel.turn == SHUTDOWN_TURN:
                continue  # lmbridge cancelled it while shutting down and stopped the agent: no answer to judge
            why = (
                "no answer: the agent process exited (lmbridge started it again)"
                if exchange.generation < c.log.restarts
                else "no answer by the end of the scenario"
            )
            failures.append(c.failure("stop-reason", exchange.sent, "an answer to session/prompt", why))
            continue
        if exchange.error is not None:
            failures.append(
                c.failure(
                    "stop-reason", exchange.answer, "a PromptResponse with a stopReason", _error_text(exchange.error)
                )
            )
            continue
        problems = validate("PromptResponse", exchange.result, c.schema)
        reason = exchange.result.get("stopReason") if isinstance(exchange.result, dict) else None
        if isinstance(reason, str) and reason not in STOP_REASONS:
            problems = [f"stopReason {reason!r}, which ACP does not have"]
        for problem in problems:
            failures.append(
                c.failure(
                    "stop-reason",
                    exchange.answer,
                    "an ACP stop reason (end_turn, max_tokens, max_turn_requests, refusal, cancelled)",
                    problem,
                )
            )
        if not problems and isinstance(reason, str):
            reasons[reason] = reasons.get(reason, 0) + 1
        if reason == "cancelled" and cancel is None:
            failures.append(
                c.failure(
                    "stop-reason",
                    exchange.answer,
                    "stopReason 'cancelled' only after session/cancel",
                    "'cancelled' for a prompt that was not cancelled",
                )
            )
    if not prompts:
        return CheckResult("stop-reason", "skipped", note="no prompt was sent")
    return _result("stop-reason", failures, ", ".join(f"{n}× {r}" for r, n in sorted(reasons.items())))


# -- cancel -------------------------------------------------------------------------------------------------------


def _check_cancel(c: _Context) -> CheckResult:
    failures: list[Failure] = []
    judged = 0
    for exchange in c.log.requests("session/prompt"):
        cancel = _cancel_for(c, exchange)
        if cancel is None or cancel.turn == SHUTDOWN_TURN:
            continue
        judged += 1
        if not exchange.answered:
            failures.append(
                c.failure(
                    "cancel", cancel, "an answer to the cancelled session/prompt (stopReason 'cancelled')", "no answer"
                )
            )
        elif exchange.error is not None:
            failures.append(
                c.failure(
                    "cancel",
                    exchange.answer,
                    "stopReason 'cancelled' after session/cancel (ACP: "
                    "catch the abort and answer cancelled, not an error)",
                    _error_text(exchange.error),
                )
            )
        else:
            reason = exchange.result.get("stopReason") if isinstance(exchange.result, dict) else None
            if reason != "cancelled":
                failures.append(
                    c.failure(
                        "cancel",
                        exchange.answer,
                        "stopReason 'cancelled' after session/cancel",
                        f"stopReason {reason!r}: the agent ignored the cancel",
                    )
                )
        # Permission requests pending at the cancel must be answered "cancelled" (by the client).
        position = c.pos(cancel)
        for request in c.log.agent_requests:
            if request.method != "session/request_permission" or request.session_id != exchange.session_id:
                continue
            asked = c.pos(request.sent)
            answered = c.pos(request.answer) if request.answer is not None else None
            if asked < position and (answered is None or answered > position):
                outcome = (
                    ((request.result or {}).get("outcome") or {}).get("outcome")
                    if isinstance(request.result, dict)
                    else None
                )
                if outcome != "cancelled":
                    failures.append(
                        c.failure(
                            "cancel",
                            request.answer or cancel,
                            "the pending permission request answered 'cancelled'",
                            f"{outcome!r}" if request.answered else "no answer",
                        )
                    )
    if not judged:
        return CheckResult(
            "cancel",
            "skipped",
            note="no prompt was cancelled (give a turn a cancel trigger, or leave a permission unanswered and move on)",
        )
    return _result("cancel", failures, f"{judged} cancelled prompt(s)")


# -- update schema ------------------------------------------------------------------------------------------------


def _check_update_schema(c: _Context) -> CheckResult:
    failures: list[Failure] = []
    for event in c.log.invalid:
        failures.append(
            c.failure(
                "update-schema", event, "JSON-RPC messages (one JSON object per line)", f"{(event.raw or '')[:120]!r}"
            )
        )
    for index, event in enumerate(c.log.updates, start=1):
        problems = validate("SessionNotification", event.params, c.schema)
        if problems:
            kind = update_kind(event.params)
            failures.append(
                c.failure(
                    "update-schema",
                    event,
                    f"session/update #{index} ({kind}) to be a valid SessionNotification",
                    "; ".join(problems),
                )
            )
    permissions = [e for e in c.log.agent_requests if e.method == "session/request_permission"]
    for exchange in permissions:
        problems = validate("RequestPermissionRequest", exchange.params, c.schema)
        if problems:
            failures.append(
                c.failure("update-schema", exchange.sent, "a valid RequestPermissionRequest", "; ".join(problems))
            )
    if not c.log.updates and not permissions and not c.log.invalid:
        return CheckResult("update-schema", "skipped", note="the agent sent no update")
    source = f"ACP SDK models + {os.path.basename(c.schema.path) or 'JSON schema'}" if c.schema else "ACP SDK models"
    return _result(
        "update-schema",
        failures,
        f"{len(c.log.updates)} update(s), {len(permissions)} permission request(s) against the {source}",
    )


# -- tool calls ---------------------------------------------------------------------------------------------------


def _check_tool_calls(c: _Context) -> CheckResult:
    failures: list[Failure] = []
    # Keys are what the agent sent: (sessionId, toolCallId), either of which may be missing from a bad message.
    status: dict[tuple[Any, Any], str] = {}  # (session, toolCallId) → status
    titles: dict[tuple[Any, Any], str] = {}
    started_in: dict[Any, list[tuple[Any, Any]]] = {}  # session → calls started since its prompt was sent
    prompt_answers = {id(e.answer): e for e in c.log.requests("session/prompt") if e.answer is not None}
    seen_calls = 0
    for event in c.log.events:
        msg = event.msg if isinstance(event.msg, dict) else {}
        if event.dir == "out" and msg.get("method") == "session/prompt":
            started_in[(msg.get("params") or {}).get("sessionId")] = []
        elif event.dir == "in" and msg.get("method") == "session/request_permission":
            params = msg.get("params") or {}
            call = params.get("toolCall") if isinstance(params, dict) else None
            if isinstance(call, dict):
                status.setdefault((params.get("sessionId"), call.get("toolCallId")), "")
        elif event.dir == "in" and msg.get("method") == "session/update":
            params = msg.get("params") or {}
            update = params.get("update") if isinstance(params, dict) else None
            if not isinstance(update, dict) or update.get("sessionUpdate") not in ("tool_call", "tool_call_update"):
                continue
            session, call_id = params.get("sessionId"), update.get("toolCallId")
            key = (session, call_id)
            new = update.get("status")
            if update["sessionUpdate"] == "tool_call":
                seen_calls += 1
                if key not in status or not status[key]:
                    started_in.setdefault(session, []).append(key)
                titles[key] = str(update.get("title") or titles.get(key, ""))
                new = new or ("pending" if not status.get(key) else None)
            elif key not in status:
                failures.append(
                    c.failure(
                        "tool-calls",
                        event,
                        "tool_call_update only for a toolCallId that a tool_call (or a permission request) announced",
                        f"tool_call_update for unknown toolCallId {call_id!r}",
                    )
                )
                status[key] = new or ""
                continue
            if isinstance(new, str) and new in _STATUS_ORDER:
                old = status.get(key) or ""
                if old and (
                    _STATUS_ORDER[new] < _STATUS_ORDER.get(old, 0) or (_STATUS_ORDER.get(old) == 2 and new != old)
                ):
                    failures.append(
                        c.failure(
                            "tool-calls",
                            event,
                            f"tool call {call_id!r} ({titles.get(key, '')!r}) "
                            "statuses to move forward: pending → in_progress → completed | failed",
                            f"{old} → {new}",
                        )
                    )
                status[key] = new
        elif event.is_response and event.dir == "in":
            exchange = prompt_answers.get(id(event))
            if exchange is None:
                continue
            session = exchange.session_id
            reason = exchange.result.get("stopReason") if isinstance(exchange.result, dict) else None
            for key in started_in.pop(session, []):
                state = status.get(key) or "pending"
                if _STATUS_ORDER.get(state) != 2 and reason != "cancelled":
                    failures.append(
                        c.failure(
                            "tool-calls",
                            event,
                            f"tool call {key[1]!r} ({titles.get(key, '')!r}) "
                            "to reach completed or failed before its prompt ended",
                            f"still {state} when session/prompt answered "
                            f"{reason or _error_text(exchange.error)!r} (an orphan)",
                        )
                    )
    if not seen_calls and not failures:
        return CheckResult("tool-calls", "skipped", note="the agent reported no tool call")
    return _result("tool-calls", failures, f"{seen_calls} tool call(s)")


_CHECKS: dict[str, Callable[[_Context], CheckResult]] = {
    "initialize": _check_initialize,
    "session-new": _check_session_new,
    "stop-reason": _check_stop_reason,
    "cancel": _check_cancel,
    "update-schema": _check_update_schema,
    "tool-calls": _check_tool_calls,
}


# -- the version-negotiation probe --------------------------------------------------------------------------------


async def probe_negotiation(agent: AgentUnderTest, timeout: float) -> ProbeResult:
    """Start the agent on its own (no lmbridge) and ask ``initialize`` with ``protocolVersion: 99``."""
    config = agent.config
    if config is None:
        argv, env, cwd = [sys.executable, "-m", "bridge.demo"], dict(os.environ), None
    else:
        argv, env, cwd = config.argv, agent_environment(config), config.cwd
    try:
        process = await trio.lowlevel.open_process(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
            cwd=cwd,
        )
    except OSError as exc:
        return ProbeResult(problem=f"cannot start {argv[0]!r}: {exc.strerror or exc}")
    assert process.stdin is not None and process.stdout is not None
    connection = JsonRpcConnection(
        StreamWire(process.stdout, process.stdin), MethodTable(), name="probe", cancel_style=ACP_CANCEL
    )
    params = initialize_params(protocol_version=PROBE_VERSION, client_name="lmbridge-test-probe")
    result = ProbeResult(problem=f"no answer within {timeout:g} s")
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(connection.serve)
            with trio.move_on_after(timeout):
                try:
                    result = ProbeResult(answer={"result": await connection.request("initialize", params)})
                except RpcError as exc:
                    result = ProbeResult(answer={"error": exc.to_dict()})
                except ConnectionClosed:
                    result = ProbeResult(problem="the agent exited without answering")
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await stop_process_group(process, 3.0)
    return result
