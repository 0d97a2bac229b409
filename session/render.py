"""Rendering agent activity for an editor: ACP ``session/update`` → editor parts. Sans-IO and stateful per session.

Owns how the agent's work looks in an editor that only understands text, thinking, tool calls and data:

- message chunks → ``text`` (images → ``data``); thought chunks → ``thinking`` (the caller drops them unless the
  editor declared ``capabilities.thinking``);
- agent-internal tool calls (``tool_call``/``tool_call_update``) → one text line when a tool starts running and one
  when it ends, whatever the number of updates in between; updates for ids never announced are tolerated; calls to
  the editor's own tools are not rendered (the editor has them as ``tool_call`` parts);
- ``plan`` → a Markdown checklist, only when it changed;
- everything else (commands, modes, usage, unknown variants) → no text.

Updates are parsed with the official ``acp.schema`` models; unknown variants stay raw dicts. Plain text chunks,
the overwhelming majority, take a fast path that reads the two fields it needs from the dict.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from .bridged import is_bridged_tool
from .messages import ACP_UPDATE_MIME_TYPE

__all__ = ["ActivityRenderer", "Usage", "acp_update_part", "parse_update", "prompt_usage"]

_adapter: Any = None


def _update_adapter() -> Any:
    global _adapter
    if _adapter is None:
        from acp.schema import SessionNotification
        from pydantic import TypeAdapter

        update_type: Any = SessionNotification.model_fields["update"].annotation  # the union of update variants
        _adapter = TypeAdapter(update_type)
    return _adapter


def schema_loaded() -> bool:
    return _adapter is not None


def load_schema() -> None:
    """Build the ``acp.schema`` update model (about 0.7 s the first time: run it off the event loop)."""
    _update_adapter()


def needs_schema(update: dict[str, Any]) -> bool:
    """Whether rendering this update parses it with the schema models (plain text and quiet updates do not)."""
    kind = update.get("sessionUpdate")
    if kind == "agent_message_chunk":
        content = update.get("content")
        return not (
            isinstance(content, dict) and content.get("type") == "text" and isinstance(content.get("text"), str)
        )
    return kind not in _QUIET and kind != "usage_update"


def parse_update(update: dict[str, Any]) -> Any:
    """The ``acp.schema`` model for a known update variant; the raw dict for anything the schema rejects."""
    from pydantic import ValidationError

    try:
        return _update_adapter().validate_python(update)
    except ValidationError:
        return update


def acp_update_part(update: dict[str, Any]) -> dict[str, Any]:
    """The raw update as a ``data`` part, for editors that asked for ``capabilities.acpUpdates``."""
    data = base64.b64encode(json.dumps(update, separators=(",", ":"), ensure_ascii=False).encode()).decode()
    return {"type": "data", "mimeType": ACP_UPDATE_MIME_TYPE, "data": data}


@dataclass(frozen=True, slots=True)
class Usage:
    used: int
    size: int


class _ToolView:
    __slots__ = ("bridged", "ended", "started", "title")

    def __init__(self, title: str, bridged: bool) -> None:
        self.title = title
        self.started = False
        self.ended = False
        self.bridged = bridged


_END_STATUSES = ("completed", "failed")
_PLAN_MARK = {"completed": "x", "in_progress": "~", "pending": " "}
# Updates that never produce text: answered from the dict, without loading the schema models.
_QUIET = frozenset(
    {
        "available_commands_update",
        "current_mode_update",
        "config_option_update",
        "session_info_update",
        "user_message_chunk",
    }
)


class ActivityRenderer:
    """``server`` names lmbridge's MCP server: the agent's reports about calls to it are not rendered (the editor
    sees those calls as ``tool_call`` parts already)."""

    def __init__(self, server: str = "editor") -> None:
        self._server = server
        self._tools: dict[str, _ToolView] = {}
        self._plan: tuple[tuple[str, str], ...] | None = None
        self._at_line_start = True
        self.usage: Usage | None = None
        self.activity_as_thinking = False  # tool and plan lines as thinking parts (for APIs that show reasoning)

    def render(self, update: dict[str, Any]) -> list[dict[str, Any]]:
        kind = update.get("sessionUpdate")
        if kind == "agent_message_chunk":
            content = update.get("content")
            if isinstance(content, dict) and content.get("type") == "text" and isinstance(content.get("text"), str):
                return self._text(content["text"])
        elif kind in _QUIET:
            return []
        elif kind == "usage_update":
            used, size = update.get("used"), update.get("size")
            if isinstance(used, int) and isinstance(size, int):
                self.usage = Usage(used, size)
            return []
        model = parse_update(update)
        if isinstance(model, dict):
            return []
        name = type(model).__name__
        if name == "AgentMessageChunk":
            return self._content(model.content)
        if name == "AgentThoughtChunk":
            text = getattr(model.content, "text", None)
            return [{"type": "thinking", "value": text}] if text else []
        if name in ("ToolCallStart", "ToolCallProgress"):
            return self._tool(update, model)
        if name == "AgentPlanUpdate":
            return self._plan_update(model.entries)
        return []

    # -- pieces ---------------------------------------------------------------------------------------------

    def _text(self, text: str) -> list[dict[str, Any]]:
        if not text:
            return []
        self._at_line_start = text.endswith("\n")
        return [{"type": "text", "value": text}]

    def _line(self, line: str) -> list[dict[str, Any]]:
        if self.activity_as_thinking:
            return [{"type": "thinking", "value": f"{line}\n"}]
        prefix = "" if self._at_line_start else "\n"
        self._at_line_start = True
        return [{"type": "text", "value": f"{prefix}{line}\n"}]

    def _content(self, block: Any) -> list[dict[str, Any]]:
        kind = getattr(block, "type", None)
        if kind == "text":
            return self._text(block.text)
        if kind == "image":
            return [{"type": "data", "mimeType": block.mime_type, "data": block.data}]
        if kind == "resource_link":
            return self._text(f"[{block.name}]({block.uri})")
        if kind == "resource":
            text = getattr(block.resource, "text", None)
            return self._text(text) if text else []
        return []

    def _tool(self, update: dict[str, Any], model: Any) -> list[dict[str, Any]]:
        """One line when the tool starts running (``in_progress``: by then agents have replaced a provisional title
        such as "Terminal" with the command), one when it ends; nothing for the editor's own tools."""
        tool_id = model.tool_call_id
        view = self._tools.get(tool_id)
        if view is None:
            view = self._tools[tool_id] = _ToolView(
                model.title or f"tool {tool_id}", is_bridged_tool(update, self._server)
            )
        elif model.title:
            view.title = model.title
        if view.bridged:
            return []
        status = model.status
        if status in _END_STATUSES:
            if view.ended:
                return []
            view.ended = True
            if status == "completed":
                return self._line(f"✓ {view.title}")
            detail = _failure_detail(model.content, update.get("rawOutput"))
            return self._line(f"✗ {view.title} failed" + (f": {detail}" if detail else ""))
        if status == "in_progress" and not view.started and not view.ended:
            view.started = True
            return self._line(f"▸ {view.title}")
        return []

    def _plan_update(self, entries: list[Any]) -> list[dict[str, Any]]:
        plan = tuple((entry.content, entry.status) for entry in entries)
        if plan == self._plan:
            return []
        self._plan = plan
        lines = ["Plan:"] + [f"- [{_PLAN_MARK.get(status, ' ')}] {content}" for content, status in plan]
        if self.activity_as_thinking:
            return [{"type": "thinking", "value": "\n".join(lines) + "\n"}]
        prefix = "" if self._at_line_start else "\n"
        self._at_line_start = True
        return [{"type": "text", "value": prefix + "\n".join(lines) + "\n"}]


