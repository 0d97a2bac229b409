"""Configuration: which ACP agents exist and how the bridge behaves, read from a TOML file.

Owns finding the file (``--config``, ``$LMBRIDGE_CONFIG``, ``$XDG_CONFIG_HOME/lmbridge/config.toml``), checking
every key, and turning mistakes into a ``ConfigError`` that names the file, the line and the key. Agents given by
an editor in ``initialize`` are checked by the same code (``agent_from_mapping``). The built-in ``demo`` agent is
always present.
"""

import os
import re
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

__all__ = [
    "DEFAULT_TOOL_BATCH_IDLE",
    "DEMO_AGENT_ID",
    "EDITOR_MODELS_PREFIX",
    "PERMISSION_POLICIES",
    "AgentConfig",
    "Config",
    "ConfigError",
    "EditorModelSettings",
    "LimitSettings",
    "Limits",
    "PermissionSettings",
    "ServeSettings",
    "SessionSettings",
    "ToolSettings",
    "agent_from_mapping",
    "find_config_file",
    "known_agent",
    "load_config",
    "mcp_transport",
    "tool_batch_idle",
]

DEMO_AGENT_ID = "demo"
EDITOR_MODELS_PREFIX = "editor"  # ``editor/<id>`` names a model an editor shares: no agent may be called that
PERMISSION_POLICIES = ("ask", "allow_reads", "allow_all", "deny")
MCP_TRANSPORTS = ("auto", "http", "stdio")  # auto: the faster for a known agent (below), else HTTP when advertised
# Known agents, by their command's file name or the package a launcher runs (``known_agent``).
_KNOWN_COMMANDS = {
    "claude-agent-acp": "claude",
    "claude-code-acp": "claude",
    "codex-acp": "codex",
    "gemini": "gemini",
    "opencode": "opencode",
}
_LAUNCHERS = ("npx", "bunx", "pnpm", "uvx", "pipx")
# What ``mcp_transport = "auto"`` gives a known agent when not HTTP, measured side by side (docs/agents.md, "How each
# agent gets the editor's tools"): Codex's HTTP MCP client leaves ~30 ms between its own requests of a tool call and
# ~40 ms in each session's handshake; over the stdio relay its tool turns are ~40 ms and its new conversations ~70 ms
# faster. Gemini CLI's later tool turns are ~3 ms faster over the relay (lmbridge's side of a call over a unix socket
# is lighter than the HTTP server's), its new conversations ~7 ms; its first tool turn ~6 ms slower. OpenCode's first
# tool turn is 50 – 75 ms faster over the relay (its HTTP MCP client's first call), its other turns ~10 – 25 ms.
# Claude Code's text and tool turns are ~3 – 11 ms faster over the relay (two runs of 20 pairs in the same rounds, on
# lmbridge's own HTTP server), even the text turn, which passes no MCP message: its stdio MCP client is the lighter.
_AUTO_MCP_TRANSPORT = {"claude": "stdio", "codex": "stdio", "gemini": "stdio", "opencode": "stdio"}
# How long a batch of the editor's tool calls waits for another call (docs/tools.md, "Ending a batch"). Only agents that
# do not tell of the model's calls before making them rely on it. Codex reports each as it makes it, and makes it as
# the model's stream has it: with a model that streams its calls (the OpenAI and Anthropic APIs) they come tens of
# milliseconds or more apart, so no idle time joins them, and any wait only delays every tool turn (5 ms made its
# later tool turn +4.9 ms over direct instead of +0.5, 30 paired runs each). Codex therefore does not wait; a model
# that sends a response's calls at once has them joined with tool_batch_idle = 0.005 (over the stdio relay they came
# at most 3.9 ms apart on an idle machine, 8.6 ms beside two busy loops). OpenCode makes its call, then reports it 8 -
# 14 ms later: every tool turn of its waited the whole 15 ms (traced); without the wait its tool turns are at the floor
# (10 paired runs over the relay: lmbridge's own time on the later tool turn 2.5 ms instead of 9.2).
DEFAULT_TOOL_BATCH_IDLE = 0.015
_AUTO_TOOL_BATCH_IDLE = {"codex": 0.0, "opencode": 0.0}
# One process per agent, shared by its sessions; one per agent and key (a shared daemon: keys do not queue behind
# each other in one process); or one per session.
ISOLATIONS = ("agent", "key", "session")
# How an agent on the editor's models is pointed at lmbridge: by its command ("auto"), a known agent's recipe, or
# only the generic LMBRIDGE_MODEL_* variables ("env").
MODEL_RECIPES = ("auto", "claude", "codex", "opencode", "env")
_AGENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_NO_ENV: Mapping[str, str] = MappingProxyType({})
_NO_LIMITS: Mapping[str, Any] = MappingProxyType({})

