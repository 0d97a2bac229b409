"""The built-in ``demo`` agent: a real ACP agent on the official SDK's asyncio agent side, scripted by the prompt.

Owns the directive language that tests, ``lmbridge demo``, benchmarks and users use to make an agent do exactly
what they want. Lines of the prompt starting with ``/`` are directives, executed in order; other lines are
echoed back (``echo: <text>``). A text block the bridge wrote as context (the transcript of an earlier
conversation, the editor's instructions: they start with ``[lmbridge]``) is remembered for ``/recall`` but never
executed.

    /say TEXT               stream TEXT (and a newline) in several chunks
    /stream N               N numbered chunks ("1 2 3 ...")
    /think TEXT             a thought chunk
    /plan A; B; C           a plan update
    /run TITLE              an agent-internal tool call: pending → in_progress → completed
    /tool NAME {json}       call NAME on the editor's MCP server, then say the result
    /tools N {j} | M {j}    the same, several calls in parallel
    /toolwait MS NAME {j}   call NAME but give up after MS (the MCP client sends notifications/cancelled)
    /permission [kind=K] T  ask permission for T (options allow-once, allow-always, reject-once; K an ACP tool kind,
                            default execute), then say the outcome
    /permissions T1 | T2    several permission requests at once
    /sleep MS               wait (cancellable)
    /later MS TEXT          MS after this turn's response is sent, send TEXT as an out-of-turn update
    /flush                  wait until every /later update of this session has been sent
    /recall                 say the texts of the earlier prompts of this session
    /env NAME               say the value of an environment variable of the agent (or "(unset)")
    /stop REASON            end the turn with this stopReason (end_turn, max_tokens, max_turn_requests, refusal)
    /crash                  exit abruptly, mid-turn

Scripted misbehaviours, for testing ACP test tools (``lmbridge test`` catches each one):

    /badstop [REASON]       end the turn with a stopReason ACP does not have (default "finished")
    /ignorecancel           from here on this turn ignores session/cancel (and ends normally, not "cancelled")
    /orphan TITLE           an agent-internal tool call that starts (pending → in_progress) and never ends
    /straycall              a tool_call_update for a toolCallId that was never announced
    /badupdate              a session/update that violates the schema (a text chunk without its text)

With ``$LMBRIDGE_DEMO_STATE_DIR`` set, sessions are kept there (one JSON file each, 0600) and the agent supports
``session/load`` (which replays the earlier prompts as ``user_message_chunk`` updates) and ``session/resume`` —
also across restarts of the agent.

Run as ``python -m bridge.demo_agent``. Never prints to stdout except through the ACP connection.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import re
import sys
import uuid
from dataclasses import dataclass, field
from typing import Any

from session.transcript import CONTEXT_PREFIX

__all__ = ["Step", "parse_script", "chunk_text", "main"]

log = logging.getLogger("lmbridge.demo_agent")

STOP_REASONS = ("end_turn", "max_tokens", "max_turn_requests", "refusal")
PERMISSION_OPTIONS = (("allow-once", "Allow once", "allow_once"), ("allow-always", "Allow always", "allow_always"),
                      ("reject-once", "Reject", "reject_once"))


@dataclass(frozen=True, slots=True)
class Step:
    """One directive (``kind`` is its name without the slash) or ``echo`` for plain text."""

    kind: str
    arg: str = ""
    calls: tuple[tuple[str, Any], ...] = ()  # for tool/tools: (name, arguments)
    number: int = 0


class ScriptError(ValueError):
    pass


_DIRECTIVE = re.compile(r"^/([a-z]+)\b\s*(.*)$", re.DOTALL)


def parse_script(text: str) -> list[Step]:
    """Directives and echo paragraphs of one prompt, in order. A malformed directive raises ``ScriptError``
    naming it, which the agent reports as text instead of failing the turn."""
    steps: list[Step] = []
    paragraph: list[str] = []

    def flush() -> None:
        if paragraph:
            body = "\n".join(paragraph).strip()
            if body:
                steps.append(Step("echo", body))
            paragraph.clear()

    for line in text.splitlines():
        match = _DIRECTIVE.match(line.strip())
        if not match:
            paragraph.append(line)
            continue
        flush()
        name, arg = match.group(1), match.group(2).strip()
        steps.append(_directive(name, arg))
    flush()
    return steps


def _directive(name: str, arg: str) -> Step:
    if name in ("say", "think", "run"):
        if not arg:
            raise ScriptError(f"/{name} needs a text")
        return Step(name, arg)
    if name in ("permission", "permissions"):
        requests = tuple(_permission(part.strip()) for part in arg.split("|")) if name == "permissions" else (
            _permission(arg),)
        return Step(name, calls=requests)
    if name in ("stream", "sleep"):
        if not arg.isdigit():
            raise ScriptError(f"/{name} needs a whole number, got {arg!r}")
        return Step(name, number=int(arg))
    if name == "later":
        ms, _, rest = arg.partition(" ")
        if not ms.isdigit() or not rest.strip():
            raise ScriptError("/later needs MS and a text, e.g. /later 100 hello")
        return Step(name, rest.strip(), number=int(ms))
    if name == "plan":
        entries = [entry.strip() for entry in arg.split(";") if entry.strip()]
        if not entries:
            raise ScriptError("/plan needs entries separated by ';'")
        return Step(name, arg, calls=tuple((entry, None) for entry in entries))
    if name == "tool":
        return Step(name, calls=(_tool_call(arg),))
    if name == "tools":
        calls = tuple(_tool_call(part.strip()) for part in arg.split("|"))
        return Step(name, calls=calls)
    if name == "toolwait":
        ms, _, rest = arg.partition(" ")
        if not ms.isdigit():
            raise ScriptError("/toolwait needs MS, a tool name and JSON arguments")
        return Step(name, calls=(_tool_call(rest.strip()),), number=int(ms))
    if name == "stop":
        if arg not in STOP_REASONS:
            raise ScriptError(f"/stop needs one of {', '.join(STOP_REASONS)}")
        return Step(name, arg)
    if name == "env":
        if not arg:
            raise ScriptError("/env needs a variable name")
        return Step(name, arg)
    if name in ("recall", "crash", "flush"):
        return Step(name)
    if name in ("ignorecancel", "straycall", "badupdate"):
        return Step(name)
    if name == "badstop":
        return Step(name, arg or "finished")
    if name == "orphan":
        if not arg:
            raise ScriptError("/orphan needs a title")
        return Step(name, arg)
    raise ScriptError(f"unknown directive /{name}")


_TOOL_KINDS = ("read", "edit", "delete", "move", "search", "execute", "think", "fetch", "switch_mode", "other")


def _permission(text: str) -> tuple[str, Any]:
    kind = "execute"
    if text.startswith("kind="):
        first, _, text = text.partition(" ")
        kind = first.removeprefix("kind=")
        if kind not in _TOOL_KINDS:
            raise ScriptError(f"/permission kind must be one of {', '.join(_TOOL_KINDS)}")
    if not text.strip():
        raise ScriptError("/permission needs a title")
    return text.strip(), kind


def _tool_call(text: str) -> tuple[str, Any]:
    name, _, raw = text.partition(" ")
    if not name:
        raise ScriptError("/tool needs a tool name")
    raw = raw.strip()
    if not raw:
        return name, {}
    try:
        return name, json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ScriptError(f"/tool {name}: arguments are not JSON: {exc}") from None


def chunk_text(text: str) -> list[str]:
    """Split text into several streaming chunks (word by word, whitespace kept), at least two when possible."""
    pieces = re.findall(r"\S+\s*|\s+", text)
    if len(pieces) == 1 and len(text) > 1:
        middle = len(text) // 2
        pieces = [text[:middle], text[middle:]]
    return pieces


@dataclass
class _Session:
    id: str
    cwd: str
    mcp_servers: list[Any]
    prompts: list[str] = field(default_factory=list)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    later: set[asyncio.Task[Any]] = field(default_factory=set)
    tools: Any = None  # the MCP client connection, opened on first use
    ignore_cancel: bool = False  # /ignorecancel: this turn does not react to session/cancel


class _Cancelled(Exception):
    pass


class DemoAgent:
    """The agent object the SDK drives. A plain class on purpose: subclassing ``acp.Agent`` (a Protocol) would
    turn every method we do not define into one that answers ``null`` instead of "method not found"."""

    def __init__(self, state_dir: str | None = None) -> None:
        self._state_dir = state_dir
        self._conn: Any = None
        self._sessions: dict[str, _Session] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._prompt_sessions: dict[Any, str] = {}  # JSON-RPC id of a session/prompt → session id
        self._turn_ended: dict[str, asyncio.Event] = {}

    def on_connect(self, conn: Any) -> None:
        self._conn = conn

    # The SDK reports every message it reads and writes; this is how /later knows the response went out.
    def observe(self, event: Any) -> None:
        message = event.message
        if event.direction.value == "incoming" and message.get("method") == "session/prompt":
            params = message.get("params") or {}
            self._prompt_sessions[message.get("id")] = params.get("sessionId")
        elif event.direction.value == "outgoing" and "method" not in message:
            session_id = self._prompt_sessions.pop(message.get("id"), None)
            if session_id is not None and session_id in self._turn_ended:
                self._turn_ended[session_id].set()

    async def initialize(self, protocol_version: int, client_capabilities: Any = None, client_info: Any = None,
                         **_: Any) -> Any:
        from acp.schema import (AgentCapabilities, Implementation, InitializeResponse, McpCapabilities,
                                PromptCapabilities, SessionCapabilities, SessionCloseCapabilities,
                                SessionResumeCapabilities)

        persistent = self._state_dir is not None
        return InitializeResponse(
            protocol_version=1,
            agent_capabilities=AgentCapabilities(
                load_session=persistent,
                prompt_capabilities=PromptCapabilities(image=True, embedded_context=True),
                mcp_capabilities=McpCapabilities(http=True),
                session_capabilities=SessionCapabilities(
                    close=SessionCloseCapabilities(),
                    resume=SessionResumeCapabilities() if persistent else None),
            ),
            agent_info=Implementation(name="lmbridge-demo-agent", title="lmbridge demo agent", version="1"),
        )

    async def authenticate(self, method_id: str, **_: Any) -> Any:
        from acp.schema import AuthenticateResponse

        return AuthenticateResponse()

    async def new_session(self, cwd: str, additional_directories: Any = None, mcp_servers: Any = None,
                          **_: Any) -> Any:
        from acp.schema import NewSessionResponse

        session_id = f"demo-{uuid.uuid4().hex[:12]}"
        self._sessions[session_id] = _Session(session_id, cwd, list(mcp_servers or []))
        return NewSessionResponse(session_id=session_id)

    async def load_session(self, cwd: str, session_id: str, mcp_servers: Any = None, additional_directories: Any = None,
                           **_: Any) -> Any:
        from acp import update_user_message_text
        from acp.schema import LoadSessionResponse

        session = self._reopen(session_id, cwd, mcp_servers)
        for text in session.prompts:
            await self._conn.session_update(session_id, update_user_message_text(text))
        return LoadSessionResponse()

    async def resume_session(self, session_id: str, cwd: str, additional_directories: Any = None, mcp_servers: Any = None,
                             **_: Any) -> Any:
        from acp.schema import ResumeSessionResponse

        self._reopen(session_id, cwd, mcp_servers)
        return ResumeSessionResponse()

    def _reopen(self, session_id: str, cwd: str, mcp_servers: Any) -> _Session:
        from acp import RequestError

        path = self._state_path(session_id)
        if path is None or not os.path.exists(path):
            raise RequestError.resource_not_found(session_id)
        with open(path, encoding="utf-8") as handle:
            saved = json.load(handle)
        session = self._sessions[session_id] = _Session(session_id, cwd, list(mcp_servers or []), saved["prompts"])
        return session

    def _state_path(self, session_id: str) -> str | None:
        if self._state_dir is None or not re.fullmatch(r"demo-[0-9a-f]{12}", session_id):
            return None
        return os.path.join(self._state_dir, f"{session_id}.json")

    def _save(self, session: _Session) -> None:
        path = self._state_path(session.id)
        if path is None:
            return
        os.makedirs(self._state_dir, mode=0o700, exist_ok=True)  # type: ignore[arg-type]
        fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump({"prompts": session.prompts, "cwd": session.cwd}, handle)
        os.replace(path + ".tmp", path)

    async def close_session(self, session_id: str, **_: Any) -> Any:
        from acp.schema import CloseSessionResponse

        session = self._sessions.pop(session_id, None)
        if session is not None and session.tools is not None:
            await session.tools.aclose()
        return CloseSessionResponse()

    async def cancel(self, session_id: str, **_: Any) -> None:
        session = self._sessions.get(session_id)
        if session is not None and not session.ignore_cancel:
            session.cancelled.set()

    async def prompt(self, session_id: str, prompt: list[Any], **_: Any) -> Any:
        from acp import RequestError
        from acp.schema import PromptResponse

        session = self._sessions.get(session_id)
        if session is None:
            raise RequestError.invalid_params({"sessionId": f"unknown session {session_id}"})
        session.cancelled = asyncio.Event()
        session.ignore_cancel = False
        self._turn_ended[session_id] = turn_ended = asyncio.Event()
        own_texts: list[str] = []
        others: list[str] = []
        for block in prompt:
            kind = getattr(block, "type", None)
            if kind == "text":
                if block.text.startswith(CONTEXT_PREFIX):
                    others.append(block.text)
                else:
                    own_texts.append(block.text)
            elif kind == "image":
                others.append(f"[image {block.mime_type}]")
                own_texts.append(f"received an image ({block.mime_type}, {len(base64.b64decode(block.data))} bytes)")
        text = "\n".join(own_texts)
        try:
            stop_reason = await self._run(session, text, turn_ended)
        except _Cancelled:
            stop_reason = "cancelled"
        finally:
            session.prompts.append("\n".join(others + own_texts))
            self._save(session)
        if stop_reason not in (*STOP_REASONS, "cancelled"):  # /badstop: not something PromptResponse can hold
            return {"stopReason": stop_reason}
        return PromptResponse(stop_reason=stop_reason)

    async def _run(self, session: _Session, text: str, turn_ended: asyncio.Event) -> str:
        try:
            steps = parse_script(text)
        except ScriptError as exc:
            await self._say(session, f"script error: {exc}")
            return "end_turn"
        if not steps:
            await self._say(session, "echo: (empty prompt)")
        for step in steps:
            self._check(session)
            handler = getattr(self, f"_do_{step.kind}")
            result = await handler(session, step, turn_ended)
            if result is not None:
                return result
        return "end_turn"

    # -- directives ----------------------------------------------------------------------------------------

    async def _do_echo(self, session: _Session, step: Step, _: Any) -> None:
        await self._say(session, f"echo: {step.arg}")

    async def _do_say(self, session: _Session, step: Step, _: Any) -> None:
        await self._say(session, step.arg)

    async def _do_stream(self, session: _Session, step: Step, _: Any) -> None:
        from acp import update_agent_message_text

        for number in range(1, step.number + 1):
            self._check(session)
            await self._conn.session_update(session.id, update_agent_message_text(f"{number} "))

    async def _do_think(self, session: _Session, step: Step, _: Any) -> None:
        from acp import update_agent_thought_text

        await self._conn.session_update(session.id, update_agent_thought_text(step.arg))

    async def _do_plan(self, session: _Session, step: Step, _: Any) -> None:
        from acp import plan_entry, update_plan

        entries = [plan_entry(name, status="in_progress" if i == 0 else "pending") for i, (name, _a) in enumerate(step.calls)]
        await self._conn.session_update(session.id, update_plan(entries))

    async def _do_run(self, session: _Session, step: Step, _: Any) -> None:
        from acp import start_tool_call, text_block, tool_content, update_tool_call

        call_id = f"run-{uuid.uuid4().hex[:8]}"
        await self._conn.session_update(session.id, start_tool_call(call_id, step.arg, kind="execute", status="pending"))
        await self._conn.session_update(session.id, update_tool_call(call_id, status="in_progress"))
        await self._conn.session_update(
            session.id,
            update_tool_call(call_id, status="completed", content=[tool_content(text_block(f"{step.arg}: done"))]),
        )

    async def _do_tool(self, session: _Session, step: Step, _: Any) -> None:
        await self._do_tools(session, step, _)

    async def _do_toolwait(self, session: _Session, step: Step, _: Any) -> None:
        await self._do_tools(session, step, _, timeout=step.number / 1000)

    async def _do_tools(self, session: _Session, step: Step, _: Any, timeout: float | None = None) -> None:
        results = await self._cancellable(session, self._call_tools(session, step.calls, timeout))
        for (name, _args), (ok, text) in zip(step.calls, results):
            await self._say(session, f"tool {name} {'returned' if ok else 'failed'}: {text}")

    async def _do_permission(self, session: _Session, step: Step, _: Any) -> None:
        await self._do_permissions(session, step, _)

    async def _do_permissions(self, session: _Session, step: Step, _: Any) -> None:
        outcomes = await asyncio.gather(*(self._ask(session, title, kind) for title, kind in step.calls))
        for (title, _kind), chosen in zip(step.calls, outcomes):
            prefix = "permission outcome" if len(step.calls) == 1 else f"permission outcome for {title}"
            await self._say(session, f"{prefix}: {chosen}")
        if "cancelled" in outcomes:
            raise _Cancelled

    async def _ask(self, session: _Session, title: str, kind: str) -> str:
        from acp.schema import PermissionOption, ToolCallUpdate

        call_id = f"perm-{uuid.uuid4().hex[:8]}"
        raw_input = {"command": title} if kind == "execute" else {"path": title}
        response = await self._conn.request_permission(
            session_id=session.id,
            tool_call=ToolCallUpdate(tool_call_id=call_id, title=title, kind=kind, status="pending", raw_input=raw_input),
            options=[PermissionOption(option_id=o, name=n, kind=k) for o, n, k in PERMISSION_OPTIONS],
        )
        return getattr(response.outcome, "option_id", None) or "cancelled"

    async def _do_sleep(self, session: _Session, step: Step, _: Any) -> None:
        try:
            await asyncio.wait_for(session.cancelled.wait(), step.number / 1000)
        except asyncio.TimeoutError:
            return
        raise _Cancelled

    async def _do_later(self, session: _Session, step: Step, turn_ended: asyncio.Event) -> None:
        task = asyncio.create_task(self._later(session, step, turn_ended))
        self._background.add(task)
        session.later.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(session.later.discard)

    async def _do_flush(self, session: _Session, step: Step, _: Any) -> None:
        if session.later:
            await self._cancellable(session, asyncio.wait(set(session.later)))

    async def _later(self, session: _Session, step: Step, turn_ended: asyncio.Event) -> None:
        from acp import update_agent_message_text

        await turn_ended.wait()
        await asyncio.sleep(step.number / 1000)
        try:
            await self._conn.session_update(session.id, update_agent_message_text(step.arg))
        except Exception as exc:  # the client went away meanwhile: nothing to tell
            log.info("late update not delivered: %s", exc)

    async def _do_recall(self, session: _Session, step: Step, _: Any) -> None:
        await self._say(session, "earlier prompts: " + json.dumps(session.prompts, ensure_ascii=False))

    async def _do_env(self, session: _Session, step: Step, _: Any) -> None:
        await self._say(session, f"{step.arg}={os.environ.get(step.arg, '(unset)')}")

    async def _do_stop(self, session: _Session, step: Step, _: Any) -> str:
        return step.arg

    async def _do_crash(self, session: _Session, step: Step, _: Any) -> None:
        await self._say(session, "crashing now")
        sys.stderr.write("demo agent: crashing on purpose (/crash)\n")
        sys.stderr.flush()
        os._exit(3)

    # -- misbehaviours (for testing test tools) -------------------------------------------------------------

    async def _do_badstop(self, session: _Session, step: Step, _: Any) -> str:
        return step.arg

    async def _do_ignorecancel(self, session: _Session, step: Step, _: Any) -> None:
        session.ignore_cancel = True

    async def _do_orphan(self, session: _Session, step: Step, _: Any) -> None:
        from acp import start_tool_call, update_tool_call

        call_id = f"orphan-{uuid.uuid4().hex[:8]}"
        await self._conn.session_update(session.id, start_tool_call(call_id, step.arg, kind="execute", status="pending"))
        await self._conn.session_update(session.id, update_tool_call(call_id, status="in_progress"))

    async def _do_straycall(self, session: _Session, step: Step, _: Any) -> None:
        from acp import text_block, tool_content, update_tool_call

        call_id = f"stray-{uuid.uuid4().hex[:8]}"
        await self._conn.session_update(
            session.id, update_tool_call(call_id, status="completed", content=[tool_content(text_block("stray"))]))

    async def _do_badupdate(self, session: _Session, step: Step, _: Any) -> None:
        # Through the SDK's raw connection: its models would refuse to build this.
        await self._conn._conn.send_notification("session/update", {
            "sessionId": session.id, "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text"}}})

    # -- helpers -------------------------------------------------------------------------------------------

    def _check(self, session: _Session) -> None:
        if session.cancelled.is_set():
            raise _Cancelled

    async def _cancellable(self, session: _Session, work: Any) -> Any:
        task = asyncio.ensure_future(work)
        cancelled = asyncio.ensure_future(session.cancelled.wait())
        try:
            done, _pending = await asyncio.wait({task, cancelled}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            cancelled.cancel()
        if task in done:
            return task.result()
        task.cancel()
        raise _Cancelled

    async def _say(self, session: _Session, text: str) -> None:
        """Stream one line of output (``text`` plus a newline) in several chunks."""
        from acp import update_agent_message_text

        for piece in chunk_text(text + "\n"):
            self._check(session)
            await self._conn.session_update(session.id, update_agent_message_text(piece))

    async def _call_tools(self, session: _Session, calls: tuple[tuple[str, Any], ...],
                          timeout: float | None = None) -> list[tuple[bool, str]]:
        from .demo_tools import call_tools

        return await call_tools(session, calls, timeout)


def main() -> None:
    logging.basicConfig(level=os.environ.get("LMBRIDGE_DEMO_LOG", "WARNING"), stream=sys.stderr,
                        format="demo-agent %(levelname)s %(message)s")
    import acp

    agent = DemoAgent(os.environ.get("LMBRIDGE_DEMO_STATE_DIR") or None)
    asyncio.run(acp.run_agent(agent, use_unstable_protocol=True, observers=[agent.observe]))


if __name__ == "__main__":
    main()
