"""Rendering agent activity for an editor: ACP ``session/update`` → editor parts. Sans-IO and stateful per session.

Owns how the agent's work looks in an editor that only understands text, thinking, tool calls and data:

- message chunks → ``text`` (images → ``data``); thought chunks → ``thinking`` (the caller drops them unless the
  editor declared ``capabilities.thinking``);
- agent-internal tool calls (``tool_call``/``tool_call_update``) → one text line when a tool starts running and one
  when it ends, whatever the number of updates in between; updates for ids never announced are tolerated; calls to
  the editor's own tools are not rendered (the editor has them as ``tool_call`` parts);
- ``plan`` → a Markdown checklist, only when it changed;
- everything else (commands, modes, usage, unknown variants) → no text.

Updates are read from the dicts as they arrive, each field checked for the type ACP v1 gives it; an update with a
field of the wrong type renders nothing (as the schema would reject it). The official ``acp.schema`` models are
not built on this path: building them takes most of a second, which the first turn with a tool call would wait
for (``tests/test_render.py`` holds the renderer to the schema's verdicts).
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass
from typing import Any, TypeGuard

from .bridged import is_bridged_tool
from .messages import ACP_UPDATE_MIME_TYPE

__all__ = ["ActivityRenderer", "Usage", "acp_update_part", "prompt_usage"]


def acp_update_part(update: dict[str, Any]) -> dict[str, Any]:
    """The raw update as a ``data`` part, for editors that asked for ``capabilities.acpUpdates``."""
    data = base64.b64encode(json.dumps(update, separators=(",", ":"), ensure_ascii=False).encode()).decode()
    return {"type": "data", "mimeType": ACP_UPDATE_MIME_TYPE, "data": data}


@dataclass(frozen=True, slots=True)
class Usage:
    used: int
    size: int
    cost: dict[str, Any] | None = None  # {"amount": number, "currency": "USD"}: the session's cost so far


class _ToolView:
    __slots__ = ("bridged", "ended", "started", "title")

    def __init__(self, title: str, bridged: bool) -> None:
        self.title = title
        self.started = False
        self.ended = False
        self.bridged = bridged


_END_STATUSES = ("completed", "failed")
_PLAN_MARK = {"completed": "x", "in_progress": "~", "pending": " "}


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
                return self._text(content["text"])  # the hot path: plain text, the overwhelming majority
            return self._content(content)
        if kind == "agent_thought_chunk":
            content = update.get("content")
            if not _content_block(content):
                return []
            text = content.get("text") if content.get("type") == "text" else None
            return [{"type": "thinking", "value": text}] if text else []
        if kind in ("tool_call", "tool_call_update"):
            return self._tool(update, started=kind == "tool_call")
        if kind == "plan":
            return self._plan_update(update.get("entries"))
        if kind == "usage_update":
            used, size = update.get("used"), update.get("size")
            if isinstance(used, int) and isinstance(size, int):
                self.usage = Usage(used, size, _cost(update.get("cost")))
        return []  # commands, modes, session info, echoed user text, unknown variants: no text

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
        if not _content_block(block):
            return []
        kind = block["type"]
        if kind == "text":
            return self._text(block["text"])
        if kind == "image":
            return [{"type": "data", "mimeType": block["mimeType"], "data": block["data"]}]
        if kind == "resource_link":
            return self._text(f"[{block['name']}]({block['uri']})")
        if kind == "resource":
            text = block["resource"].get("text")
            return self._text(text) if isinstance(text, str) and text else []
        return []

    def _tool(self, update: dict[str, Any], *, started: bool) -> list[dict[str, Any]]:
        """One line when the tool starts running (``in_progress``: by then agents have replaced a provisional title
        such as "Terminal" with the command), one when it ends; nothing for the editor's own tools."""
        tool_id = update.get("toolCallId")
        title = update.get("title")
        content = update.get("content")
        if (
            not isinstance(tool_id, str)
            or not (isinstance(title, str) or (title is None and not started))
            or not (content is None or isinstance(content, list))
        ):
            return []  # the schema rejects it: ``tool_call`` needs a title, ids are strings, content is a list
        status = update.get("status")
        if status not in _TOOL_STATUSES:
            status = None  # as the SDK's models read a status they do not know
        view = self._tools.get(tool_id)
        if view is None:
            view = self._tools[tool_id] = _ToolView(title or f"tool {tool_id}", is_bridged_tool(update, self._server))
        elif title:
            view.title = title
        if view.bridged:
            return []
        if status in _END_STATUSES:
            if view.ended:
                return []
            view.ended = True
            if status == "completed" and not _nonzero_exit(update.get("rawOutput")):
                return self._line(f"✓ {view.title}")
            detail = _failure_detail(content, update.get("rawOutput"))
            return self._line(f"✗ {view.title} failed" + (f": {detail}" if detail else ""))
        if status == "in_progress" and not view.started and not view.ended:
            view.started = True
            return self._line(f"▸ {view.title}")
        return []

    def _plan_update(self, entries: Any) -> list[dict[str, Any]]:
        if not isinstance(entries, list):
            return []
        # Entries the schema does not know how to read are left out, as the SDK's models leave them out.
        plan = tuple((entry["content"], entry["status"]) for entry in entries if _plan_entry(entry))
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


