"""The editor's own models, served back: what each connected editor shares, and one call to one of those models.

Owns the models each editor shares (``initialize.editorModels``, replaced by ``editor/modelsChanged``, gone with the
editor), the names other clients know them by (``editor/<id>`` for the earliest-connected editor that shares the id,
``editor/<id>@<n>`` for each editor's own, ``n`` its connection number — stable while it stays connected), the loop
guard (a model of lmbridge's own is never taken back from an
editor), the limits (calls at once per editor; how long one may take), and one call: a single ``editor/chat`` on the
editor that shares the model, its parts streamed to the caller, cancelled with the caller. A call is stateless — no
session, no history matching: each request is complete in itself.

Two callers: the HTTP front (``editor/<id>`` on every API) and the agent's ``editor_model`` tool on the synthetic MCP
server (``tools_for``). ``bridge.editor`` tells it what each editor shares and carries the calls (``EditorLink``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from bridge.config import EDITOR_MODELS_PREFIX, EditorModelSettings, ToolSettings
from mcp_synthetic.server import LocalTool, ToolProgress
from session.tokens import estimate_message_tokens, estimate_tokens
from wire.cancel import CancelRequest
from wire.errors import EditorModelError, InvalidParams, RpcError, TooManyRequests, UnknownModel
from wire.observe.logger import Logger

from .shared_models import SharedModel

__all__ = [
    "SYSTEM_MARKER",
    "EditorAnswer",
    "EditorGone",
    "EditorLink",
    "EditorModels",
    "PartSink",
    "editor_model_id",
]

OWN_VENDOR = "lmbridge"  # the vendor lmbridge's own models have in an editor (the VS Code extension's)
# vscode.lm has no system role: a system prompt goes to the editor as the first user message, under this line.
SYSTEM_MARKER = "[System instructions]"
STOP_REASONS = ("end_turn", "tool_calls", "max_tokens", "refusal", "cancelled")
PART_TYPES = ("text", "thinking", "tool_call")

PartSink = Callable[[dict[str, Any]], Awaitable[None]]


class EditorGone(Exception):
    """The editor's connection closed before it answered."""


class EditorLink(Protocol):
    """An editor connection that can be asked ``editor/chat`` (``bridge.editor.connection`` provides it)."""

    @property
    def label(self) -> str:
        """Which editor, for logs and model lists (its client name and workspace)."""

    @property
    def principal_id(self) -> str:
        """Whose editor it is (``Principal.id``): its models answer that principal's requests only."""

    async def editor_chat(self, params: dict[str, Any], on_part: PartSink, cancel: CancelRequest) -> Any:
        """Send ``editor/chat``; each ``editor/part`` goes to ``on_part``; the answer is returned. ``cancel`` (or
        cancelling the caller) sends ``$/cancelRequest``. Raises ``RpcError`` for the editor's error answer,
        ``EditorGone`` when the connection closes first."""


@dataclass(frozen=True, slots=True)
class EditorAnswer:
    stop_reason: str
    usage: dict[str, Any] | None  # as the editor reported it, else an estimate with "estimated": true
    parts: tuple[dict[str, Any], ...]  # what the model said, in order (text, thinking, tool calls)

    @property
    def text(self) -> str:
        return "".join(part["value"] for part in self.parts if part["type"] == "text")


@dataclass(eq=False)
class _Editor:
    link: EditorLink
    ordinal: int  # 1 for the first editor that connected, 2 for the next...: tells shared ids apart
    models: dict[str, SharedModel] = field(default_factory=dict)  # what is offered: what it shares, the guard passed
    shared: tuple[SharedModel, ...] = ()  # what it shares, as it said
    running: int = 0  # calls in flight


def editor_model_id(model: SharedModel, ordinal: int, taken: bool) -> str:
    """The name a shared model is listed by: ``editor/<id>``, and ``@<n>`` (``n`` the editor's connection number)
    when an earlier editor shares that id too."""
    base = f"{EDITOR_MODELS_PREFIX}/{model.id}"
    return f"{base}@{ordinal}" if taken else base


