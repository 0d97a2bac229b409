"""``lmbridge agents``: the ACP registry's agents (``list``, ``update``), adding one to the config file (``add``),
and a quick check of configured agents (``doctor``: start, initialize, authentication, session/new, MCP transports;
a few seconds each, the conformance kit's first requirements).

Exit status: 0 done (``doctor``: every agent fine), 1 ``doctor`` found a problem or ``update`` could not fetch, 2 a
usage or configuration error.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["add_agents_parser", "run_agents"]


def add_agents_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "agents",
        help="the ACP registry's agents: list, add one to the config, update the list, doctor configured ones",
        description="The ACP registry's agents, and the ones in your config file (docs/agents.md#from-the-registry).",
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="the registry's agents, and how each is started here")
    listing.add_argument("--json", action="store_true", help="as JSON")
    add = actions.add_parser("add", help="write an [agents.<id>] table for a registry agent into the config file")
    add.add_argument("id", help="the agent's id in `lmbridge agents list`")
    add.add_argument("--as", dest="name", metavar="ID", help="the table's id (default: the registry's)")
    add.add_argument("--config", metavar="FILE", help="the config file (default: the one lmbridge reads, or creates)")
    update = actions.add_parser("update", help="fetch the registry's current list (needs the network)")
    update.add_argument("--url", help="where from (default: the registry's CDN)")
    doctor = actions.add_parser("doctor", help="start each configured agent and check the basics, in seconds")
    doctor.add_argument("ids", nargs="*", metavar="ID", help="configured agents (default: all)")
    doctor.add_argument("--config", metavar="FILE", help="the config file (default: the one lmbridge reads)")
    doctor.add_argument("--timeout", type=float, default=30.0, metavar="S", help="seconds per answer (default 30)")


def run_agents(args: argparse.Namespace) -> int:
    from bridge.conform.registry import RegistryError

    try:
        if args.action == "list":
            return _list(args)
        if args.action == "add":
            return _add(args)
        if args.action == "update":
            return _update(args)
        return _doctor(args)
    except RegistryError as exc:
        print(f"lmbridge agents: {exc}", file=sys.stderr)
        return 1
    except _Usage as exc:
        print(f"lmbridge agents: {exc}", file=sys.stderr)
        return 2


class _Usage(Exception):
    pass


def _list(args: argparse.Namespace) -> int:
    import json

    from bridge.conform.registry import NotInstallable, load_registry

    agents, source = load_registry()
    rows = []
    for agent in agents:
        try:
            command, arguments = agent.launch()
            how = " ".join([command, *arguments])
        except NotInstallable:
            how = {"binary": "(a binary: download it)", "unknown": "(no package known)"}.get(agent.kind, "")
        missing = agent.installable_here() if agent.kind in ("npx", "uvx") else None
        rows.append({"id": agent.id, "name": agent.name, "start": how, "here": missing or "yes", "note": agent.note})
    if args.json:
        print(json.dumps({"source": source, "agents": rows}, indent=1))
        return 0
    width = max(len(row["id"]) for row in rows)
    print(f"{len(rows)} agents ({source}); `lmbridge agents add ID` configures one")
    for row in rows:
        here = "" if row["here"] == "yes" else f"  [{row['here']}]"
        print(f"  {row['id']:<{width}}  {row['name']}: {row['start']}{here}")
    return 0


def _add(args: argparse.Namespace) -> int:
    import os
    from pathlib import Path

    from bridge.config import ConfigError, find_config_file, parse_config
    from bridge.conform.registry import NotInstallable, load_registry

    agents, _ = load_registry()
    agent = next((a for a in agents if a.id == args.id), None)
    if agent is None:
        raise _Usage(f"no agent {args.id!r} in the registry (see `lmbridge agents list`)")
    try:
        command, arguments = agent.launch()
    except NotInstallable as exc:
        raise _Usage(str(exc)) from exc
    name = args.name or agent.id
    try:
        path = find_config_file(args.config) if args.config is None else Path(args.config)
    except ConfigError as exc:
        raise _Usage(f"configuration error: {exc}") from exc
    if path is None:
        base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
        path = Path(base) / "lmbridge" / "config.toml"
    existing = path.read_text(encoding="utf-8") if path.exists() else ""
    table = _table(name, agent.name, command, arguments, agent.note)
    text = existing + ("\n" if existing and not existing.endswith("\n\n") else "") + table
    try:
        config = parse_config(existing, path) if existing else None
        if config is not None and name in config.agents:
            raise _Usage(f"{path} already has [agents.{name}]: remove it, or add this one --as another id")
        parse_config(text, path)
    except ConfigError as exc:
        raise _Usage(f"configuration error: {exc}") from exc
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    print(f"added [agents.{name}] to {path}: {command} {' '.join(arguments)}")
    if agent.installable_here():
        print(f"note: {agent.installable_here()}; the agent cannot start until it is", file=sys.stderr)
    return 0


def _table(name: str, title: str, command: str, arguments: list[str], note: str) -> str:
    from json import dumps

    lines = [f"[agents.{_key(name)}]"]
    if note:
        lines.insert(0, f"# {title}: {note}")
    lines += [f"name = {dumps(title)}", f"command = {dumps(command)}"]
    lines.append(f"args = [{', '.join(dumps(a) for a in arguments)}]")
    return "\n".join(lines) + "\n"


def _key(name: str) -> str:
    from json import dumps

    return name if name.replace("-", "").replace("_", "").isalnum() else dumps(name)


def _update(args: argparse.Namespace) -> int:
    from bridge.conform.registry import REGISTRY_URL, cache_path, fetch_registry

    count = fetch_registry(args.url or REGISTRY_URL)
    print(f"{count} agents fetched into {cache_path()}")
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from bridge.config import ConfigError, load_config
    from bridge.conform.doctor import diagnose

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        raise _Usage(f"configuration error: {exc}") from exc
    unknown = [i for i in args.ids if i not in config.agents]
    if unknown:
        raise _Usage(f"not configured: {', '.join(unknown)} (configured: {', '.join(sorted(config.agents))})")
    problems = 0
    for agent_id in args.ids or sorted(config.agents):
        line, fine = diagnose(config.agents[agent_id], args.timeout)
        problems += not fine
        print(f"{agent_id}: {line}")
    return 0 if problems == 0 else 1
