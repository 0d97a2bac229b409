"""The ``lmbridge`` command line.

Owns argument parsing and turning configuration mistakes into one clear line on stderr (exit status 2). Each
subcommand's work lives in its own module, imported only when that subcommand runs, so start-up stays fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from . import __version__

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", metavar="FILE",
                        help="agents file (TOML); default $LMBRIDGE_CONFIG, then $XDG_CONFIG_HOME/lmbridge/config.toml")
    common.add_argument("--log-level", default=os.environ.get("LMBRIDGE_LOG_LEVEL", "info"),
                        choices=("debug", "info", "warning", "error"), help="log level (default info)")
    common.add_argument("--log-format", default="console", choices=("console", "json"),
                        help="log lines on stderr: console (readable) or json")
    common.add_argument("--trace-dir", metavar="DIR",
                        help="write every JSON-RPC message of every connection to DIR as NDJSON")

    parser = argparse.ArgumentParser(
        prog="lmbridge", description="Make any ACP agent usable as an editor language model.")
    parser.add_argument("--version", action="version", version=f"lmbridge {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    stdio = commands.add_parser("stdio", parents=[common], help="serve one editor on stdin/stdout (editor protocol v1)")
    stdio.add_argument("--max-message-bytes", type=int, default=64 * 1024 * 1024, metavar="N",
                       help="largest message accepted (default 64 MiB)")

    demo = commands.add_parser("demo", parents=[common],
                               help="run a short scripted conversation through lmbridge stdio and the demo agent")
    demo.add_argument("--agent", default="demo", help="agent to talk to (default: the built-in demo agent)")
    demo.set_defaults(log_level="warning")

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .config import ConfigError, load_config
    from .logs import configure

    configure(args.log_level, args.log_format)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"lmbridge: configuration error: {exc}", file=sys.stderr)
        return 2
    tracer = None
    if args.trace_dir:
        from .trace import Tracer

        tracer = Tracer(args.trace_dir)
    try:
        if args.command == "stdio":
            return _run_stdio(config, tracer, args)
        if args.command == "demo":
            from .demo import run_demo

            return run_demo(args)
    finally:
        if tracer is not None:
            tracer.close()
    raise AssertionError(args.command)


def _run_stdio(config: object, tracer: object, args: argparse.Namespace) -> int:
    import trio

    from .logs import get_logger
    from .stdio import serve_stdio

    log = get_logger()
    return trio.run(lambda: serve_stdio(config, log=log, tracer=tracer, max_message_bytes=args.max_message_bytes))


if __name__ == "__main__":
    sys.exit(main())
