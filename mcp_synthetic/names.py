"""Tool names as agents can take them, mapped reversibly to the editor's names.

MCP clients and the model APIs behind agents restrict tool names. MCP's own rule (SEP-986) is
``^[A-Za-z0-9._-]{1,128}$``; Anthropic's and OpenAI's APIs allow no dots and at most 64 characters, and agents
prefix MCP tools with the server's name (Claude Code: ``mcp__editor__``, Gemini CLI: ``mcp_editor_``). So a name is
passed through unchanged only when it is made of letters, digits, ``_`` and ``-`` and is at most 48 characters
long; any other name is rewritten (invalid characters → ``_``, shortened, plus a short hash so distinct names stay
distinct) and mapped back when the agent calls it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

__all__ = ["MAX_NAME", "ToolNames", "agent_name"]

MAX_NAME = 48
_SAFE = re.compile(r"^[A-Za-z0-9_-]{1,48}$")
_UNSAFE_CHARS = re.compile(r"[^A-Za-z0-9_-]")


def agent_name(editor_name: str) -> str:
    """The name the agent sees for an editor tool (deterministic)."""
    if _SAFE.match(editor_name):
        return editor_name
    suffix = hashlib.blake2b(editor_name.encode(), digest_size=3).hexdigest()
    base = _UNSAFE_CHARS.sub("_", editor_name).strip("_") or "tool"
    return f"{base[: MAX_NAME - len(suffix) - 1]}_{suffix}"


class ToolNames:
    """The mapping for one set of editor tools."""

    def __init__(self, editor_names: Iterable[str] = ()) -> None:
        self._to_editor: dict[str, str] = {}
        self._to_agent: dict[str, str] = {}
        for name in editor_names:
            self.add(name)

    def add(self, editor_name: str) -> str:
        name = agent_name(editor_name)
        self._to_editor[name] = editor_name
        self._to_agent[editor_name] = name
        return name

    def editor(self, agent_facing: str) -> str | None:
        return self._to_editor.get(agent_facing)

    def agent(self, editor_name: str) -> str:
        return self._to_agent.get(editor_name) or self.add(editor_name)
