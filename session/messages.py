"""Editor messages and parts (protocol v1): validation, normalisation and digests. Pure functions on the JSON
form — messages stay the dicts the editor sent, so an unchanged history can be compared at C speed.

Owns: what a valid message is (``check_message`` raises ``MessageError`` naming the field), the normal form used
to decide whether two renderings of a message are the same (``normalize``), and per-message digests.

Normalisation, so re-renderings by editors still compare equal: adjacent text parts are merged and trailing
whitespace is ignored; ``thinking`` parts and ignorable ``data`` parts (cache-control, stateful markers, our own
ACP-update parts) are dropped; tool-call inputs compare as parsed JSON (a string holding JSON equals the object);
message ``name`` is ignored.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal, NotRequired, TypedDict

from wire.errors import MessageError

__all__ = [
    "ACP_UPDATE_MIME_TYPE",
    "IGNORABLE_DATA_MIME_TYPES",
    "MAX_IMAGE_BYTES",
    "PART_TYPES",
    "ROLES",
    "DataPart",
    "Message",
    "MessageError",
    "Part",
    "TextPart",
    "ThinkingPart",
    "ToolCallPart",
    "ToolResultPart",
    "check_image_size",
    "check_message",
    "check_part",
    "digest",
    "normalize",
    "normalize_parts",
    "object_at",
    "string_at",
    "text_of",
]


# -- the parts and messages of protocol v1, as the fronts build them (docs/protocol.md, "Messages and parts") -------


class TextPart(TypedDict):
    type: Literal["text"]
    value: str


class ThinkingPart(TypedDict):
    type: Literal["thinking"]
    value: str
    id: NotRequired[str]


class ToolCallPart(TypedDict):
    type: Literal["tool_call"]
    callId: str
    name: str
    input: Any  # an object, or the string the model wrote when it was not JSON


class DataPart(TypedDict):
    type: Literal["data"]
    mimeType: str
    data: str  # base64


class ToolResultPart(TypedDict):
    type: Literal["tool_result"]
    callId: str
    content: list[Part]  # text and data parts (check_part refuses others)
    isError: NotRequired[bool]


Part = TextPart | ThinkingPart | ToolCallPart | ToolResultPart | DataPart


class Message(TypedDict):
    role: Literal["user", "assistant", "system"]
    content: list[Part]
    name: NotRequired[str]


ROLES = ("user", "assistant", "system")
PART_TYPES = ("text", "thinking", "tool_call", "tool_result", "data")
ACP_UPDATE_MIME_TYPE = "application/vnd.lmbridge.acp-update+json"
# The largest image (decoded) a message may carry: the model APIs behind the agents take 5 to 20 MB per image, and
# a larger one would fail there, after the agent's whole turn was set up, with a less clear message.
MAX_IMAGE_BYTES = 20 * 1024 * 1024
# Data parts that carry no conversation content: prompt-cache hints and stateful markers editors attach.
IGNORABLE_DATA_MIME_TYPES = frozenset(
    {
        "cache_control",
        "stateful_marker",
        "application/vnd.vscode.cache-control",
        "application/vnd.vscode.stateful-marker",
        ACP_UPDATE_MIME_TYPE,
    }
)


def string_at(value: Any, key: str, default: str = "") -> str:
    """``value[key]`` when ``value`` is an object and that is a string, else ``default`` (reading what peers sent)."""
    found = value.get(key) if isinstance(value, dict) else None
    return found if isinstance(found, str) else default


def object_at(value: Any, key: str) -> dict[str, Any]:
    """``value[key]`` when ``value`` is an object and that is an object, else an empty one."""
    found = value.get(key) if isinstance(value, dict) else None
    return found if isinstance(found, dict) else {}


def check_message(message: Any, where: str) -> list[dict[str, Any]]:
    """Check one message; returns its known parts (unknown part types are skipped, for forward compatibility)."""
    if not isinstance(message, dict):
        raise MessageError(where, "must be an object with role and content")
    role = message.get("role")
    if role not in ROLES:
        raise MessageError(f"{where}.role", f"must be one of {', '.join(ROLES)}, got {role!r}")
    content = message.get("content")
    if isinstance(content, str):  # a courtesy: a bare string is one text part
        return [{"type": "text", "value": content}]
    if not isinstance(content, list):
        raise MessageError(f"{where}.content", "must be a list of parts")
    name = message.get("name")
    if name is not None and not isinstance(name, str):
        raise MessageError(f"{where}.name", "must be a string")
    parts = []
    for index, part in enumerate(content):
        if check_part(part, f"{where}.content[{index}]"):
            parts.append(part)
    return parts


def check_part(part: Any, where: str) -> bool:
    """Check one part. True for a known, valid part; False for an unknown type (ignored); raises if malformed."""
    if not isinstance(part, dict):
        raise MessageError(where, "must be an object with a type")
    kind = part.get("type")
    if not isinstance(kind, str):
        raise MessageError(f"{where}.type", "must be a string")
    if kind == "text" or kind == "thinking":
        _string(part, "value", where)
        if kind == "thinking" and part.get("id") is not None and not isinstance(part.get("id"), str):
            raise MessageError(f"{where}.id", "must be a string")
    elif kind == "tool_call":
        _string(part, "callId", where, nonempty=True)
        _string(part, "name", where, nonempty=True)
        if "input" not in part:
            raise MessageError(f"{where}.input", "is required (use {} for no arguments)")
    elif kind == "tool_result":
        _string(part, "callId", where, nonempty=True)
        content = part.get("content")
        if not isinstance(content, list):
            raise MessageError(f"{where}.content", "must be a list of text or data parts")
        for index, inner in enumerate(content):
            inner_where = f"{where}.content[{index}]"
            if check_part(inner, inner_where) and inner["type"] not in ("text", "data"):
                raise MessageError(f"{inner_where}.type", "a tool result holds text and data parts only")
        if part.get("isError") is not None and not isinstance(part.get("isError"), bool):
            raise MessageError(f"{where}.isError", "must be true or false")
    elif kind == "data":
        _string(part, "mimeType", where, nonempty=True)
        _string(part, "data", where)
        if part["mimeType"].startswith("image/"):
            check_image_size(part["data"], f"{where}.data")
    else:
        return False
    return True


def check_image_size(data: str, where: str) -> None:
    """``MessageError`` when base64 ``data`` decodes to more than ``MAX_IMAGE_BYTES`` (estimated from its length:
    the history is re-sent with every request, and decoding it each time would cost more than the check is worth)."""
    size = len(data) * 3 // 4
    if size > MAX_IMAGE_BYTES:
        limit = MAX_IMAGE_BYTES // 1024 // 1024
        raise MessageError(
            where,
            f"an image of {size / 1024 / 1024:.1f} MB is over lmbridge's limit of {limit} MB; "
            "send it smaller (scaled down or compressed)",
        )


def _string(part: dict[str, Any], key: str, where: str, *, nonempty: bool = False) -> None:
    value = part.get(key)
    if not isinstance(value, str):
        raise MessageError(f"{where}.{key}", "is required and must be a string")
    if nonempty and not value:
        raise MessageError(f"{where}.{key}", "must not be empty")


def normalize(message: dict[str, Any]) -> tuple[Any, ...]:
    """The comparable form of a checked message: ``(role, parts...)`` with parts as tuples."""
    return (message["role"], *normalize_parts(_parts(message)))


def _parts(message: dict[str, Any]) -> list[Any]:
    content = message["content"]
    return [{"type": "text", "value": content}] if isinstance(content, str) else content


def normalize_parts(parts: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    text: list[str] = []

    def flush() -> None:
        if text:
            merged = "".join(text).rstrip()
            if merged:
                out.append(("text", merged))
            text.clear()

    for part in parts:
        kind = part.get("type")
        if kind == "text":
            text.append(part["value"])
            continue
        if kind == "thinking" or kind not in PART_TYPES:
            continue
        if kind == "data" and part["mimeType"] in IGNORABLE_DATA_MIME_TYPES:
            continue
        flush()
        if kind == "tool_call":
            out.append(("tool_call", part["callId"], part["name"], _canonical_json(part.get("input"))))
        elif kind == "tool_result":
            out.append(
                ("tool_result", part["callId"], bool(part.get("isError")), tuple(normalize_parts(part["content"])))
            )
        elif kind == "data":
            out.append(("data", part["mimeType"], hashlib.blake2b(part["data"].encode(), digest_size=16).hexdigest()))
    flush()
    return out


def _canonical_json(value: Any) -> str:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            pass
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest(normal: tuple[Any, ...]) -> bytes:
    """16-byte digest of a normalised message."""
    return hashlib.blake2b(repr(normal).encode(), digest_size=16).digest()


def text_of(parts: list[dict[str, Any]]) -> str:
    """The text parts of a part list, joined."""
    return "".join(part["value"] for part in parts if part.get("type") == "text")