# The records below are NamedTuples, not dataclasses: `lmbridge stdio` reads this file before it starts the agent of
# an editor's first chat, and importing dataclasses (which imports inspect, ast, dis...) and building six of them
# costs ten times as much. They are as immutable; `_replace` and `_fields` stand for dataclasses'. For the same reason
# the module does without `from __future__ import annotations`: NamedTuple compiles each field's annotation given as a
# string.


class ConfigError(Exception):
    """A configuration mistake. The message names the file, the line (when known) and the key."""

    def __init__(self, message: str, *, path: Path | None = None, line: int | None = None, key: str | None = None):
        where = []
        if path is not None:
            where.append(str(path) + (f":{line}" if line else ""))
        if key:
            where.append(f"key {key!r}")
        super().__init__(f"{', '.join(where)}: {message}" if where else message)
        self.path = path
        self.line = line
        self.key = key


class AgentConfig(NamedTuple):
    id: str
    name: str
    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = _NO_ENV
    unset_env: tuple[str, ...] = ()  # names (or fnmatch patterns) of lmbridge's variables the agent must not get
    cwd: str | None = None
    authenticate: str | None = None
    permission_policy: str | None = None  # None: the bridge-wide policy
    mcp_transport: str = "auto"
    isolation: str = "agent"
    max_input_tokens: int = 200_000
    max_output_tokens: int = 32_000
    image_input: bool = False
    initialize_timeout: float = 60.0
    tool_batch_idle: float | None = None  # None: [sessions] tool_batch_idle, else the known agent's (tool_batch_idle())
    prestart: bool = False  # start (and initialize) the agent as soon as an editor connects, not at its first chat
    # The agent's session options lmbridge chooses for every session (model, mode, effort: its ACP configOptions);
    # a client's options.modelOptions win over them.
    options: tuple[tuple[str, Any], ...] = ()
    # Where the agent's own model requests go: "" its own provider; "editor" or "editor:<model id>" a model the
    # conversation's editor shares, through lmbridge (docs/editor-models.md#agents-on-the-editors-models).
    model_source: str = ""
    # How the agent is pointed at lmbridge for that ("auto": known by its command; docs/agents.md).
    model_recipe: str = "auto"

    @property
    def argv(self) -> list[str]:
        return [self.command, *self.args]


class SessionSettings(NamedTuple):
    idle_ttl: float = 1800.0  # seconds an idle session is kept
    max_sessions: int = 64  # across all agents; the least recently used idle session is closed past it
    agent_idle_ttl: float = 600.0  # seconds an agent process with no sessions is kept running
    tool_batch_window: float = 0.05  # at most this long (seconds) to gather parallel tool calls into one response
    # ...or once no further call came for this long (unless all announced calls came); None: a known agent's measured
    # time, else DEFAULT_TOOL_BATCH_IDLE. An agent's own tool_batch_idle wins.
    tool_batch_idle: float | None = None
    cancel_drain_timeout: float = 10.0  # seconds to wait for an agent to acknowledge session/cancel
    detached_grace: float = 60.0  # seconds a turn whose editor went away runs on, waiting for the editor's retry
    agent_request_timeout: float = 60.0  # seconds for an agent to open or reopen a session; then it is restarted
    stop_grace: float = 3.0  # seconds between SIGTERM and SIGKILL when stopping an agent
    state_file: str | None = None  # conversation fingerprint → ACP session id, for session/load after restart