def _meaningful_line(text: Any) -> str:
    """The first line worth showing: not blank, not a Markdown code fence."""
    if not isinstance(text, str):
        return ""
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("```"):
            return line[:200]
    return ""


def _failure_detail(content: Any, raw_output: Any) -> str:
    for item in content or ():
        line = _meaningful_line(getattr(getattr(item, "content", None), "text", None))
        if line:
            return line
    if isinstance(raw_output, dict):  # Codex: the command's output and exit code
        for key in ("stderr", "aggregated_output", "stdout", "error", "message"):
            line = _meaningful_line(raw_output.get(key))
            if line:
                return line
        if isinstance(raw_output.get("exit_code"), int):
            return f"exit code {raw_output['exit_code']}"
        return ""
    return _meaningful_line(raw_output)


def prompt_usage(result: dict[str, Any]) -> dict[str, Any] | None:
    """Token counts from a ``session/prompt`` answer, in the protocol's one shape. ACP puts them in ``usage``
    (camelCase); Gemini CLI puts them in ``_meta.quota.token_count`` (snake_case)."""
    usage: dict[str, Any] = {}
    raw = result.get("usage")
    if isinstance(raw, dict):
        for key in (
            "inputTokens",
            "outputTokens",
            "totalTokens",
            "cachedReadTokens",
            "cachedWriteTokens",
            "thoughtTokens",
        ):
            if isinstance(raw.get(key), int):
                usage[key] = raw[key]
    meta = result.get("_meta")
    quota = meta.get("quota") if isinstance(meta, dict) else None
    counts = quota.get("token_count") if isinstance(quota, dict) else None
    if isinstance(counts, dict):
        for wire, ours in (("input_tokens", "inputTokens"), ("output_tokens", "outputTokens")):
            if isinstance(counts.get(wire), int):
                usage.setdefault(ours, counts[wire])
    return usage or None
