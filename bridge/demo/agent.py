"""The built-in ``demo`` agent: a real ACP agent on the official SDK's asyncio agent side, scripted by the prompt.

Owns carrying out the directives of a prompt (the language itself, and its reference, is
``bridge.demo.directives``: ``/say``, ``/stream``, ``/tool``, ``/permission``, ``/help`` lists them all). A text
block the bridge wrote as context (the transcript of an earlier conversation, the editor's instructions: they start
with ``[lmbridge]``) is remembered for ``/recall`` but never executed.

With ``$LMBRIDGE_DEMO_STATE_DIR`` set, sessions are kept there (one JSON file each, 0600) and the agent supports
``session/load`` (which replays the conversation: each earlier prompt as a ``user_message_chunk``, what the agent said
in that turn as an ``agent_message_chunk``) and ``session/resume`` —
also across restarts of the agent.

Run as ``python -m bridge.demo``. Never prints to stdout except through the ACP connection.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import logging
import os
import re
import sys
import uuid
import warnings
from dataclasses import dataclass, field
from typing import Any

from session.transcript import CONTEXT_PREFIX
from wire.vocabulary import STOP_REASONS

from .directives import DIRECTIVES, PERMISSION_OPTIONS, ScriptError, Step, parse_script, reference

__all__ = ["DemoAgent", "chunk_text", "main"]

log = logging.getLogger("lmbridge.demo")


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
    answers: list[str] = field(default_factory=list)  # what the agent said in each turn (for session/load)
    saying: list[str] = field(default_factory=list)  # what it has said so far in this turn
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    later: set[asyncio.Task[Any]] = field(default_factory=set)
    tools: Any = None  # the MCP client connection, opened on first use
    ignore_cancel: bool = False  # /ignorecancel: this turn does not react to session/cancel
    turn_usage: dict[str, int] | None = None  # /usage: the token counts this turn's answer reports
    options: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_OPTIONS))  # session/set_config_option


# The session options the demo agent offers (ACP configOptions), with their defaults.
DEFAULT_OPTIONS: dict[str, Any] = {"model": "demo-small", "mode": "code", "effort": "medium", "verbose": False}
_OPTION_VALUES = {
    "model": ("demo-small", "demo-large"),
    "mode": ("ask", "code", "plan"),
    "effort": ("low", "medium", "high"),
}


def _config_options(values: dict[str, Any]) -> list[dict[str, Any]]:
    """ACP ``SessionConfigOption`` list of a session: three selects (a model among them) and a boolean."""

    def select(option: str, name: str, category: str) -> dict[str, Any]:
        choices = [{"value": v, "name": v.replace("-", " ").title()} for v in _OPTION_VALUES[option]]
        return {"id": option, "name": name, "category": category, "type": "select", "currentValue": values[option],
                "options": choices}  # fmt: skip

    return [
        select("model", "Model", "model"),
        select("mode", "Mode", "mode"),
        select("effort", "Effort", "thought_level"),
        {"id": "verbose", "name": "Verbose", "type": "boolean", "currentValue": values["verbose"]},
    ]


class _Cancelled(Exception):
    pass


class _Recording:
    """The client connection, keeping the text of every ``agent_message_chunk`` in its session's ``saying``."""

    def __init__(self, conn: Any, sessions: dict[str, _Session]) -> None:
        self._conn = conn
        self._sessions = sessions

    async def session_update(self, session_id: str, update: Any) -> Any:
        session = self._sessions.get(session_id)
        if session is not None and getattr(update, "session_update", None) == "agent_message_chunk":
            text = getattr(update.content, "text", None)
            if isinstance(text, str):
                session.saying.append(text)
        return await self._conn.session_update(session_id, update)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


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
        self._barriers: dict[str, tuple[int, asyncio.Event]] = {}  # /barrier NAME: prompts arrived, all there

    def on_connect(self, conn: Any) -> None:
        self._conn = _Recording(conn, self._sessions)

    # The SDK reports every message it reads and writes; this is how /later knows the response went out.
    def observe(self, event: Any) -> None:
        message = event.message
        if event.direction.value == "incoming" and message.get("method") == "session/prompt":
            params = message.get("params") or {}
            self._prompt_sessions[message.get("id")] = str(params.get("sessionId"))
        elif event.direction.value == "outgoing" and "method" not in message:
            ended = self._prompt_sessions.pop(message.get("id"), None)
            if ended is not None and ended in self._turn_ended:
                self._turn_ended[ended].set()

    async def initialize(
        self, protocol_version: int, client_capabilities: Any = None, client_info: Any = None, **_: Any
    ) -> Any:
        from acp.schema import (
            AgentCapabilities,
            Implementation,
            InitializeResponse,
            McpCapabilities,
            PromptCapabilities,
            SessionCapabilities,
            SessionCloseCapabilities,
            SessionResumeCapabilities,
        )

        persistent = self._state_dir is not None
        return InitializeResponse(
            protocol_version=1,
            agent_capabilities=AgentCapabilities(
                load_session=persistent,
                prompt_capabilities=PromptCapabilities(image=True, embedded_context=True),
                mcp_capabilities=McpCapabilities(http=True),
                session_capabilities=SessionCapabilities(
                    close=SessionCloseCapabilities(), resume=SessionResumeCapabilities() if persistent else None
                ),
            ),
            agent_info=Implementation(name="lmbridge-demo-agent", title="lmbridge demo agent", version="1"),
        )

    async def authenticate(self, method_id: str, **_: Any) -> Any:
        from acp.schema import AuthenticateResponse

        return AuthenticateResponse()

    async def new_session(self, cwd: str, additional_directories: Any = None, mcp_servers: Any = None, **_: Any) -> Any:
        from acp.schema import NewSessionResponse

        session_id = f"demo-{uuid.uuid4().hex[:12]}"
        session = self._sessions[session_id] = _Session(session_id, cwd, list(mcp_servers or []))
        await self._announce_commands(session_id)
        return NewSessionResponse.model_validate(
            {"sessionId": session_id, "configOptions": _config_options(session.options)}
        )

    async def set_config_option(self, config_id: str, session_id: str, value: str | bool, **_: Any) -> Any:
        from acp import RequestError
        from acp.schema import SetSessionConfigOptionResponse

        session = self._sessions.get(session_id)
        if session is None:
            raise RequestError.resource_not_found(session_id)
        allowed = _OPTION_VALUES.get(config_id, (True, False) if config_id in DEFAULT_OPTIONS else ())
        if value not in allowed or isinstance(value, bool) != isinstance(DEFAULT_OPTIONS.get(config_id), bool):
            raise RequestError.invalid_params({"configId": config_id, "value": value})
        session.options[config_id] = value
        return SetSessionConfigOptionResponse.model_validate({"configOptions": _config_options(session.options)})

    async def load_session(
        self, cwd: str, session_id: str, mcp_servers: Any = None, additional_directories: Any = None, **_: Any
    ) -> Any:
        from acp import update_agent_message_text, update_user_message_text
        from acp.schema import LoadSessionResponse

        session = self._reopen(session_id, cwd, mcp_servers)
        for text, answer in itertools.zip_longest(session.prompts, session.answers):
            if text is not None:
                await self._conn.session_update(session_id, update_user_message_text(text))
            if answer:
                await self._conn.session_update(session_id, update_agent_message_text(answer))
        return LoadSessionResponse.model_validate({"configOptions": _config_options(session.options)})

    async def resume_session(
        self, session_id: str, cwd: str, additional_directories: Any = None, mcp_servers: Any = None, **_: Any
    ) -> Any:
        from acp.schema import ResumeSessionResponse

        session = self._reopen(session_id, cwd, mcp_servers)
        return ResumeSessionResponse.model_validate({"configOptions": _config_options(session.options)})

    def _reopen(self, session_id: str, cwd: str, mcp_servers: Any) -> _Session:
        from acp import RequestError

        path = self._state_path(session_id)
        if path is None or not os.path.exists(path):
            raise RequestError.resource_not_found(session_id)
        with open(path, encoding="utf-8") as handle:
            saved = json.load(handle)
        session = self._sessions[session_id] = _Session(
            session_id, cwd, list(mcp_servers or []), saved["prompts"], saved.get("answers", [])
        )
        return session

    def _state_path(self, session_id: str) -> str | None:
        if self._state_dir is None or not re.fullmatch(r"demo-[0-9a-f]{12}", session_id):
            return None
        return os.path.join(self._state_dir, f"{session_id}.json")

    def _save(self, session: _Session) -> None:
        path = self._state_path(session.id)
        if path is None:
            return
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump({"prompts": session.prompts, "answers": session.answers, "cwd": session.cwd}, handle)
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
        session.turn_usage = None
        session.saying = []
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
            session.answers.append("".join(session.saying))
            self._save(session)
        if stop_reason not in STOP_REASONS:  # /badstop: not something PromptResponse can hold
            return {"stopReason": stop_reason}
        answer: dict[str, Any] = {"stopReason": stop_reason}
        if session.turn_usage is not None:
            answer["usage"] = session.turn_usage
        return PromptResponse.model_validate(answer)

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
                return str(result)
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

    async def _do_llm(self, session: _Session, step: Step, _: Any) -> None:
        from acp import update_agent_message_text

        from .model import ModelUnavailable, stream_answer

        answer = stream_answer(step.arg, session.cancelled)
        try:
            async for text in answer:
                await self._conn.session_update(session.id, update_agent_message_text(text))
        except ModelUnavailable as exc:
            await self._say(session, f"model error: {exc}")
            return
        finally:
            await answer.aclose()
        self._check(session)
        await self._conn.session_update(session.id, update_agent_message_text("\n"))

    async def _do_think(self, session: _Session, step: Step, _: Any) -> None:
        from acp import update_agent_thought_text

        await self._conn.session_update(session.id, update_agent_thought_text(step.arg))

    async def _do_options(self, session: _Session, step: Step, _: Any) -> None:
        values = " ".join(f"{key}={json.dumps(value)}" for key, value in sorted(session.options.items()))
        await self._say(session, f"options: {values}")

    async def _do_usage(self, session: _Session, step: Step, _: Any) -> None:
        from acp.schema import UsageUpdate

        figures = dict(step.calls)
        update = {"sessionUpdate": "usage_update", "used": figures["used"], "size": figures["size"]}
        if figures["cost"] is not None:
            update["cost"] = figures["cost"]
        await self._conn.session_update(session.id, UsageUpdate.model_validate(update))
        # The prompt's answer reports the turn's tokens too (ACP's ``usage``, still unstable): USED in, 1 out.
        session.turn_usage = {"inputTokens": figures["used"], "outputTokens": 1, "totalTokens": figures["used"] + 1}

    async def _do_plan(self, session: _Session, step: Step, _: Any) -> None:
        from acp import plan_entry, update_plan

        entries = [
            plan_entry(name, status="in_progress" if i == 0 else "pending") for i, (name, _a) in enumerate(step.calls)
        ]
        await self._conn.session_update(session.id, update_plan(entries))

    async def _do_run(self, session: _Session, step: Step, _: Any) -> None:
        from acp import start_tool_call, text_block, tool_content, update_tool_call

        call_id = f"run-{uuid.uuid4().hex[:8]}"
        await self._conn.session_update(
            session.id, start_tool_call(call_id, step.arg, kind="execute", status="pending")
        )
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
        from acp import start_tool_call, update_tool_call

        # Announced first as being made, as Codex reports its calls: the client learns how many calls are coming
        # and that they are on their way (lmbridge waits for them all, however slow the machine, and ends the batch
        # when they have arrived); then they run concurrently.
        servers = [getattr(server, "name", "") for server in session.mcp_servers]
        prefix = f"mcp__{servers[0]}__" if servers else "mcp__"
        call_ids = [f"{prefix}{name}-{uuid.uuid4().hex[:8]}" for name, _args in step.calls]
        for call_id, (name, args) in zip(call_ids, step.calls, strict=True):
            announce = start_tool_call(call_id, f"{prefix}{name}", kind="other", status="in_progress", raw_input=args)
            await self._conn.session_update(session.id, announce)
        results = await self._cancellable(session, self._call_tools(session, step.calls, timeout))
        for call_id, (ok, _text) in zip(call_ids, results, strict=True):
            await self._conn.session_update(
                session.id, update_tool_call(call_id, status="completed" if ok else "failed")
            )
        for (name, _args), (ok, text) in zip(step.calls, results, strict=True):
            await self._say(session, f"tool {name} {'returned' if ok else 'failed'}: {text}")

    async def _do_ask(self, session: _Session, step: Step, _: Any) -> None:
        from .tools import connections

        ((name, arguments),) = step.calls
        notes: list[str] = []

        async def progress(value: float, total: float | None, message: str | None) -> None:
            notes.append(message or "")

        ok, text = await self._cancellable(session, connections(session).call(name, arguments, progress=progress))
        await self._say(
            session, f"{'editor model' if ok else 'editor model failed'} ({len(notes)} progress notes): {text}"
        )

    async def _do_permission(self, session: _Session, step: Step, _: Any) -> None:
        await self._do_permissions(session, step, _)

    async def _do_permissions(self, session: _Session, step: Step, _: Any) -> None:
        outcomes = await asyncio.gather(*(self._ask(session, title, kind) for title, kind in step.calls))
        for (title, _kind), chosen in zip(step.calls, outcomes, strict=True):
            prefix = "permission outcome" if len(step.calls) == 1 else f"permission outcome for {title}"
            await self._say(session, f"{prefix}: {chosen}")
        if "cancelled" in outcomes:
            raise _Cancelled

    async def _ask(self, session: _Session, title: str, kind: str) -> str:
        from acp.schema import PermissionOption, ToolCallUpdate

        call_id = f"perm-{uuid.uuid4().hex[:8]}"
        raw_input = {"command": title} if kind == "execute" else {"path": title}
        # Validated from plain values: the directive parser checked ``kind`` against the schema's tool kinds.
        response = await self._conn.request_permission(
            session_id=session.id,
            tool_call=ToolCallUpdate.model_validate(
                {"toolCallId": call_id, "title": title, "kind": kind, "status": "pending", "rawInput": raw_input}
            ),
            options=[
                PermissionOption.model_validate({"optionId": o, "name": n, "kind": k}) for o, n, k in PERMISSION_OPTIONS
            ],
        )
        return str(getattr(response.outcome, "option_id", None) or "cancelled")

    async def _do_elicit(self, session: _Session, step: Step, _: Any) -> None:
        properties: dict[str, Any] = {}
        for name, kind in step.calls:
            if "/" in kind:
                properties[name] = {"type": "string", "enum": kind.split("/")}
            else:
                properties[name] = {"type": kind, "title": name.capitalize()}
        schema = {"type": "object", "properties": properties, "required": [name for name, _ in step.calls]}
        await self._elicitation(session, step.arg, {"sessionId": session.id, "requestedSchema": schema}, "form")

    async def _do_visit(self, session: _Session, step: Step, _: Any) -> None:
        ((url, _none),) = step.calls
        scope = {"sessionId": session.id, "elicitationId": f"visit-{uuid.uuid4().hex[:8]}", "url": url}
        await self._elicitation(session, step.arg, scope, "url")

    async def _elicitation(self, session: _Session, message: str, fields: dict[str, Any], mode: str) -> None:
        from acp.schema import ElicitationFormSessionMode, ElicitationUrlSessionMode

        model = ElicitationFormSessionMode if mode == "form" else ElicitationUrlSessionMode
        answer = await self._cancellable(
            session, self._conn.create_elicitation(message=message, mode=model.model_validate(fields))
        )
        said = answer.model_dump(mode="json", by_alias=True, exclude_none=True)
        await self._say(session, f"elicitation: {json.dumps(said, sort_keys=True)}")

    async def _do_sleep(self, session: _Session, step: Step, _: Any) -> None:
        try:
            await asyncio.wait_for(session.cancelled.wait(), step.number / 1000)
        except TimeoutError:
            return
        raise _Cancelled

    async def _do_barrier(self, session: _Session, step: Step, _: Any) -> None:
        arrived, everyone = self._barriers.get(step.arg) or (0, asyncio.Event())
        arrived += 1
        self._barriers[step.arg] = (arrived, everyone)
        if arrived >= step.number:
            del self._barriers[step.arg]  # the next /barrier of that name starts a new round
            everyone.set()
        await self._cancellable(session, everyone.wait())

    async def _do_later(self, session: _Session, step: Step, turn_ended: asyncio.Event) -> None:
        task = asyncio.create_task(self._later(session, step, turn_ended))
        self._background.add(task)
        session.later.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(session.later.discard)

    async def _announce_commands(self, session_id: str) -> None:
        """Its directives, as slash commands (``available_commands_update``). Sent before answering ``session/new``
        (Claude Code sends them just after): the client has them before the first prompt's answer, every time."""
        from acp.schema import AvailableCommandsUpdate

        commands = [
            {"name": d.name, "description": d.does, **({"input": {"hint": d.syntax}} if d.syntax else {})}
            for d in DIRECTIVES.values()
            if not d.misbehaviour
        ]
        update = {"sessionUpdate": "available_commands_update", "availableCommands": commands}
        try:
            await self._conn.session_update(session_id, AvailableCommandsUpdate.model_validate(update))
        except Exception as exc:  # the client went away meanwhile
            log.info("commands not announced: %s", exc)

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

    async def _do_help(self, session: _Session, step: Step, _: Any) -> None:
        await self._say(session, reference())

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
        await self._conn.session_update(
            session.id, start_tool_call(call_id, step.arg, kind="execute", status="pending")
        )
        await self._conn.session_update(session.id, update_tool_call(call_id, status="in_progress"))

    async def _do_straycall(self, session: _Session, step: Step, _: Any) -> None:
        from acp import text_block, tool_content, update_tool_call

        call_id = f"stray-{uuid.uuid4().hex[:8]}"
        await self._conn.session_update(
            session.id, update_tool_call(call_id, status="completed", content=[tool_content(text_block("stray"))])
        )

    async def _do_badupdate(self, session: _Session, step: Step, _: Any) -> None:
        from acp.schema import AgentMessageChunk, TextContentBlock

        # ``model_construct`` is pydantic's way to build a model without validating it: a text block without its
        # text goes out through the SDK's public ``session_update`` (pydantic warns while serialising it; we know).
        chunk = AgentMessageChunk.model_construct(
            session_update="agent_message_chunk", content=TextContentBlock.model_construct(type="text")
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            await self._conn.session_update(session.id, chunk)

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

    async def _call_tools(
        self, session: _Session, calls: tuple[tuple[str, Any], ...], timeout: float | None = None
    ) -> list[tuple[bool, str]]:
        from .tools import call_tools

        return await call_tools(session, calls, timeout)


def main() -> None:
    logging.basicConfig(
        level=os.environ.get("LMBRIDGE_DEMO_LOG", "WARNING"),
        stream=sys.stderr,
        format="demo-agent %(levelname)s %(message)s",
    )
    import acp

    agent = DemoAgent(os.environ.get("LMBRIDGE_DEMO_STATE_DIR") or None)
    # Deliberately not an ``acp.Agent`` (see ``DemoAgent``): the SDK calls only the methods it has.
    asyncio.run(
        acp.run_agent(
            agent,  # type: ignore[arg-type]  # duck-typed: the SDK's signature asks for the whole protocol class
            use_unstable_protocol=True,
            observers=[agent.observe],
        )
    )


if __name__ == "__main__":
    main()