class PermissionSettings(NamedTuple):
    policy: str = "ask"
    tool_name: str = "acp_agent_action"


class ToolSettings(NamedTuple):
    """``[tools]``: how the client's tools are offered to agents."""

    # Mark the client's tools readOnlyHint (unless the client says a tool is destructive), so that agents run calls
    # the model made together concurrently and the client gets them in one response (mcp_synthetic.server).
    parallel: bool = True
    # Offer the agent a tool that asks one of the models the conversation's editor shares (docs/editor-models.md).
    editor_models: bool = True
    editor_model_tool: str = "editor_model"  # that tool's name
    editor_model_default: str = ""  # the model the tool asks when the agent names none ("": the first shared)


class EditorModelSettings(NamedTuple):
    """``[editor_models]``: limits on calls to the models editors share (the tool, and ``editor/<id>`` over HTTP)."""

    max_concurrent: int = 4  # calls at once per editor; over HTTP, more get 429 with retry-after
    timeout: float = 300.0  # seconds an editor model may take for one answer; then the call fails saying so


class ServeSettings(NamedTuple):
    """``[serve]``: what ``lmbridge serve`` does without command-line options (for a daemon started by systemd)."""

    http: str | None = None  # HOST:PORT of the OpenAI/Anthropic-compatible HTTP API, as --http
    allowed_origins: tuple[str, ...] = ()  # browser origins allowed to connect (WebSocket and HTTP), as --allow-origin
    max_turns: int = 32  # turns the HTTP API runs at once; a request over it gets 429
    # The agent's activity over HTTP: "native" (reasoning/thinking where the API has it) or "text".
    activity: str = "native"
    # Seconds a stopping daemon (SIGTERM) lets running turns finish, opening no new conversation, /healthz 503;
    # 0: running turns are cancelled at once.
    drain_grace: float = 0.0
    # /metrics without a key for clients on loopback (a Prometheus on the same host); else a key with ``metrics``.
    open_metrics: bool = False


HTTP_ACTIVITY = ("native", "text")


class LimitSettings(NamedTuple):
    """What one key may use (0: no limit): turns running at once, requests a minute (a token bucket: a burst of that
    many, refilled evenly), and tokens a UTC day (as the agents report them, else estimated)."""

    concurrent_turns: int = 0
    requests_per_minute: int = 0
    daily_tokens: int = 0


class Limits(NamedTuple):
    """``[limits]``: the defaults for every key, and ``[limits.keys.NAME]``: a key's own (keys not named there get the
    defaults; a key's table replaces the defaults it names, and keeps the others)."""

    default: LimitSettings = LimitSettings()
    keys: Mapping[str, LimitSettings] = _NO_LIMITS

    def of(self, name: str) -> LimitSettings:
        return self.keys.get(name, self.default)


class Config(NamedTuple):
    agents: Mapping[str, AgentConfig]
    sessions: SessionSettings = SessionSettings()
    permissions: PermissionSettings = PermissionSettings()
    serve: ServeSettings = ServeSettings()
    tools: ToolSettings = ToolSettings()
    editor_models: EditorModelSettings = EditorModelSettings()
    limits: Limits = Limits()
    path: Path | None = None


def demo_agent() -> AgentConfig:
    return AgentConfig(
        id=DEMO_AGENT_ID,
        name="lmbridge demo agent",
        command=sys.executable,
        args=("-m", "bridge.demo"),
        image_input=True,
        initialize_timeout=30.0,
    )