class EditorModels:
    def __init__(
        self,
        settings: EditorModelSettings,
        tools: ToolSettings,
        *,
        own_models: Callable[[], Iterable[str]],
        log: Logger,
    ) -> None:
        """``own_models``: the ids of lmbridge's own models (its agents), which an editor shares back only by
        mistake (the loop guard refuses them)."""
        self._settings = settings
        self._tools = tools
        self._own_models = own_models
        self._log = log.bind(part="editor models")
        self._editors: dict[EditorLink, _Editor] = {}
        self._ordinals = 0
        self._watchers: set[Callable[[], None]] = set()

    # -- what editors share -------------------------------------------------------------------------------------

    def share(self, link: EditorLink, models: Iterable[SharedModel]) -> list[SharedModel]:
        """``link`` shares ``models`` now (its earlier list is replaced). Returns what is kept: models of
        lmbridge's own (its vendor, or the name of one of its agent models) are refused, never called back."""
        shared = tuple(models)
        kept = self._guarded(shared, set(self._own_models()))
        editor = self._editors.get(link)
        if editor is None:
            if not kept:
                return []
            self._ordinals += 1
            editor = self._editors[link] = _Editor(link, self._ordinals)
        editor.shared = shared
        if editor.models != kept:
            editor.models = kept
            self._log.info("editor models shared", editor=link.label, models=sorted(kept))
            self._changed()
        return list(kept.values())

    def own_models_changed(self) -> None:
        """lmbridge's own models changed (an agent listed others): the loop guard looks again at what is shared."""
        own = set(self._own_models())
        changed = False
        for editor in self._editors.values():
            kept = self._guarded(editor.shared, own, warn=False)
            if kept != editor.models:
                for model_id in editor.models.keys() - kept.keys():
                    self._log.warning("a shared model is now one of lmbridge's own; no longer offered", model=model_id)
                editor.models, changed = kept, True
        if changed:
            self._changed()

    def _guarded(self, models: Iterable[SharedModel], own: set[str], *, warn: bool = True) -> dict[str, SharedModel]:
        """``models`` minus lmbridge's own (its vendor, the name of one of its agent models, an ``editor/`` name)."""
        kept: dict[str, SharedModel] = {}
        for model in models:
            if model.vendor == OWN_VENDOR or model.id in own or model.id.startswith(f"{EDITOR_MODELS_PREFIX}/"):
                if warn:
                    self._log.warning("an editor shared a model of lmbridge's own; not taken", model=model.id)
                continue
            kept[model.id] = model
        return kept

    def withdraw(self, link: EditorLink) -> None:
        """The editor went away: its models are no longer offered."""
        editor = self._editors.pop(link, None)
        if editor is not None and editor.models:
            self._log.info("editor models withdrawn", editor=link.label)
            self._changed()

    def shared_by(self, link: Any) -> list[SharedModel]:
        editor = self._editors.get(link)
        return list(editor.models.values()) if editor is not None else []

    def _editors_of(self, principal: str | None) -> list[_Editor]:
        editors = self._editors.values()
        if principal is not None:
            editors = [editor for editor in editors if editor.link.principal_id == principal]  # type: ignore[assignment]
        return sorted(editors, key=lambda e: e.ordinal)

    def listed(self, principal: str | None = None) -> list[tuple[str, SharedModel, EditorLink]]:
        """Every model the editors of ``principal`` share (``None``: all editors'), with the name clients use for it,
        editors in the order they connected. One principal's names never depend on another's editors."""
        out: list[tuple[str, SharedModel, EditorLink]] = []
        taken: set[str] = set()
        for editor in self._editors_of(principal):
            for model in editor.models.values():
                public = editor_model_id(model, editor.ordinal, model.id in taken)
                taken.add(model.id)
                out.append((public, model, editor.link))
        return out

    def resolve(self, public_id: str, principal: str | None = None) -> tuple[SharedModel, EditorLink]:
        """The model a client of ``principal`` names: as listed, or ``editor/<id>@<n>`` for editor ``n``'s model
        whatever is listed (a name that stays with its editor while others come and go). ``UnknownModel`` lists those
        shared; another principal's editors are as if absent."""
        listed = self.listed(principal)
        for name, model, link in listed:
            if name == public_id:
                return model, link
        base, at, ordinal = public_id.rpartition("@")
        if at and ordinal.isdigit() and base.startswith(f"{EDITOR_MODELS_PREFIX}/"):
            model_id = base.removeprefix(f"{EDITOR_MODELS_PREFIX}/")
            for editor in self._editors_of(principal):
                if editor.ordinal == int(ordinal) and model_id in editor.models:
                    return editor.models[model_id], editor.link
        raise UnknownModel(public_id, [name for name, _, _ in listed], field="model")

    def watch(self, watcher: Callable[[], None]) -> Callable[[], None]:
        """Call ``watcher()`` whenever what editors share changes; returns what stops that."""
        self._watchers.add(watcher)
        return lambda: self._watchers.discard(watcher)

    def _changed(self) -> None:
        for watcher in list(self._watchers):
            watcher()

    # -- one call ---------------------------------------------------------------------------------------------

    async def call(
        self,
        link: EditorLink,
        model: SharedModel,
        messages: list[dict[str, Any]],
        on_part: PartSink,
        cancel: CancelRequest,
        *,
        tools: list[dict[str, Any]] | None = None,
        tool_mode: str | None = None,
        max_tokens: int | None = None,
        justification: str | None = None,
    ) -> EditorAnswer:
        """One ``editor/chat``: ``messages`` (editor protocol; system messages go as the first user message, under
        ``SYSTEM_MARKER``) to ``model``, each part of the answer to ``on_part`` as it comes. Raises ``InvalidParams``
        (tools for a model that cannot call tools), ``TooManyRequests`` (the editor's limit of calls at once),
        ``EditorModelError`` (the editor refused, failed, went away or took longer than the timeout)."""
        editor = self._editors.get(link)
        if editor is None or model.id not in editor.models:
            raise EditorModelError(f"the editor no longer shares the model {model.id!r}", model=model.id)
        if tools and not model.tool_calling:
            raise InvalidParams("tools", f"the editor's model {model.id!r} cannot call tools; send the request without")
        limit = self._settings.max_concurrent
        if editor.running >= limit:
            raise TooManyRequests(
                f"{limit} calls to the models of this editor are running ([editor_models] max_concurrent); retry "
                "when one has finished",
                limit=limit,
            )
        options: dict[str, Any] = {}
        if tools:
            options["tools"] = tools
        if tool_mode is not None:
            options["toolMode"] = tool_mode
        if max_tokens is not None:
            options["maxTokens"] = max_tokens
        if justification:
            options["justification"] = justification
        params: dict[str, Any] = {"modelId": model.id, "messages": with_system_as_user(messages)}
        if options:
            params["options"] = options
        parts: list[dict[str, Any]] = []

        async def part_arrived(part: Any) -> None:
            checked = _checked_part(part)
            if checked is not None:
                parts.append(checked)
                await on_part(checked)

        editor.running += 1
        started = trio.current_time()
        first: float | None = None

        async def timed(part: Any) -> None:
            nonlocal first
            if first is None:
                first = trio.current_time()
            await part_arrived(part)

        outcome = "error"
        try:
            with trio.move_on_after(self._settings.timeout) as deadline:
                answer = await link.editor_chat(params, timed, cancel)
            if deadline.cancelled_caught:
                raise EditorModelError(
                    f"the editor's model {model.id!r} did not answer within {self._settings.timeout:g} s "
                    "([editor_models] timeout)",
                    model=model.id,
                )
            outcome = "cancelled" if cancel.is_set() else "answered"
        except EditorGone:
            raise EditorModelError(
                f"the editor that shares {model.id!r} went away before its model answered; send the request again "
                "when it is back",
                model=model.id,
            ) from None
        except RpcError as error:
            if isinstance(error, EditorModelError):
                raise
            raise EditorModelError.from_editor(error, model.id) from None
        except trio.Cancelled:
            outcome = "cancelled"
            raise
        finally:
            editor.running -= 1
            self._log.info(
                "editor model call",
                editor=link.label,
                model=model.id,
                seconds=round(trio.current_time() - started, 3),
                first_part_seconds=round(first - started, 3) if first is not None else None,
                outcome=outcome,
            )
        return _answer(answer, parts, messages, cancelled=cancel.is_set())

    # -- the agent's tool -------------------------------------------------------------------------------------

    def tools_for(self, client: Any) -> list[LocalTool]:
        """The ``editor_model`` tool for a conversation of ``client`` (when it is an editor that shares models and
        the tool is on); none otherwise."""
        models = self.shared_by(client)
        if not models or not self._tools.editor_models:
            return []
        return [self._tool(client, models)]

    def _tool(self, link: EditorLink, models: list[SharedModel]) -> LocalTool:
        default = self._tools.editor_model_default
        fallback = next((m for m in models if m.id == default), models[0])
        listed = "\n".join(
            f"- {m.id}: {m.name}"
            + (f" (input up to {m.max_input_tokens} tokens)" if m.max_input_tokens else "")
            + (" [default]" if m is fallback else "")
            for m in models
        )
        description = (
            "Ask one of the language models of the user's editor a question and get its answer (it runs in the "
            "editor, on the user's own subscription). Give the whole question in 'prompt': the model sees nothing "
            f"else, no files and no earlier messages. Models:\n{listed}"
        )
        schema = {
            "type": "object",
            "properties": {
                "prompt": {"type": "string", "description": "the question, complete in itself"},
                "model": {"type": "string", "enum": [m.id for m in models], "description": "default: " + fallback.id},
                "system": {"type": "string", "description": "instructions for the model (optional)"},
                "maxTokens": {"type": "integer", "minimum": 1, "description": "longest answer, in tokens (optional)"},
            },
            "required": ["prompt"],
        }

        async def run(arguments: dict[str, Any], progress: ToolProgress | None) -> dict[str, Any]:
            return await self._run_tool(link, fallback, arguments, progress)

        return LocalTool(self._tools.editor_model_tool, description, schema, {"readOnlyHint": True}, run)

    async def _run_tool(
        self, link: EditorLink, fallback: SharedModel, arguments: dict[str, Any], progress: ToolProgress | None
    ) -> dict[str, Any]:
        """One call of the tool: MCP's ``CallToolResult`` as JSON; the text so far as progress, when asked for."""
        models = {m.id: m for m in self.shared_by(link)}
        model = models.get(arguments.get("model") or fallback.id)
        if model is None:
            available = ", ".join(models) or "none"
            return _tool_error(f"the editor shares no model {arguments.get('model')!r} (now); models: {available}")
        messages = [{"role": "user", "content": [{"type": "text", "value": arguments["prompt"]}]}]
        if arguments.get("system"):
            messages.insert(0, {"role": "system", "content": [{"type": "text", "value": arguments["system"]}]})
        said: list[str] = []

        async def streamed(part: dict[str, Any]) -> None:
            if part["type"] == "text" and part["value"]:
                said.append(part["value"])
                if progress is not None:
                    try:
                        await progress(float(len(said)), "".join(said))
                    except Exception as exc:  # a note the agent cannot take costs the note, not the answer
                        self._log.debug("a progress note could not be sent", error=str(exc))

        try:
            answer = await self.call(
                link, model, messages, streamed, CancelRequest(), max_tokens=arguments.get("maxTokens")
            )
        except (EditorModelError, TooManyRequests, InvalidParams) as error:
            return _tool_error(f"{error.message}.")
        structured: dict[str, Any] = {"model": model.id, "text": answer.text, "stopReason": answer.stop_reason}
        if answer.usage is not None:
            structured["usage"] = answer.usage
        return {
            "content": [{"type": "text", "text": answer.text}],
            "structuredContent": structured,
            "isError": False,
        }


