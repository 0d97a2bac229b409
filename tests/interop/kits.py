"""How each real agent is set up against the fake model, and how its model sees tools.

Owns, per agent: the ``[agents.<id>]`` table a user would write in lmbridge's config file (command, args, env,
authenticate, cwd), the files the agent itself needs in its private HOME (Codex's ``config.toml`` and model
catalog, Gemini CLI's settings and trusted folders), and the naming of tools on the model side (the editor's tools
arrive through lmbridge's MCP server, named ``editor``; each agent's built-in shell tool). Everything points at
127.0.0.1; telemetry and update checks are switched off.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from bridge.fakemodel.recipes import FOREIGN_ENV, Pointed, point_at, shell_call
from bridge.fakemodel.server import Call, ModelRequest

from .installs import PINS

__all__ = ["FOREIGN_ENV", "KITS", "MCP_SERVER", "AgentKit", "model_name", "requested_model", "write_config"]

MCP_SERVER = "editor"  # the name lmbridge gives its synthetic MCP server in session/new


@dataclass(frozen=True)
class AgentKit:
    id: str
    api: str  # the fake model API it speaks: anthropic | openai | gemini
    rejected_shell_stop_reason: str = "end_turn"  # how a turn ends when the user rejects a shell command
    model_told_of_rejection: bool = True  # after a rejected shell command the model is asked again (and answers)
    # How the MCP calls of one model response reach the editor: "together" (Claude Code, Codex: run concurrently,
    # given readOnlyHint), "one_by_one" (Gemini CLI runs them one after the other, always), or "either" (OpenCode:
    # mostly one after the other, sometimes the later ones together).
    mcp_calls: str = "together"
    # What ``mcp_transport = "auto"`` gives the agent: lmbridge's HTTP listener, or the stdio relay (each agent of the
    # suite: faster for it, docs/agents.md).
    mcp_over: str = "stdio"
    # What the agent reports of a turn's usage, as it reaches the editor (the answer's ``usage``): token counts from
    # the prompt's answer, context fill and the session's cost from ``usage_update``.
    usage_fields: tuple[str, ...] = ()
    # A session option to choose through lmbridge (options.modelOptions), and the ACP method that sets it. When the
    # option is the model, the fake model sees the chosen id in its requests.
    session_option: tuple[str, str] = ("model", "")
    sets_option_with: str = "session/set_config_option"
    model_entry: str = ""  # a model the agent lists, chosen through its lmbridge entry (``agent/<model>``)
    announces_commands: bool = False  # sends available_commands_update (slash commands) for a new session
    thought_level_option: bool = False  # offers an effort (ACP category thought_level) the model's requests show
    # A slash command typed as the message; what shows that the agent ran it; whether that is in the model's request
    # (a command that expands to a prompt) or at the start of the answer (one the agent answers itself).
    slash_command: tuple[str, str, bool] | None = None

    @property
    def executable(self) -> Path:
        return PINS[self.id].executable

    def agent_table(self, *, model_url: str, home: Path, project: Path, marker: str) -> dict[str, Any]:
        """The ``[agents.<id>]`` table, after writing whatever the agent needs under ``home``."""
        raise NotImplementedError

    def editor_tool(self, name: str, arguments: dict[str, Any]) -> Call:
        """A call of one of the editor's tools, as the model makes it."""
        raise NotImplementedError

    def offered_name(self, name: str) -> str:
        """An editor tool's name as listed in ``ModelRequest.tool_names``."""
        raise NotImplementedError

    def shell(self, command: str) -> Call:
        """A call of the agent's built-in shell tool."""
        raise NotImplementedError

    def _env(self, marker: str, pointed: Pointed) -> dict[str, str]:
        return {**pointed.env, "LMBRIDGE_TEST_MARKER": marker}


class ClaudeKit(AgentKit):
    def agent_table(self, *, model_url: str, home: Path, project: Path, marker: str) -> dict[str, Any]:
        env = self._env(marker, point_at("claude", model_url=model_url, home=home, project=project))
        node = PINS[self.id].node
        if node is not None:  # its launcher is `#!/usr/bin/env node`: the pinned node first on PATH
            env["PATH"] = f"{PINS[node].executable.parent}{os.pathsep}{os.environ.get('PATH', '')}"
        # Its sessions start in mode "auto" (since 0.5x): a model classifier decides permission requests (they would
        # not reach the editor) and, through a local endpoint, every first answer carries a billing warning.
        return {"name": "Claude Code", "command": str(self.executable), "env": env, "options": {"mode": "default"}}

    def editor_tool(self, name: str, arguments: dict[str, Any]) -> Call:
        return Call(self.offered_name(name), arguments)

    def offered_name(self, name: str) -> str:
        return f"mcp__{MCP_SERVER}__{name}"

    def shell(self, command: str) -> Call:
        return shell_call(self.id, command)