def find_config_file(
    explicit: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None
) -> Path | None:
    """The config file to read: the explicit path (must exist), else ``$LMBRIDGE_CONFIG`` (must exist), else
    ``$XDG_CONFIG_HOME/lmbridge/config.toml`` (or ``~/.config/...``) when it exists, else None."""
    environ = os.environ if environ is None else environ
    for source, value in (("--config", explicit), ("$LMBRIDGE_CONFIG", environ.get("LMBRIDGE_CONFIG"))):
        if value:
            path = Path(value).expanduser()
            if not path.is_file():
                raise ConfigError(f"config file given by {source} does not exist", path=path)
            return path
    base = environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    candidate = Path(base) / "lmbridge" / "config.toml"
    return candidate if candidate.is_file() else None


def load_config(explicit: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None) -> Config:
    path = find_config_file(explicit, environ)
    if path is None:
        return Config(agents={DEMO_AGENT_ID: demo_agent()})
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file: {exc}", path=path) from exc
    return parse_config(text, path)


def parse_config(text: str, path: Path | None = None) -> Config:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line = _line_from_toml_error(str(exc)) or (len(text.splitlines()) if "end of document" in str(exc) else None)
        raise ConfigError(f"invalid TOML: {exc}", path=path, line=line) from exc
    locate = _Locator(text, path)
    known = {"agents", "sessions", "permissions", "serve", "tools", "editor_models", "limits"}
    _check_keys(data, known, locate, table="")

    agents: dict[str, AgentConfig] = {DEMO_AGENT_ID: demo_agent()}
    raw_agents = data.get("agents", {})
    if not isinstance(raw_agents, dict):
        raise locate.error("must be a table of agents, e.g. [agents.myagent]", "agents")
    for agent_id, raw in raw_agents.items():
        if agent_id == DEMO_AGENT_ID:
            raise locate.error("'demo' is the built-in demo agent; choose another id", f"agents.{agent_id}")
        if agent_id == EDITOR_MODELS_PREFIX:
            raise locate.error(
                "'editor' names the models editors share (editor/<id>); choose another id", "agents.editor"
            )
        agents[agent_id] = _agent(agent_id, raw, locate)

    sessions = _settings(SessionSettings, data.get("sessions", {}), locate, "sessions")
    permissions = _settings(PermissionSettings, data.get("permissions", {}), locate, "permissions")
    if permissions.policy not in PERMISSION_POLICIES:
        raise locate.error(f"must be one of {', '.join(PERMISSION_POLICIES)}", "permissions.policy")
    serve = _settings(ServeSettings, data.get("serve", {}), locate, "serve")
    if serve.activity not in HTTP_ACTIVITY:
        raise locate.error(f"must be one of {', '.join(HTTP_ACTIVITY)}", "serve.activity")
    tools = _settings(ToolSettings, data.get("tools", {}), locate, "tools")
    editor_models = _settings(EditorModelSettings, data.get("editor_models", {}), locate, "editor_models")
    limits = _limits(data.get("limits", {}), locate)
    return Config(
        agents=agents,
        sessions=sessions,
        permissions=permissions,
        serve=serve,
        tools=tools,
        editor_models=editor_models,
        limits=limits,
        path=path,
    )


def _limits(raw: Any, locate: "_Locator") -> Limits:
    if not isinstance(raw, dict):
        raise locate.error("must be a table", "limits")
    own = raw.get("keys", {})
    if not isinstance(own, dict):
        raise locate.error("must be a table of keys' limits, e.g. [limits.keys.alice]", "limits.keys")
    defaults = {key: value for key, value in raw.items() if key != "keys"}
    default = _settings(LimitSettings, defaults, locate, "limits", zero=True)
    keys = {}
    for name, table in own.items():
        where = f"limits.keys.{name}"
        if not isinstance(table, dict):
            raise locate.error("must be a table", where)
        given = _settings(LimitSettings, table, locate, where, zero=True)
        keys[name] = default._replace(**{key: getattr(given, key) for key in table})
    return Limits(default, MappingProxyType(keys))


