"""How each known agent is pointed at a model server on 127.0.0.1 (a fake model), run from a private HOME: the
environment to set, the arguments to add, the files it reads from its HOME, and the ``authenticate`` method it then
needs. Telemetry, update checks and housekeeping model requests (session titles, prompt suggestions) are switched
off, so that every model request is a turn of the script. docs/fake-model.md shows each recipe.

An agent without a recipe gets the usual variables (``ANTHROPIC_BASE_URL``, ``OPENAI_BASE_URL``,
``GOOGLE_GEMINI_BASE_URL``, their keys, and ``LMBRIDGE_MODEL_BASE_URL``): whatever it reads of them points at the
server; anything else is for its author to set.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from .server import Call

__all__ = ["FOREIGN_ENV", "RECIPES", "Pointed", "point_at", "read_call", "shell_call"]

# An agent reads these before its own config: a developer's real keys or endpoints must neither reach a run against
# the fake model nor send its requests elsewhere.
FOREIGN_ENV = re.compile(r"^(ANTHROPIC_|CLAUDE_|OPENAI_|CODEX_|GEMINI_|GOOGLE_|VERTEX|OPENCODE)")
DUMMY_KEY = "fake-model-key"
_LOCAL = {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}


@dataclass(frozen=True)
class Pointed:
    """What to change in an agent's start so its model requests go to the server."""

    env: dict[str, str]
    args: tuple[str, ...] = ()
    authenticate: str | None = None  # the auth method to call after initialize
    cwd: str | None = None
    model: str = ""  # the model id it asks for
    session_mode: str | None = None  # a mode to put each session in, when the agent offers it
    api: str = ""  # the API it speaks: anthropic | openai | openai-chat | gemini ("" when unknown)


def point_at(agent: str | None, *, model_url: str, home: Path, project: Path) -> Pointed:
    """The recipe for ``agent`` (a ``bridge.config.known_agent`` name, or None), writing its files under ``home``."""
    home.mkdir(parents=True, exist_ok=True)
    recipe = RECIPES.get(agent or "", _generic)
    pointed = recipe(model_url, home, project)
    return dataclasses.replace(pointed, env={"HOME": str(home), **_LOCAL, **pointed.env})


def _claude(model_url: str, home: Path, project: Path) -> Pointed:
    env = {
        "ANTHROPIC_BASE_URL": model_url,
        "ANTHROPIC_API_KEY": DUMMY_KEY,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        # It lists MCP tools by name only, behind its ToolSearch tool, which the model must call first: off, so a
        # script can call a tool directly.
        "ENABLE_TOOL_SEARCH": "false",
        # After each turn it asks the model what the user might type next.
        "CLAUDE_CODE_ENABLE_PROMPT_SUGGESTION": "false",
    }
    if os.geteuid() == 0:
        env["IS_SANDBOX"] = "1"  # as root, Claude Code refuses to start without it
    # Its sessions start in mode "auto": a model classifier (a request of its own to the model) decides permission
    # requests, which then never reach the client. "default" asks the client.
    return Pointed(env, model="claude-sonnet", api="anthropic", session_mode="default")


CODEX_MODEL = {
    "slug": "fake-model",
    "display_name": "Fake model",
    "base_instructions": "You are a coding agent.",
    "context_window": 200000,
    "supports_parallel_tool_calls": True,
    "shell_type": "shell_command",
    "supported_reasoning_levels": [],
    "supports_reasoning_summaries": False,
    "support_verbosity": False,
    "truncation_policy": {"mode": "tokens", "limit": 10000},
    "experimental_supported_tools": [],
    "visibility": "list",
    "supported_in_api": True,
    "priority": 0,
}


def _codex(model_url: str, home: Path, project: Path) -> Pointed:
    # An unknown model slug makes Codex prefix every turn with a "Model metadata ... not found" message and turn off
    # parallel tool calls; a catalog entry for the fake model avoids both. "untrusted": it asks before shell
    # commands. No sandbox: its Linux sandbox needs bubblewrap, which CI machines may lack.
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)  # Codex exits 1 when CODEX_HOME does not exist
    catalog = codex_home / "fake-models.json"
    large = {**CODEX_MODEL, "slug": "fake-model-large", "display_name": "Fake model (large)", "priority": 1}
    catalog.write_text(json.dumps({"models": [CODEX_MODEL, large]}))
    (codex_home / "config.toml").write_text(f"""\
model = "fake-model"
model_provider = "fake"
model_catalog_json = {json.dumps(str(catalog))}
approval_policy = "untrusted"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[model_providers.fake]
name = "Fake local model"
base_url = "{model_url}/v1"
wire_api = "responses"
env_key = "FAKE_API_KEY"
request_max_retries = 0
stream_max_retries = 0
""")
    env = {"CODEX_HOME": str(codex_home), "FAKE_API_KEY": DUMMY_KEY}
    return Pointed(env, model="fake-model", api="openai")


