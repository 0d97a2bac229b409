"""Starting an agent's process, without Trio: what ``lmbridge stdio`` uses to start the agent of an editor's first
chat while the rest of lmbridge (Trio, the session layer: about 90 ms) is still being imported.

Owns the agent's environment (lmbridge's minus ``unset_env``, plus ``env``), the spawn itself (its own process
group, three pipes), and ``EarlyAgent``: a process started that way, sent its ``initialize`` at once (the agent
starts up while lmbridge does; the pool's handshake awaits the answer), until the agent pool adopts it — or, when
lmbridge gives up before that, stops it. ``bridge.acp.process`` starts agents the usual way (under Trio) with the
same environment, and runs an adopted process.
"""

from __future__ import annotations

import fnmatch
import json
import os
import signal
import subprocess
from collections.abc import Mapping
from typing import Any

from bridge.config import AgentConfig
from wire.observe.redact import add_secrets_from_env

from .hello import initialize_params

__all__ = [
    "EarlyAgent",
    "agent_environment",
    "first_chat_agent",
    "kill_spawned",
    "spawn_agent",
    "spawn_options",
    "start_early",
]

# The id of the ``initialize`` an early agent is sent as it starts: the pool's connection numbers its own from 1.
EARLY_INITIALIZE_ID = 0
# A first request larger than this is not read before the rest of lmbridge is imported: parsing it twice would
# cost more than the early start saves.
_MAX_EARLY_LINE = 1024 * 1024


def agent_environment(config: AgentConfig) -> dict[str, str]:
    """lmbridge's environment minus the agent's ``unset_env`` patterns, plus its ``env``."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not any(fnmatch.fnmatchcase(name, pattern) for pattern in config.unset_env)
    }
    env.update(config.env)
    return env


def spawn_options(config: AgentConfig) -> dict[str, Any]:
    """How an agent's process is started, by ``spawn_agent`` or under Trio: in a process group of its own, with
    pipes for stdin, stdout and stderr, in its environment (whose secrets are registered for masking: the agent
    may print them) and working directory."""
    environment = agent_environment(config)
    add_secrets_from_env(environment)
    return {
        "stdin": subprocess.PIPE,
        "stdout": subprocess.PIPE,
        "stderr": subprocess.PIPE,
        "start_new_session": True,
        "env": environment,
        "cwd": config.cwd,
    }


def spawn_agent(config: AgentConfig) -> subprocess.Popen[bytes]:
    """Start the agent without Trio (``spawn_options``). ``OSError`` (among them ``FileNotFoundError``) when it
    cannot be run."""
    return subprocess.Popen(config.argv, **spawn_options(config))


class EarlyAgent:
    """An agent process started before the pool existed; ``adopted`` once the pool runs it. ``initialize_line``:
    the ``initialize`` it was sent (``send_initialize``), None if it was not. (A plain class: this module is
    imported before the agent starts, and dataclasses would cost ~6 ms of that wait.)"""

    __slots__ = ("adopted", "config", "initialize_line", "process")

    def __init__(self, config: AgentConfig, process: subprocess.Popen[bytes]) -> None:
        self.config = config
        self.process = process
        self.adopted = False
        self.initialize_line: bytes | None = None

    @property
    def initialize_id(self) -> int | None:
        """The id of the ``initialize`` it was sent, whose answer the pool's handshake awaits."""
        return EARLY_INITIALIZE_ID if self.initialize_line is not None else None

    def send_initialize(self) -> None:
        """Write the agent's ``initialize`` now, so that it is answered while lmbridge imports the rest of itself.
        An agent that already exited is left to the pool's handshake, which reports it."""
        message = {"jsonrpc": "2.0", "id": EARLY_INITIALIZE_ID, "method": "initialize", "params": initialize_params()}
        line = json.dumps(message, separators=(",", ":")).encode() + b"\n"
        assert self.process.stdin is not None
        try:
            # On the pipe itself, not through the file object: a write that fails (the agent is gone: EPIPE) must
            # leave nothing buffered for the pool to flush, and fail, when it takes the pipe over. Shorter than
            # PIPE_BUF, so the pipe takes it whole or not at all.
            written = os.write(self.process.stdin.fileno(), line)
        except OSError:
            return
        if written == len(line):
            self.initialize_line = line

    def abandon(self) -> None:
        """lmbridge stops without having adopted the process: stop it."""
        if not self.adopted:
            self.adopted = True  # once
            kill_spawned(self.process)


def kill_spawned(process: subprocess.Popen[bytes]) -> None:
    """Kill the process group of a process ``spawn_agent`` started and never ran, and reap it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()
    for pipe in (process.stdin, process.stdout, process.stderr):
        if pipe is not None:
            pipe.close()


def first_chat_agent(line: bytes, agents: Mapping[str, AgentConfig]) -> AgentConfig | None:
    """The agent an ``lm/chat`` request names (its ``modelId``: ``agent`` or ``agent/model``), if ``line`` is one
    and the agent runs in a shared process on its own model; None for anything else (the protocol engine will read
    it properly; an agent on the editor's models needs lmbridge's model address before it starts)."""
    if len(line) > _MAX_EARLY_LINE:
        return None
    try:
        message: Any = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(message, dict) or message.get("method") != "lm/chat":
        return None
    params = message.get("params")
    model_id = params.get("modelId") if isinstance(params, dict) else None
    if not isinstance(model_id, str):
        return None
    config = agents.get(model_id) or agents.get(model_id.partition("/")[0])
    if config is None or config.isolation != "agent" or config.model_source:
        return None
    return config


def start_early(agents: Mapping[str, AgentConfig], pending: bytes) -> EarlyAgent | None:
    """Start the agent of the editor's first chat if that request is already in ``pending`` (an editor woken by a
    chat sends it with ``initialize``). Any problem — no such request, an unknown model, a command that cannot
    run — starts nothing: the normal path then starts the agent and reports the error as it always does."""
    line, newline, _rest = pending.partition(b"\n")
    if not newline:
        return None
    config = first_chat_agent(line, agents)
    if config is None:
        return None
    try:
        early = EarlyAgent(config, spawn_agent(config))
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    early.send_initialize()
    return early
