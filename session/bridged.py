"""Recognising the agent's own reports about the editor's tools.

When an agent calls a tool of lmbridge's MCP server, it also reports the call as agent activity (``tool_call``
updates) and may ask permission for it. The editor already sees those calls as ``tool_call`` parts and confirms them
itself, so lmbridge neither renders them as activity nor asks about them. Agents describe such a call differently
(seen with the pinned versions, for an MCP server named ``editor``):

- Claude Code: title and ``_meta.claudeCode.toolName`` ``mcp__editor__<tool>``;
- Codex: title ``Tool: editor/<tool>`` (permission: "Approve MCP tool call"), ``rawInput.server`` or
  ``rawInput.server_name`` ``editor``;
- Gemini CLI: title ``<tool> (editor MCP Server)``, tool call id ``mcp_editor_<tool>__…``;
- OpenCode: title ``editor_<tool>``, kind ``other`` (its own tools have plain names: ``bash``, ``read``, ``edit``…).
"""

from __future__ import annotations

from typing import Any

from .messages import object_at, string_at

__all__ = ["is_bridged_tool"]


def is_bridged_tool(tool_call: dict[str, Any], server: str) -> bool:
    """Does this ACP tool call (a ``tool_call``/``tool_call_update`` or a permission request's ``toolCall``) concern
    a tool of the MCP server named ``server``?"""
    title = string_at(tool_call, "title")
    call_id = string_at(tool_call, "toolCallId")
    raw_input = object_at(tool_call, "rawInput")
    if server in (raw_input.get("server"), raw_input.get("server_name"), raw_input.get("serverName")):
        return True
    claude_prefix = f"mcp__{server}__"
    if string_at(object_at(object_at(tool_call, "_meta"), "claudeCode"), "toolName").startswith(claude_prefix):
        return True
    return (
        title.startswith((claude_prefix, f"Tool: {server}/"))
        or call_id.startswith((claude_prefix, f"mcp_{server}_"))
        or title.endswith(f"({server} MCP Server)")
        or (title.startswith(f"{server}_") and tool_call.get("kind") in (None, "other"))
    )
