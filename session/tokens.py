"""Token estimates for editor messages and text: what ``lm/countTokens`` and the HTTP APIs' token counting answer.

lmbridge cannot know the tokenizer of the model behind an agent, so these are estimates, tuned to be a little high
rather than low (clients use them to decide what fits): one token per 4 ASCII characters (BPE tokenizers average
3.5-4.5 on English and code), one per non-ASCII character (CJK and most symbols take one or more), 85 per image,
and 4 per message for role and framing.
"""

from __future__ import annotations

import json
import math
from typing import Any

from .messages import check_message

__all__ = ["estimate_message_tokens", "estimate_tokens", "estimate_turn_tokens"]

_MESSAGE_OVERHEAD = 4
_IMAGE_TOKENS = 85


def estimate_tokens(text: str) -> int:
    if not text:
        return 0
    ascii_chars = len(text.encode("ascii", "ignore"))
    return math.ceil(ascii_chars / 4) + (len(text) - ascii_chars)


def estimate_message_tokens(message: Any, where: str = "message") -> int:
    """The estimate for one editor message (checked: ``MessageError`` names a malformed field)."""
    return _MESSAGE_OVERHEAD + sum(_part_tokens(part) for part in check_message(message, where))


def estimate_turn_tokens(messages: list[Any], answered: Any) -> int:
    """A turn's tokens when its agent reported none: the history it was given (its model reads all of it again each
    turn) and the parts it answered. The messages were checked when the turn began."""
    total = 0
    for message in messages:
        parts = message.get("content") if isinstance(message, dict) else None
        if isinstance(parts, list):
            total += _MESSAGE_OVERHEAD + sum(_part_tokens(part) for part in parts if isinstance(part, dict))
    return total + sum(_part_tokens(part) for part in answered if isinstance(part, dict))


def _part_tokens(part: dict[str, Any]) -> int:
    kind = part.get("type")
    if kind in ("text", "thinking"):
        return estimate_tokens(part["value"])
    if kind == "tool_call":
        return estimate_tokens(part["name"]) + estimate_tokens(json.dumps(part.get("input"), ensure_ascii=False))
    if kind == "tool_result":
        return sum(_part_tokens(inner) for inner in part["content"])
    if kind == "data":
        return _IMAGE_TOKENS if part["mimeType"].startswith("image/") else estimate_tokens(part["data"]) // 2
    return 0
