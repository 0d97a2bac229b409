"""What the agent is told: editor messages → ACP prompt content blocks, and the compact transcript that seeds a new
ACP session with a conversation it has not seen.

Owns both text formats. Blocks the bridge writes as context start with ``CONTEXT_PREFIX`` so that agents built for
tests (the demo agent) can tell them from the user's words. The transcript lists user and assistant text, tool calls
and tool results, one entry per part, with long tool payloads shortened.
"""

from __future__ import annotations

import json
from typing import Any

from .messages import string_at

__all__ = [
    "CONTEXT_PREFIX",
    "EDITOR_INSTRUCTIONS_HEADER",
    "TRANSCRIPT_HEADER",
    "prompt_blocks",
    "trailing_input",
    "transcript",
]

CONTEXT_PREFIX = "[lmbridge]"  # starts every block that is context written by the bridge, not the user's words
TRANSCRIPT_HEADER = f"{CONTEXT_PREFIX} The conversation so far (you are continuing it):"
EDITOR_INSTRUCTIONS_HEADER = f"{CONTEXT_PREFIX} Instructions from the editor:"
_MAX_PAYLOAD_CHARS = 2000
_ROLE_LABEL = {"user": "User", "assistant": "Assistant", "system": "System"}


def _content(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "value": content}]
    return [p for p in content if isinstance(p, dict)] if isinstance(content, list) else []


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= _MAX_PAYLOAD_CHARS else text[:_MAX_PAYLOAD_CHARS] + f"… [{len(text)} chars]"


def _result_text(part: dict[str, Any]) -> str:
    pieces = []
    for inner in part.get("content", ()):
        if inner.get("type") == "text":
            pieces.append(inner["value"])
        elif inner.get("type") == "data":
            pieces.append(f"[{inner.get('mimeType')} data]")
    return "".join(pieces)


def _flush_text(lines: list[str], label: str, text: list[str]) -> None:
    body = "".join(text).strip()
    if body:
        lines.append(f"{label}: {body}")
    text.clear()


def transcript(messages: list[dict[str, Any]]) -> str:
    """The compact transcript of ``messages`` (checked editor messages), starting with the header line."""
    lines = [TRANSCRIPT_HEADER]
    for message in messages:
        label = _ROLE_LABEL.get(string_at(message, "role"), "User")
        text: list[str] = []
        for part in _content(message):
            kind = part.get("type")
            if kind == "text":
                text.append(part["value"])
                continue
            _flush_text(lines, label, text)
            if kind == "tool_call":
                lines.append(
                    f"{label} called tool {part['name']} (call {part['callId']}) with {_short(part.get('input'))}"
                )
            elif kind == "tool_result":
                status = "failed" if part.get("isError") else "returned"
                lines.append(f"Tool call {part['callId']} {status}: {_short(_result_text(part))}")
            elif kind == "data" and str(part.get("mimeType", "")).startswith("image/"):
                lines.append(f"{label}: [image {part['mimeType']}]")
        _flush_text(lines, label, text)
    return "\n".join(lines)


def trailing_input(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The editor's newest input: the messages after the last assistant message."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "assistant":
            return messages[index + 1 :]
    return messages


def prompt_blocks(messages: list[dict[str, Any]], *, images: bool) -> list[dict[str, Any]]:
    """ACP content blocks for new editor input: user text as text, images as image blocks (when the agent takes
    them), system text under a header, and tool results the agent is not waiting for as text. Adjacent text is
    merged into one block; where one message ends and the next begins, a blank line keeps them apart (the parts of
    one message are joined as they are: editors split a message's text anywhere). Assistant messages are skipped:
    the agent wrote them."""
    blocks: list[dict[str, Any]] = []
    new_message = False

    def add_text(text: str) -> None:
        nonlocal new_message
        if not text:
            return
        if blocks and blocks[-1]["type"] == "text" and not blocks[-1]["text"].startswith(EDITOR_INSTRUCTIONS_HEADER):
            before = blocks[-1]["text"]
            if new_message:
                before = before.rstrip("\n") + "\n\n"
                text = text.lstrip("\n")
            blocks[-1] = {"type": "text", "text": before + text}
        else:
            blocks.append({"type": "text", "text": text})
        new_message = False

    for message in messages:
        new_message = True
        role = message.get("role")
        if role == "assistant":
            continue
        if role == "system":
            body = "".join(p["value"] for p in _content(message) if p.get("type") == "text").strip()
            if body:
                blocks.append({"type": "text", "text": f"{EDITOR_INSTRUCTIONS_HEADER}\n{body}"})
            continue
        for part in _content(message):
            kind = part.get("type")
            if kind == "text":
                add_text(part["value"])
            elif kind == "data" and str(part.get("mimeType", "")).startswith("image/"):
                if images:
                    blocks.append({"type": "image", "mimeType": part["mimeType"], "data": part["data"]})
                else:
                    add_text(f"\n[an image ({part['mimeType']}) was attached; this agent does not accept images]\n")
            elif kind == "tool_result":
                status = "failed" if part.get("isError") else "returned"
                add_text(f"\n[tool call {part['callId']} {status}: {_short(_result_text(part))}]\n")
    return blocks
