"""Permission bridging, sans-IO: ACP ``session/request_permission`` ↔ a ``tool_call`` of the editor's permission
tool.

Owns the policy (``ask``, ``allow_reads``, ``allow_all``, ``deny``), the permission tool's input (what a person needs
to decide), and reading the editor's answer back into an ACP outcome: an offered ``optionId``; or words — allow /
approve / yes → allow_once, always → allow_always, reject / deny / no → reject_once, VS Code's "The user chose to
skip the tool call" → reject_once; anything unreadable → reject_once.

Requests that concern the editor's own bridged tools are allowed once without asking: the editor confirms those
itself when it runs them (``session.bridged`` recognises them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .bridged import is_bridged_tool
from .messages import object_at, string_at

__all__ = [
    "DEFAULT_PERMISSION_TOOL",
    "READ_KINDS",
    "PermissionPolicy",
    "cancelled_outcome",
    "permission_tool_schema",
]

DEFAULT_PERMISSION_TOOL = "acp_agent_action"
READ_KINDS = frozenset({"read", "search", "fetch", "think"})

_ALWAYS = re.compile(r"\balways\b")
_ALLOW = re.compile(
    r"\b(allow|allowed|approve|approved|accept|accepted|yes|ok|okay|proceed|continue|confirm|confirmed)\b"
)
_REJECT = re.compile(
    r"\b(reject|rejected|deny|denied|no|not|never|don't|dont|decline|declined|refuse|refused|cancel|"
    r"cancelled|skip|skipped|abort)\b"
)
_SKIPPED = "the user chose to skip the tool call"


def cancelled_outcome() -> dict[str, Any]:
    return {"outcome": {"outcome": "cancelled"}}


def _selected(option_id: str) -> dict[str, Any]:
    return {"outcome": {"outcome": "selected", "optionId": option_id}}


def permission_tool_schema(name: str = DEFAULT_PERMISSION_TOOL) -> dict[str, Any]:
    """The tool an editor registers so the agent's permission requests reach its confirmation UI."""
    return {
        "name": name,
        "description": (
            "Asks the user to approve an action the coding agent wants to take (run a command, edit files, ...). "
            "Show the title, kind, command or paths and the options; answer with the chosen optionId, or with "
            "'allow', 'always' or 'reject'."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {
                "title": {"type": "string", "description": "What the agent wants to do."},
                "kind": {
                    "type": "string",
                    "description": "read, edit, delete, move, search, execute, think, fetch, switch_mode or other.",
                },
                "command": {"type": "string", "description": "The command line, for execute actions."},
                "paths": {"type": "array", "items": {"type": "string"}, "description": "Files concerned."},
                "details": {"type": "object", "description": "The agent's raw input for the action."},
                "options": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "optionId": {"type": "string"},
                            "name": {"type": "string"},
                            "kind": {"type": "string"},
                        },
                        "required": ["optionId", "name", "kind"],
                    },
                },
            },
            "required": ["title", "options"],
        },
    }


@dataclass(frozen=True, slots=True)
class PermissionPolicy:
    policy: str = "ask"
    tool_name: str = DEFAULT_PERMISSION_TOOL
    server_name: str = "editor"  # the synthetic MCP server's name in session/new

    def automatic(self, params: dict[str, Any], *, tool_offered: bool) -> dict[str, Any] | None:
        """The outcome to answer without asking the editor, or None to ask."""
        options = _options(params)
        tool_call = object_at(params, "toolCall")
        if is_bridged_tool(tool_call, self.server_name):
            return _choose(options, "allow_once")
        if self.policy == "allow_all":
            return _choose(options, "allow_once")
        if self.policy == "deny":
            return _choose(options, "reject_once")
        if self.policy == "allow_reads" and tool_call.get("kind") in READ_KINDS:
            return _choose(options, "allow_once")
        if not tool_offered:
            return _choose(options, "reject_once")
        return None

    def tool_input(self, params: dict[str, Any]) -> dict[str, Any]:
        """The permission tool's input: what a person needs to decide."""
        tool_call = object_at(params, "toolCall")
        raw_input = tool_call.get("rawInput")
        title = string_at(tool_call, "title") or "The agent asks for permission"
        value: dict[str, Any] = {"title": title, "kind": tool_call.get("kind") or "other"}
        command = _command(raw_input)
        if command:
            value["command"] = command
        paths = _paths(tool_call, raw_input)
        if paths:
            value["paths"] = paths
        if isinstance(raw_input, dict) and raw_input:
            value["details"] = raw_input
        value["options"] = [
            {"optionId": o["optionId"], "name": o.get("name", o["optionId"]), "kind": o.get("kind", "")}
            for o in _options(params)
        ]
        return value

    def outcome_for_result(self, params: dict[str, Any], result: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Read the editor's tool result. Returns the outcome and whether the answer was understood."""
        options = _options(params)
        text = "".join(p.get("value", "") for p in result.get("content", ()) if p.get("type") == "text").strip()
        for option in options:
            if text == option["optionId"]:
                return _selected(option["optionId"]), True
        lowered = text.lower()
        if result.get("isError") or _SKIPPED in lowered:
            return _choose(options, "reject_once"), True
        for option in options:  # the option's display name, e.g. "Allow always"
            if lowered == str(option.get("name", "")).lower():
                return _selected(option["optionId"]), True
        if _REJECT.search(lowered):
            return _choose(options, "reject_once"), True
        if _ALWAYS.search(lowered):
            return _choose(options, "allow_always"), True
        if _ALLOW.search(lowered):
            return _choose(options, "allow_once"), True
        return _choose(options, "reject_once"), False


def _options(params: dict[str, Any]) -> list[dict[str, Any]]:
    options = params.get("options")
    if not isinstance(options, list):
        return []
    return [o for o in options if isinstance(o, dict) and isinstance(o.get("optionId"), str)]


_FALLBACK = {
    "allow_always": ("allow_always", "allow_once"),
    "allow_once": ("allow_once", "allow_always"),
    "reject_once": ("reject_once", "reject_always"),
}


def _choose(options: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The first offered option of ``kind`` (or its nearest kind). With none, ``cancelled``: the only outcome that
    needs no option (agents treat it as a refusal)."""
    for wanted in _FALLBACK.get(kind, (kind,)):
        for option in options:
            if option.get("kind") == wanted:
                return _selected(option["optionId"])
    return cancelled_outcome()


def _command(raw_input: Any) -> str | None:
    if not isinstance(raw_input, dict):
        return None
    for key in ("command", "cmd"):
        value = raw_input.get(key)
        if isinstance(value, str) and value:
            return value
        if isinstance(value, list) and all(isinstance(v, str) for v in value) and value:
            return " ".join(value)
    return None


def _paths(tool_call: dict[str, Any], raw_input: Any) -> list[str]:
    paths: list[str] = []
    locations = tool_call.get("locations")
    if isinstance(locations, list):
        paths += [loc["path"] for loc in locations if isinstance(loc, dict) and isinstance(loc.get("path"), str)]
    if isinstance(raw_input, dict):
        for key in ("path", "file_path", "filePath", "abs_path", "absolute_path", "notebook_path"):
            value = raw_input.get(key)
            if isinstance(value, str) and value not in paths:
                paths.append(value)
        for key in ("paths", "files"):
            value = raw_input.get(key)
            if isinstance(value, list):
                paths += [v for v in value if isinstance(v, str) and v not in paths]
    return paths
