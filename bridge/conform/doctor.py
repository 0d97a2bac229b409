"""``lmbridge agents doctor``: one configured agent, checked in seconds — it starts, ``initialize`` is answered
(protocol version, time, MCP transports), ``session/new`` works or asks for a login — by the kit's first
requirements."""

from __future__ import annotations

from typing import Any

import trio

from bridge.acp.spawn import agent_environment
from bridge.config import AgentConfig

from .agent import AgentSpec
from .checks import Settings, conform_workspace
from .kit import run_kit, select
from .requirements import Status

__all__ = ["diagnose"]


def diagnose(agent: AgentConfig, timeout: float) -> tuple[str, bool]:
    """One line on the agent, and whether it is fine."""
    spec = AgentSpec(tuple(agent.argv), agent_environment(agent), agent.cwd)
    startup = max(timeout, agent.initialize_timeout)
    chosen = select(["LMB-INIT-001", "LMB-INIT-002", "LMB-SESS-001"], None)
    with conform_workspace(None) as workspace:
        settings = Settings(spec, timeout, startup, agent.authenticate, workspace=workspace)
        result = trio.run(run_kit, settings, chosen)
    return _diagnosis(result)


def _diagnosis(result: Any) -> tuple[str, bool]:
    outcomes = result.outcomes
    started = outcomes["LMB-INIT-001"]
    if started.status is not Status.PASS:
        return f"does not start as an ACP agent: {started.detail}", False
    info = result.initialize.get("agentInfo") or {}
    capabilities = result.initialize.get("agentCapabilities") or {}
    mcp = capabilities.get("mcpCapabilities") or {}
    transports = ", ".join(["stdio"] + [t for t in ("http", "sse") if mcp.get(t)])
    methods = [m.get("id") for m in result.initialize.get("authMethods") or () if isinstance(m, dict)]
    took = outcomes["LMB-INIT-005"].seconds if "LMB-INIT-005" in outcomes else None
    head = f"{info.get('name', '?')} {info.get('version', '')}".strip()
    head += f", protocol {result.initialize.get('protocolVersion')}"
    head += f", initialize in {took:.1f} s" if took is not None else ""
    head += f", MCP over {transports}"
    if result.blocked:
        return (
            f"{head}; needs a login: {result.blocked} (auth methods: {', '.join(map(str, methods)) or 'none'})",
            False,
        )
    session = outcomes["LMB-SESS-001"]
    if session.status is not Status.PASS:
        return f"{head}; session/new fails: {session.detail}", False
    return f"{head}; session/new works — OK", True