_TOOL_STATUSES = (None, "pending", "in_progress", "completed", "failed")
_PLAN_STATUSES = ("pending", "in_progress", "completed")
_PLAN_PRIORITIES = ("high", "medium", "low")
# What each content block needs (ACP v1 ``ContentBlock``), beside ``type``.
_BLOCK_FIELDS: dict[str, tuple[str, ...]] = {
    "text": ("text",),
    "image": ("data", "mimeType"),
    "audio": ("data", "mimeType"),
    "resource_link": ("name", "uri"),
}


def _content_block(block: Any) -> TypeGuard[dict[str, Any]]:
    """Is ``block`` a content block as the schema accepts it (the fields rendering reads, of the right types)?"""
    if not isinstance(block, dict):
        return False
    kind = block.get("type")
    if kind == "resource":
        resource = block.get("resource")
        return isinstance(resource, dict) and isinstance(resource.get("uri"), str)
    fields = _BLOCK_FIELDS.get(kind) if isinstance(kind, str) else None
    return fields is not None and all(isinstance(block.get(name), str) for name in fields)


def _plan_entry(entry: Any) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("content"), str)
        and entry.get("status") in _PLAN_STATUSES
        and entry.get("priority") in _PLAN_PRIORITIES
    )


def _nonzero_exit(raw_output: Any) -> bool:
    """Does a command reported ``completed`` say that it exited with an error? (OpenCode reports failed commands as
    completed, with ``rawOutput.metadata.exit``.)"""
    metadata = raw_output.get("metadata") if isinstance(raw_output, dict) else None
    code = metadata.get("exit") if isinstance(metadata, dict) else None
    return isinstance(code, int) and not isinstance(code, bool) and code != 0


def _failure_detail(content: Any, raw_output: Any) -> str:
    for item in content or ():
        inner = item.get("content") if isinstance(item, dict) and item.get("type") == "content" else None
        line = _meaningful_line(inner.get("text") if isinstance(inner, dict) else None)
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


def _cost(value: Any) -> dict[str, Any] | None:
    """ACP ``Cost`` (a number and an ISO 4217 code), or None when absent or malformed."""
    if not isinstance(value, dict):
        return None
    amount, currency = value.get("amount"), value.get("currency")
    if isinstance(amount, bool) or not isinstance(amount, int | float) or not math.isfinite(amount):
        return None
    if not isinstance(currency, str) or not currency:
        return None
    return {"amount": amount, "currency": currency}


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
