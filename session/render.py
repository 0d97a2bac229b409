"""Rendering agent activity for an editor: ACP ``session/update`` → editor parts. Sans-IO and stateful per session.

Owns how the agent's work looks in an editor that only understands text, thinking, tool calls and data:

- message chunks → ``text`` (images → ``data``); thought chunks → ``thinking`` (the caller drops them unless the
  editor declared ``capabilities.thinking``);
- agent-internal tool calls (``tool_call``/``tool_call_update``) → one text line when a tool starts and one when
  it ends, whatever the number of updates in between; updates for ids never announced are tolerated;
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

from .messages import ACP_UPDATE_MIME_TYPE

__all__ = ["ActivityRenderer", "parse_update", "acp_update_part", "Usage"]

_adapter: Any = None


def _update_adapter() -> Any:
    global _adapter
    if _adapter is None:
        from acp.schema import SessionNotification
        from pydantic import TypeAdapter

        _adapter = TypeAdapter(SessionNotification.model_fields["update"].annotation)
    return _adapter


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
    __slots__ = ("title", "started", "ended")

    def __init__(self, title: str) -> None:
        self.title = title
        self.started = False
        self.ended = False


_END_STATUSES = ("completed", "failed")
_PLAN_MARK = {"completed": "x", "in_progress": "~", "pending": " "}


class ActivityRenderer:
    def __init__(self) -> None:
        self._tools: dict[str, _ToolView] = {}
        self._plan: tuple[tuple[str, str], ...] | None = None
        self._at_line_start = True
        self.usage: Usage | None = None

    def render(self, update: dict[str, Any]) -> list[dict[str, Any]]:
        kind = update.get("sessionUpdate")
        if kind == "agent_message_chunk":
            content = update.get("content")
            if isinstance(content, dict) and content.get("type") == "text" and isinstance(content.get("text"), str):
                return self._text(content["text"])
        model = parse_update(update)
        if isinstance(model, dict):
            return []
        name = type(model).__name__
        if name == "AgentMessageChunk":
            return self._content(model.content)
        if name == "AgentThoughtChunk":
            text = getattr(model.content, "text", None)
            return [{"type": "thinking", "value": text}] if text else []
        if name == "ToolCallStart":
            return self._tool(model.tool_call_id, model.title, model.status, model.content, announce=True)
        if name == "ToolCallProgress":
            return self._tool(model.tool_call_id, model.title, model.status, model.content, announce=False)
        if name == "AgentPlanUpdate":
            return self._plan_update(model.entries)
        if name == "UsageUpdate":
            self.usage = Usage(model.used, model.size)
        return []

    # -- pieces ---------------------------------------------------------------------------------------------

    def _text(self, text: str) -> list[dict[str, Any]]:
        if not text:
            return []
        self._at_line_start = text.endswith("\n")
        return [{"type": "text", "value": text}]

    def _line(self, line: str) -> list[dict[str, Any]]:
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

    def _tool(self, tool_id: str, title: str | None, status: str | None, content: Any, *, announce: bool) -> list[dict[str, Any]]:
        view = self._tools.get(tool_id)
        if view is None:
            view = self._tools[tool_id] = _ToolView(title or f"tool {tool_id}")
        elif title:
            view.title = title
        parts: list[dict[str, Any]] = []
        if status in _END_STATUSES:
            if not view.ended:
                view.ended = True
                if status == "completed":
                    parts += self._line(f"✓ {view.title}")
                else:
                    detail = _first_text(content)
                    parts += self._line(f"✗ {view.title} failed" + (f": {detail}" if detail else ""))
        elif not view.started and not view.ended and (announce or status is not None):
            view.started = True
            parts += self._line(f"▸ {view.title}")
        return parts

    def _plan_update(self, entries: list[Any]) -> list[dict[str, Any]]:
        plan = tuple((entry.content, entry.status) for entry in entries)
        if plan == self._plan:
            return []
        self._plan = plan
        lines = ["Plan:"] + [f"- [{_PLAN_MARK.get(status, ' ')}] {content}" for content, status in plan]
        prefix = "" if self._at_line_start else "\n"
        self._at_line_start = True
        return [{"type": "text", "value": prefix + "\n".join(lines) + "\n"}]


def _first_text(content: Any) -> str:
    for item in content or ():
        block = getattr(item, "content", None)
        text = getattr(block, "text", None)
        if text:
            line = text.strip().splitlines()[0] if text.strip() else ""
            return line[:200]
    return ""