def known_agent(config: AgentConfig) -> str | None:
    """Which known agent ``config`` starts ("claude", "codex", "gemini", "opencode"), by its command's file name or
    the package a launcher such as ``npx`` runs; ``None`` for any other."""
    program = os.path.basename(config.command)
    if program in _LAUNCHERS:
        program = next((arg for arg in config.args if not arg.startswith("-") and arg not in ("dlx", "x")), "")
        program = program.rsplit("/", 1)[-1].split("@", 1)[0]  # @scope/name@version → name
    return next((agent for known, agent in _KNOWN_COMMANDS.items() if program.startswith(known)), None)


def mcp_transport(config: AgentConfig) -> str:
    """How the editor's tools reach the agent: its ``mcp_transport``, and for ``auto`` the transport measured to be
    faster for a known agent ("stdio"), else "auto" (HTTP when the agent advertises it, else the stdio relay)."""
    if config.mcp_transport != "auto":
        return config.mcp_transport
    return _AUTO_MCP_TRANSPORT.get(known_agent(config) or "", "auto")


def tool_batch_idle(agent: AgentConfig | None, sessions: SessionSettings) -> float:
    """How long a batch of ``agent``'s calls of the editor's tools waits for another call: the agent's own
    ``tool_batch_idle``, else the one in ``[sessions]``, else the time measured for a known agent (Codex), else
    ``DEFAULT_TOOL_BATCH_IDLE``."""
    if agent is not None and agent.tool_batch_idle is not None:
        return agent.tool_batch_idle
    if sessions.tool_batch_idle is not None:
        return sessions.tool_batch_idle
    known = known_agent(agent) if agent is not None else None
    return _AUTO_TOOL_BATCH_IDLE.get(known or "", DEFAULT_TOOL_BATCH_IDLE)


def agent_from_mapping(agent_id: str, raw: Any, *, where: str = "agents") -> AgentConfig:
    """Check one agent definition given as a mapping (from TOML or from an editor's ``initialize``)."""
    return _agent(agent_id, raw, _Locator(None, None), prefix=where)


_AGENT_KEYS: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "command": str,
    "args": list,
    "env": dict,
    "unset_env": list,
    "cwd": str,
    "authenticate": str,
    "permission_policy": str,
    "mcp_transport": str,
    "isolation": str,
    "max_input_tokens": int,
    "max_output_tokens": int,
    "image_input": bool,
    "initialize_timeout": (int, float),
    "tool_batch_idle": (int, float),
    "prestart": bool,
    "options": dict,
    "model_source": str,
    "model_recipe": str,
}
# Upper bounds: anything larger is a mistake, and floats and timers cannot hold what JSON can write.
MAX_SECONDS = 7 * 24 * 3600
_AGENT_NUMBER_LIMITS = {
    "max_input_tokens": 10**9,
    "max_output_tokens": 10**9,
    "initialize_timeout": MAX_SECONDS,
    "tool_batch_idle": MAX_SECONDS,
}
# Editors send JSON, where camelCase is the norm; accept both spellings there.
_CAMEL = {
    "unsetEnv": "unset_env",
    "permissionPolicy": "permission_policy",
    "mcpTransport": "mcp_transport",
    "maxInputTokens": "max_input_tokens",
    "maxOutputTokens": "max_output_tokens",
    "imageInput": "image_input",
    "initializeTimeout": "initialize_timeout",
    "toolBatchIdle": "tool_batch_idle",
    "modelSource": "model_source",
    "modelRecipe": "model_recipe",
}