def with_system_as_user(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The editor protocol's system messages, as the editor gets them in ``editor/chat``: one user message first,
    ``SYSTEM_MARKER`` and then their text (vscode.lm has no system role)."""
    system = [m for m in messages if m.get("role") == "system"]
    if not system:
        return messages
    text = "\n\n".join(
        part["value"]
        for m in system
        for part in m.get("content") or ()
        if isinstance(part, dict) and part.get("type") == "text"
    )
    first = {"role": "user", "content": [{"type": "text", "value": f"{SYSTEM_MARKER}\n{text}"}]}
    return [first, *(m for m in messages if m.get("role") != "system")]


def _checked_part(part: Any) -> dict[str, Any] | None:
    """A part from ``editor/part`` in the editor protocol's shape, or None for one that is not (ignored, as unknown
    part types are everywhere in the protocol)."""
    if not isinstance(part, dict):
        return None
    kind = part.get("type")
    if kind in ("text", "thinking") and isinstance(part.get("value"), str):
        return {"type": kind, "value": part["value"]}
    if kind == "tool_call" and isinstance(part.get("callId"), str) and isinstance(part.get("name"), str):
        arguments = part.get("input", {})
        if isinstance(arguments, str):  # the arguments as JSON text, as some models give them
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        if isinstance(arguments, dict):  # every API's tool call takes an object
            return {"type": "tool_call", "callId": part["callId"], "name": part["name"], "input": arguments}
    return None


def _answer(
    result: Any, parts: list[dict[str, Any]], messages: list[dict[str, Any]], *, cancelled: bool
) -> EditorAnswer:
    result = result if isinstance(result, dict) else {}
    stop = result.get("stopReason")
    if cancelled:
        stop = "cancelled"
    elif stop not in STOP_REASONS:
        stop = "tool_calls" if any(p["type"] == "tool_call" for p in parts) else "end_turn"
    usage = _reported_usage(result.get("usage"))
    if usage is None:
        usage = {
            "inputTokens": sum(_estimate(m) for m in messages),
            "outputTokens": sum(
                estimate_tokens(p["value"]) if p["type"] != "tool_call" else estimate_tokens(json.dumps(p["input"]))
                for p in parts
            ),
            "estimated": True,
        }
        usage["totalTokens"] = usage["inputTokens"] + usage["outputTokens"]
    return EditorAnswer(stop, usage, tuple(parts))


def _reported_usage(usage: Any) -> dict[str, Any] | None:
    """The editor's token counts, when they are counts (non-negative integers); else None, and they are estimated."""
    if not isinstance(usage, dict):
        return None
    counts = {key: usage[key] for key in ("inputTokens", "outputTokens", "totalTokens") if key in usage}
    if "inputTokens" not in counts and "outputTokens" not in counts:
        return None
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts.values()):
        return None
    return counts


def _estimate(message: dict[str, Any]) -> int:
    try:
        return estimate_message_tokens(message)
    except RpcError:
        return 0


def _tool_error(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": True}
