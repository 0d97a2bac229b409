"""The ``lmbridge test`` and ``lmbridge replay`` subcommands: their arguments, and entry points that import the
harness only when the subcommand runs (so that every other ``lmbridge`` command starts as fast as before).
"""

from __future__ import annotations

import argparse

__all__ = ["add_replay_parser", "add_test_parser", "run"]

_CHECKS = "initialize, session-new, stop-reason, cancel, update-schema, tool-calls"


def add_test_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "test",
        help="run scenario files against an ACP agent through lmbridge (docs/harness.md)",
        description="Run scenario files (TOML) against an ACP agent through a real lmbridge stdio, check what "
        "the editor gets and what the agent sends, and report. Exit status 0 only when all pass.",
    )
    parser.add_argument(
        "scenarios", nargs="+", metavar="SCENARIO", help="scenario files (TOML), or directories of them"
    )
    who = parser.add_mutually_exclusive_group()
    who.add_argument("--agent", metavar="ID", help="a configured agent (default: the scenario's [agent], else demo)")
    who.add_argument("--agent-cmd", metavar="CMD", help='an ACP agent command line, e.g. "my-agent --acp"')
    parser.add_argument("--config", metavar="FILE", help="the agents file --agent looks in (default: lmbridge's)")
    parser.add_argument(
        "--check",
        metavar="NAMES",
        help=f"conformance checks, comma-separated: {_CHECKS}, all, none "
        "(default: the scenario's [conformance], else all)",
    )
    parser.add_argument(
        "--workspace", metavar="DIR", help="the editor's workspace folder (the sessions' cwd) for every scenario"
    )
    parser.add_argument("--junit", metavar="FILE", help="write a JUnit XML report")
    parser.add_argument("--json", metavar="FILE", help="write a JSON report")
    parser.add_argument("--record", metavar="DIR", help="write each scenario's wires as a transcript (NDJSON) in DIR")
    parser.add_argument(
        "--artifacts", metavar="DIR", help="keep each scenario's traces, config and lmbridge log in DIR"
    )
    parser.add_argument(
        "--acp-schema",
        metavar="FILE",
        help="also validate updates against this ACP JSON schema (default $LMBRIDGE_ACP_SCHEMA)",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help="log level of the lmbridge under test (its log is kept with --artifacts)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="print every turn and check")


def add_replay_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "replay",
        help="an ACP agent (stdio) that replays a recorded transcript's agent side",
        description="Speak ACP on stdin/stdout, answering as the agent of a transcript recorded with "
        "lmbridge test --record (or of --trace-dir files) did. Configure it as an agent.",
    )
    parser.add_argument(
        "transcripts", nargs="+", metavar="TRANSCRIPT", help="a transcript (NDJSON), or the trace files of one run"
    )
    parser.add_argument("--agent", metavar="ID", help="which recorded agent to play, when there are several")
    parser.add_argument(
        "--strict",
        action="store_true",
        help="answer a request that differs from the recording with an error instead of a warning",
    )
    parser.add_argument(
        "--timing",
        action="store_true",
        help="keep the recorded pauses between the agent's messages (capped at 5 s each)",
    )


def run(args: argparse.Namespace) -> int:
    if args.command == "test":
        from .runner import main

        return main(args)
    if args.command == "replay":
        from .replay import main

        return main(args)
    raise AssertionError(args.command)