GEMINI_MODEL = "gemini-2.5-flash"  # a fixed model: the default router first calls another endpoint, retrying


def _gemini(model_url: str, home: Path, project: Path) -> Pointed:
    settings = home / ".gemini"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "settings.json").write_text(
        json.dumps(
            {
                "privacy": {"usageStatisticsEnabled": False},  # else it calls play.googleapis.com
                "telemetry": {"enabled": False},
                "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
            }
        )
    )
    # MCP servers are silently disabled in folders that are not trusted.
    trusted = settings / "trustedFolders.json"
    trusted.write_text(json.dumps({str(project): "TRUST_FOLDER"}))
    env = {
        "GEMINI_API_KEY": DUMMY_KEY,
        "GOOGLE_GEMINI_BASE_URL": model_url,
        "GEMINI_CLI_TRUSTED_FOLDERS_PATH": str(trusted),
    }
    return Pointed(
        env, ("-m", GEMINI_MODEL), authenticate="gemini-api-key", cwd=str(project), model=GEMINI_MODEL, api="gemini"
    )


OPENCODE_MODEL = "anthropic/claude-sonnet-4-5"  # its built-in Anthropic provider, pointed at the server


def _opencode(model_url: str, home: Path, project: Path) -> Pointed:
    config = home / ".config" / "opencode"
    config.mkdir(parents=True, exist_ok=True)
    (config / "opencode.json").write_text(
        json.dumps(
            {
                "$schema": "https://opencode.ai/config.json",
                "model": OPENCODE_MODEL,
                "provider": {"anthropic": {"options": {"baseURL": f"{model_url}/v1", "apiKey": DUMMY_KEY}}},
                # Its title agent asks the model for a session title at the first prompt.
                "agent": {"title": {"disable": True}},
                "permission": {"bash": "ask", "edit": "ask"},  # asks before commands and edits
                "autoupdate": False,
                "share": "disabled",
            }
        )
    )
    env = {
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",  # its model list from the copy it carries, not models.dev
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    }
    return Pointed(env, model=OPENCODE_MODEL, api="anthropic")


def _generic(model_url: str, home: Path, project: Path) -> Pointed:
    env = {
        "ANTHROPIC_BASE_URL": model_url,
        "ANTHROPIC_API_KEY": DUMMY_KEY,
        "OPENAI_BASE_URL": f"{model_url}/v1",
        "OPENAI_API_KEY": DUMMY_KEY,
        "GOOGLE_GEMINI_BASE_URL": model_url,
        "GEMINI_API_KEY": DUMMY_KEY,
        "LMBRIDGE_MODEL_BASE_URL": model_url,
        "LMBRIDGE_MODEL_TOKEN": DUMMY_KEY,
    }
    return Pointed(env)


RECIPES = {"claude": _claude, "codex": _codex, "gemini": _gemini, "opencode": _opencode}

_WHY = "Run the command the user asked for"


def shell_call(agent: str | None, command: str) -> Call:
    """A call of the agent's built-in shell tool, as its model makes it; for an agent without a recipe, the first
    offered tool with "shell" or "bash" in its name, given ``command``."""
    if agent == "claude":  # (its own Bash, or the one it offers as mcp__acp__Bash when the client has a terminal)
        return Call("Bash", {"command": command, "description": _WHY}, offered="Bash|mcp__acp__Bash")
    if agent == "codex":
        return Call("exec_command", {"cmd": command})
    if agent == "gemini":
        return Call("run_shell_command", {"command": command, "description": _WHY})
    if agent == "opencode":
        return Call("bash", {"command": command, "description": _WHY})
    return Call("", {"command": command}, offered="*[Ss]hell*|*[Bb]ash*")


def read_call(agent: str | None, path: str) -> Call:
    """A call of the agent's built-in tool that reads a file (an absolute ``path``), as its model makes it; Codex has
    none (its model reads with a shell command); for an agent without a recipe, the first offered tool whose name
    says it reads a file."""
    if agent == "claude":
        return Call("Read", {"file_path": path}, offered="Read|mcp__acp__Read")
    if agent == "codex":
        return shell_call(agent, f"cat {path}")
    if agent == "gemini":
        return Call("read_file", {"file_path": path})
    if agent == "opencode":
        return Call("read", {"filePath": path})
    return Call("", {"path": path, "file_path": path}, offered="read_file|*[Rr]ead*[Ff]ile*|Read|read")
