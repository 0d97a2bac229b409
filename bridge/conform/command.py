"""``lmbridge conform``: its arguments, and the entry point (the kit is imported only when the subcommand runs).

Exit status: 0 conformant, 1 not (or blocked), 2 a usage error (the message says which argument).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bridge.config import AgentConfig

    from .checks import Settings
    from .requirements import Requirement

__all__ = ["add_conform_parser", "run_conform"]

_TIERS = ("mandatory", "capability", "advisory", "informational")


def add_conform_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "conform",
        help="check an ACP agent against the ACP spec, requirement by requirement (docs/conformance.md)",
        description="Run the ACP conformance kit against an agent spoken to directly over stdio: "
        "lmbridge conform [options] -- AGENT-COMMAND [ARGS...], or lmbridge conform AGENT-ID (a configured agent). "
        "Exit status 0 conformant, 1 not conformant or blocked, 2 usage error.",
    )
    parser.add_argument("agent", nargs=argparse.REMAINDER, metavar="-- COMMAND ... | AGENT-ID")
    parser.add_argument("--config", metavar="FILE", help="the agents file an AGENT-ID is looked up in")
    parser.add_argument(
        "--tier",
        metavar="TIERS",
        help=f"only requirements of these tiers, comma-separated: {', '.join(_TIERS)} (default: all)",
    )
    parser.add_argument(
        "-k",
        dest="select",
        action="append",
        metavar="PATTERN",
        help="only requirements whose id matches (glob or part of it: -k INIT, -k 'LMB-SESS-00?'); repeatable",
    )
    parser.add_argument("--timeout", type=float, default=30.0, metavar="S", help="seconds per request (default 30)")
    parser.add_argument(
        "--startup-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds for the initialize answer of each process (default 60)",
    )
    parser.add_argument("--auth-method", metavar="ID", help="call authenticate with this method after initialize")
    parser.add_argument(
        "--logout",
        action="store_true",
        help="also test logout (LMB-AUTH-*), when the agent advertises it: it ends the agent's login on this machine",
    )
    parser.add_argument(
        "--agent-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set in the agent's environment; with --model fake, {model_url} in VALUE is the fake model's URL",
    )
    parser.add_argument("--agent-cwd", metavar="DIR", help="the agent processes' working directory")
    parser.add_argument("--workspace", metavar="DIR", help="the sessions' cwd (default: a fresh temporary directory)")
    parser.add_argument(
        "--model",
        choices=("none", "fake", "own", "directives"),
        default="none",
        help="how the checks that need the agent's model run: none (skipped), fake (lmbridge's fake model, the "
        "agent pointed at it: docs/fake-model.md), own (the agent's own model, its login or key: costs tokens), "
        "directives (lmbridge's demo agent directives) (default none)",
    )
    parser.add_argument(
        "--acp-schema", metavar="FILE", help="also validate against this ACP JSON schema (default $LMBRIDGE_ACP_SCHEMA)"
    )
    parser.add_argument("--report-json", metavar="FILE", help="write the JSON report")
    parser.add_argument("--junit", metavar="FILE", help="write a JUnit XML report")
    parser.add_argument("--markdown", metavar="FILE", help="write a Markdown table")
    parser.add_argument("-v", "--verbose", action="store_true", help="show every requirement's detail")


class UsageError(Exception):
    pass


def run_conform(args: argparse.Namespace) -> int:
    try:
        settings, requirements = _prepare(args)
    except UsageError as exc:
        print(f"lmbridge conform: {exc}", file=sys.stderr)
        return 2
    import trio

    from .checks import conform_workspace
    from .kit import run_kit
    from .report import junit, markdown, terminal, write_json

    with conform_workspace(args.workspace) as workspace:
        settings.workspace = workspace
        result = trio.run(run_kit, settings, requirements)
    print(terminal(result, verbose=args.verbose))
    try:
        if args.report_json:
            write_json(result, args.report_json)
        if args.junit:
            with open(args.junit, "wb") as handle:
                handle.write(junit(result))
        if args.markdown:
            with open(args.markdown, "w", encoding="utf-8") as handle:
                handle.write(markdown(result))
    except OSError as exc:
        print(f"lmbridge conform: cannot write a report: {exc}", file=sys.stderr)
        return 2
    return 0 if result.verdict().conformant else 1


def _prepare(args: argparse.Namespace) -> tuple[Settings, list[Requirement]]:
    import os

    from bridge.acp.spawn import agent_environment
    from bridge.harness.validation import load_json_schema

    from .agent import AgentSpec, split_env
    from .checks import MODEL_DRIVERS, Settings
    from .kit import select
    from .requirements import Tier

    words = list(args.agent)
    if words and words[0] == "--":
        words = words[1:]
    if not words:
        raise UsageError("name the agent: lmbridge conform -- COMMAND [ARGS...], or lmbridge conform AGENT-ID")
    try:
        extra_env = split_env(args.agent_env)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if len(words) == 1 and args.agent[0] != "--" and os.path.sep not in words[0]:
        config = _configured(words[0], args.config)
        env = agent_environment(config)
        spec = AgentSpec(tuple(config.argv), {**env, **extra_env}, args.agent_cwd or config.cwd)
    else:
        spec = AgentSpec(tuple(words), {**os.environ, **extra_env}, args.agent_cwd)
    tiers = None
    if args.tier:
        names = [t.strip().lower() for t in args.tier.split(",") if t.strip()]
        unknown = [n for n in names if n not in _TIERS]
        if unknown:
            raise UsageError(f"--tier {', '.join(unknown)}: not a tier (choose from {', '.join(_TIERS)})")
        tiers = [Tier(n.upper()) for n in names]
    requirements = select(args.select, tiers)
    if not requirements:
        raise UsageError("no requirement matches --tier / -k")
    for name, value in (("--timeout", args.timeout), ("--startup-timeout", args.startup_timeout)):
        if value <= 0:
            raise UsageError(f"{name} must be positive")
    try:
        schema = load_json_schema(args.acp_schema)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--acp-schema: {exc}") from exc
    if args.workspace and not os.path.isdir(args.workspace):
        raise UsageError(f"--workspace {args.workspace}: not a directory")
    settings = Settings(
        spec=spec,
        timeout=args.timeout,
        startup_timeout=args.startup_timeout,
        auth_method=args.auth_method,
        logout=args.logout,
        model=MODEL_DRIVERS.get(args.model),
        schema=schema,
        agent_env=extra_env,
    )
    return settings, list(requirements)


def _configured(agent_id: str, path: str | None) -> AgentConfig:
    from bridge.config import DEMO_AGENT_ID, ConfigError, demo_agent, load_config

    try:
        config = load_config(path)
    except ConfigError as exc:
        raise UsageError(f"configuration error: {exc}") from exc
    agent = config.agents.get(agent_id)
    if agent is None and agent_id == DEMO_AGENT_ID:
        agent = demo_agent()
    if agent is None:
        known = ", ".join(sorted(config.agents)) or "none"
        raise UsageError(f"no agent {agent_id!r} in the config (configured: {known}); or give a command after --")
    return agent