def _agent(agent_id: str, raw: Any, locate: "_Locator", prefix: str = "agents") -> AgentConfig:
    table = f"{prefix}.{agent_id}"
    if not _AGENT_ID.match(agent_id):
        raise locate.error(
            "agent ids are 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit", table
        )
    if not isinstance(raw, dict):
        raise locate.error("must be a table with at least 'command'", table)
    values: dict[str, Any] = {}
    for key, value in raw.items():
        name = _CAMEL.get(str(key), str(key))
        expected = _AGENT_KEYS.get(name)
        if expected is None:
            raise locate.error(f"unknown key (known keys: {', '.join(sorted(_AGENT_KEYS))})", f"{table}.{key}")
        numeric = expected is int or expected == (int, float)
        if not isinstance(value, expected) or (numeric and isinstance(value, bool)):
            raise locate.error(f"must be {_type_name(expected)}, got {_type_name(type(value))}", f"{table}.{key}")
        values[name] = value
    if not values.get("command"):
        raise locate.error("is required: the program that speaks ACP on stdio", f"{table}.command")
    args = values.get("args", [])
    if not all(isinstance(a, str) for a in args):
        raise locate.error("must be a list of strings", f"{table}.args")
    env = values.get("env", {})
    if not all(isinstance(v, str) for v in env.values()):
        raise locate.error("values must be strings", f"{table}.env")
    unset_env = values.get("unset_env", [])
    if not all(isinstance(v, str) and v for v in unset_env):
        raise locate.error('must be a list of variable names or patterns such as "OPENAI_*"', f"{table}.unset_env")
    if values.get("permission_policy") not in (None, *PERMISSION_POLICIES):
        raise locate.error(f"must be one of {', '.join(PERMISSION_POLICIES)}", f"{table}.permission_policy")
    if values.get("isolation", "agent") not in ISOLATIONS:
        raise locate.error(f"must be one of {', '.join(ISOLATIONS)}", f"{table}.isolation")
    if values.get("mcp_transport", "auto") not in MCP_TRANSPORTS:
        raise locate.error(f"must be one of {', '.join(MCP_TRANSPORTS)}", f"{table}.mcp_transport")
    source = values.get("model_source", "")
    if source and source != "editor" and not (source.startswith("editor:") and len(source) > len("editor:")):
        raise locate.error(
            'must be "editor" (a model the editor shares) or "editor:<model id>"; leave it out for the agent\'s own',
            f"{table}.model_source",
        )
    if values.get("model_recipe", "auto") not in MODEL_RECIPES:
        raise locate.error(f"must be one of {', '.join(MODEL_RECIPES)}", f"{table}.model_recipe")
    options = values.get("options", {})
    for key, value in options.items():
        if not isinstance(value, str | bool) or not 0 < len(key) <= 128:
            raise locate.error(
                'must map option ids to strings or booleans, e.g. { model = "sonnet", mode = "plan" }',
                f"{table}.options.{key}",
            )
    cwd = values.get("cwd")
    if cwd is not None:
        cwd = os.path.expanduser(cwd)
        if not os.path.isabs(cwd):
            raise locate.error("must be an absolute path", f"{table}.cwd")
    for key, limit in _AGENT_NUMBER_LIMITS.items():
        # Compared before any conversion: a 4,300-digit integer or inf must be an error here, not an overflow later.
        if key in _ZERO_SECONDS:
            if key in values and not 0 <= values[key] <= limit:
                raise locate.error(f"must be a number from 0 up to {limit:,}", f"{table}.{key}")
        elif key in values and not 0 < values[key] <= limit:
            raise locate.error(f"must be positive and at most {limit:,}", f"{table}.{key}")
    values.update(
        id=agent_id,
        name=values.get("name", agent_id),
        command=os.path.expanduser(values["command"]),
        args=tuple(args),
        env=dict(env),
        unset_env=tuple(unset_env),
        cwd=cwd,
        options=tuple(options.items()),
    )
    for key in ("initialize_timeout", "tool_batch_idle"):
        if key in values:
            values[key] = float(values[key])
    return AgentConfig(**values)


_SECONDS_OR_NONE = {"tool_batch_idle"}  # settings whose default (None) is decided elsewhere; given, they are seconds
_ZERO_SECONDS = {"tool_batch_idle"}  # seconds where 0 means "do not wait"