class CodexKit(AgentKit):
    def agent_table(self, *, model_url: str, home: Path, project: Path, marker: str) -> dict[str, Any]:
        env = self._env(marker, point_at("codex", model_url=model_url, home=home, project=project))
        return {"name": "Codex", "command": str(self.executable), "env": env}

    def editor_tool(self, name: str, arguments: dict[str, Any]) -> Call:
        return Call(name, arguments, namespace=f"mcp__{MCP_SERVER}")

    def offered_name(self, name: str) -> str:
        return f"mcp__{MCP_SERVER}/{name}"

    def shell(self, command: str) -> Call:
        return shell_call(self.id, command)


class GeminiKit(AgentKit):
    def agent_table(self, *, model_url: str, home: Path, project: Path, marker: str) -> dict[str, Any]:
        pointed = point_at("gemini", model_url=model_url, home=home, project=project)
        return {
            "name": "Gemini CLI",
            "command": str(self.executable),
            "args": ["--acp", *pointed.args],
            "env": self._env(marker, pointed),
            "authenticate": pointed.authenticate,
            "cwd": pointed.cwd,
        }

    def editor_tool(self, name: str, arguments: dict[str, Any]) -> Call:
        return Call(self.offered_name(name), arguments)

    def offered_name(self, name: str) -> str:
        return f"mcp_{MCP_SERVER}_{name}"

    def shell(self, command: str) -> Call:
        return shell_call(self.id, command)


class OpenCodeKit(AgentKit):
    def agent_table(self, *, model_url: str, home: Path, project: Path, marker: str) -> dict[str, Any]:
        env = self._env(marker, point_at("opencode", model_url=model_url, home=home, project=project))
        return {"name": "OpenCode", "command": str(self.executable), "args": ["acp"], "env": env}

    def editor_tool(self, name: str, arguments: dict[str, Any]) -> Call:
        return Call(self.offered_name(name), arguments)

    def offered_name(self, name: str) -> str:
        return f"{MCP_SERVER}_{name}"

    def shell(self, command: str) -> Call:
        return shell_call(self.id, command)


KITS: dict[str, AgentKit] = {
    "claude": ClaudeKit(
        "claude",
        "anthropic",
        usage_fields=("inputTokens", "outputTokens", "contextUsed", "contextSize", "cost"),
        session_option=("model", "sonnet"),
        model_entry="sonnet",
        announces_commands=True,
        slash_command=("/context", "## Context Usage", False),
        thought_level_option=True,
    ),
    # Codex offers "abort" as its reject option: the whole turn ends cancelled.
    "codex": CodexKit(
        "codex",
        "openai",
        rejected_shell_stop_reason="cancelled",
        model_told_of_rejection=False,
        usage_fields=("contextUsed", "contextSize"),
        session_option=("model", "fake-model-large"),
        model_entry="fake-model-large",
        announces_commands=True,  # a moment after its first update (a first listing may not have them yet)
    ),
    "gemini": GeminiKit(
        "gemini",
        "gemini",
        mcp_calls="one_by_one",
        usage_fields=("inputTokens", "outputTokens"),
        session_option=("mode", "plan"),  # Gemini CLI has modes and no configOptions
        model_entry="gemini-2.5-pro",  # from its unstable ``models`` (session/set_model)
        announces_commands=True,
        slash_command=("/about", "Gemini CLI Info", False),
        sets_option_with="session/set_mode",
    ),
    "opencode": OpenCodeKit(
        "opencode",
        "anthropic",
        model_told_of_rejection=False,  # a rejected command ends the turn (its continue_loop_on_deny is off)
        mcp_calls="either",
        usage_fields=("inputTokens", "outputTokens", "contextUsed", "contextSize", "cost"),
        session_option=("model", "anthropic/claude-haiku-4-5"),
        model_entry="anthropic/claude-haiku-4-5",
        announces_commands=True,
        slash_command=("/init", "Create or update `AGENTS.md`", True),
    ),
}


def model_name(value: str) -> str:
    """What the model's requests call a model the agent lists as ``value`` (OpenCode lists ``provider/model``)."""
    return value.rpartition("/")[2]


def requested_model(request: ModelRequest) -> str:
    """The model a request asks for: in its body, or (Gemini) in its path."""
    body = request.body if isinstance(request.body, dict) else {}
    return str(body.get("model") or request.path)


def write_config(path: Path, agents: dict[str, dict[str, Any]], **tables: dict[str, Any]) -> Path:
    """lmbridge's config file, as a user writes it: ``[agents.<id>]`` tables plus e.g. ``sessions={...}``."""
    path.write_text(tomli_w.dumps({"agents": agents, **tables}))
    return path