def _settings(cls: Any, raw: Any, locate: "_Locator", table: str, *, zero: bool = False) -> Any:
    """``zero``: an integer may be 0 (for limits, where 0 is none)."""
    if not isinstance(raw, dict):
        raise locate.error("must be a table", table)
    defaults = cls()
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in cls._fields:  # not hasattr: a tuple has count and index
            known = ", ".join(cls._fields)
            raise locate.error(f"unknown key (known keys: {known})", f"{table}.{key}")
        default = getattr(defaults, key)
        if default is None and key in _SECONDS_OR_NONE:
            default = 0.0  # checked as seconds below
        if isinstance(default, bool):
            ok = isinstance(value, bool)
            expected = "true or false"
        elif isinstance(default, float):
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if key in _ZERO_SECONDS:
                ok = number and 0 <= value <= MAX_SECONDS
                expected = f"a number from 0 up to {MAX_SECONDS:,}"
            else:
                ok = number and 0 < value <= MAX_SECONDS
                expected = f"a positive number up to {MAX_SECONDS:,}"
            value = float(value) if ok else value
        elif isinstance(default, int):
            ok = isinstance(value, int) and not isinstance(value, bool) and (value >= 0 if zero else value > 0)
            expected = "an integer, 0 or more" if zero else "a positive integer"
        elif isinstance(default, tuple):
            ok = isinstance(value, list) and all(isinstance(item, str) for item in value)
            expected = "a list of strings"
            value = tuple(value) if ok else value
        else:
            ok = isinstance(value, str)
            expected = "a string"
        if not ok:
            raise locate.error(f"must be {expected}", f"{table}.{key}")
        values[key] = value
    return cls(**values)


def _check_keys(data: dict[str, Any], known: set[str], locate: "_Locator", table: str) -> None:
    for key in data:
        if key not in known:
            raise locate.error(f"unknown table or key (known: {', '.join(sorted(known))})", key)


def _type_name(kind: Any) -> str:
    names = {
        str: "a string",
        list: "a list",
        dict: "a table",
        int: "an integer",
        bool: "true or false",
        float: "a number",
    }
    if isinstance(kind, tuple):
        return "a number"
    return names.get(kind, str(getattr(kind, "__name__", kind)))


def _line_from_toml_error(message: str) -> int | None:
    match = re.search(r"at line (\d+)", message)
    return int(match.group(1)) if match else None


class _Locator:
    """Finds the line of a dotted key in the TOML text, so errors can point at it. Best effort: it understands
    ``[a.b]`` headers and ``key = value`` lines, which is how config files are written."""

    def __init__(self, text: str | None, path: Path | None) -> None:
        self._lines = text.splitlines() if text is not None else []
        self._path = path

    def error(self, message: str, dotted_key: str) -> ConfigError:
        return ConfigError(message, path=self._path, line=self.line_of(dotted_key), key=dotted_key)

    def line_of(self, dotted_key: str) -> int | None:
        parts = dotted_key.split(".")
        lines = self._lines
        # A header naming the key itself, or a table inside it: [agents.a] for "agents.a" or "agents".
        for number, line in enumerate(lines, start=1):
            header = _header_parts(line)
            if header is not None and header[: len(parts)] == parts:
                return number
        # "key = value" inside the longest table that prefixes the key; the table's header if the key is absent.
        for cut in range(len(parts) - 1, 0, -1):
            for number, line in enumerate(lines, start=1):
                if _header_parts(line) == parts[:cut]:
                    return self._key_after(number, parts[cut]) or number
        return self._key_after(0, parts[0])

    def _key_after(self, header_line: int, key: str) -> int | None:
        """The line of ``key = ...`` in the table whose header is on ``header_line`` (0: the top level)."""
        pattern = re.compile(rf"^\s*(\"{re.escape(key)}\"|{re.escape(key)})\s*=")
        for index in range(header_line, len(self._lines)):
            line = self._lines[index]
            if line.lstrip().startswith("["):
                return None
            if pattern.match(line):
                return index + 1
        return None


def _header_parts(line: str) -> list[str] | None:
    stripped = line.strip()
    if not stripped.startswith("[") or stripped.startswith("[["):
        return None
    end = stripped.find("]")
    if end < 0:
        return None
    return [part.strip().strip('"') for part in stripped[1:end].split(".")]
