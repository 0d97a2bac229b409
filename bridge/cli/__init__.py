"""The ``lmbridge`` command line.

Owns argument parsing and turning configuration mistakes into one clear line on stderr (exit status 2). Each
subcommand's work lives in its own module, imported only when that subcommand runs, so start-up stays fast.

- ``chat``: ``lmbridge chat``, an agent from the terminal
- ``demo``: ``lmbridge demo``, the scripted conversation
- ``keys``: ``lmbridge keys``, the keys of a shared daemon
- ``usage``: ``lmbridge usage``, what its turns used, from the usage ledger
- ``agents``: ``lmbridge agents``, the ACP registry's agents: list, add to the config, update, doctor

``lmbridge test`` and ``replay`` are the harness's, ``conform`` the kit's, ``fake-model`` the fake model's: each
package has a ``command`` module with its parser and entry point.

May import: ``bridge.daemon``, ``bridge.harness``, ``bridge.conform``, ``bridge.fakemodel``, ``bridge.editor``,
``bridge.config``, ``wire``. Nothing imports it but ``python -m bridge``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from bridge import __version__

if TYPE_CHECKING:  # the config module is imported only once the command line is parsed (start-up time)
    from bridge.config import Config

__all__ = ["build_parser", "main"]


def _common(log_level: str = "info") -> argparse.ArgumentParser:
    """The options every command takes. A new parser each time: argparse shares a parent's option objects with
    every child, so one command changing a default (``demo`` logs warnings only) would change it for all."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--config",
        metavar="FILE",
        help="agents file (TOML); default $LMBRIDGE_CONFIG, then $XDG_CONFIG_HOME/lmbridge/config.toml",
    )
    common.add_argument(
        "--log-level",
        default=os.environ.get("LMBRIDGE_LOG_LEVEL", log_level),
        choices=("debug", "info", "warning", "error"),
        help=f"log level (default {log_level})",
    )
    common.add_argument(
        "--log-format",
        default="console",
        choices=("console", "json"),
        help="log lines on stderr: console (readable) or json",
    )
    common.add_argument(
        "--trace-dir", metavar="DIR", help="write every JSON-RPC message of every connection to DIR as NDJSON"
    )
    return common


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lmbridge", description="Make any ACP agent usable as an editor language model."
    )
    parser.add_argument("--version", action="version", version=f"lmbridge {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    stdio = commands.add_parser(
        "stdio", parents=[_common()], help="serve one editor on stdin/stdout (editor protocol v1)"
    )
    stdio.add_argument(
        "--max-message-bytes",
        type=int,
        default=64 * 1024 * 1024,
        metavar="N",
        help="largest message accepted (default 64 MiB)",
    )
    stdio.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="also serve the OpenAI/Anthropic-compatible HTTP API there, on loopback (the agents, and the models "
        "this editor shares: docs/editor-models.md)",
    )
    stdio.add_argument(
        "--token-file",
        metavar="FILE",
        help="with --http: the token clients present (default $XDG_STATE_HOME/lmbridge/token)",
    )

    serve = commands.add_parser(
        "serve",
        parents=[_common()],
        help="run the daemon for any number of editors (WebSocket, editor protocol v1) and HTTP clients "
        "(OpenAI/Anthropic-compatible API)",
    )
    where = serve.add_mutually_exclusive_group()
    where.add_argument(
        "--listen",
        default=None,
        metavar="HOST:PORT",
        help="WebSocket address to listen on (default 127.0.0.1:0, port 0 picks a free one; "
        "with --http alone, no WebSocket)",
    )
    where.add_argument("--unix", metavar="PATH", help="listen on a unix socket instead (created 0600)")
    serve.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="also serve the OpenAI/Anthropic-compatible HTTP API there (config: [serve] http; docs/http.md)",
    )
    serve.add_argument(
        "--token-file",
        metavar="FILE",
        help="bearer token clients must present (created 0600 with a random token if absent; "
        "default $XDG_STATE_HOME/lmbridge/token)",
    )
    serve.add_argument(
        "--keys-file",
        metavar="FILE",
        help="keys of other principals (lmbridge keys; default keys.json beside the token file)",
    )
    serve.add_argument(
        "--ledger",
        metavar="FILE",
        help="the usage ledger, one row per turn (lmbridge usage; default usage.db beside the token file)",
    )
    serve.add_argument(
        "--audit-log",
        metavar="FILE",
        help="the audit log: keys, refusals, permission decisions, agent processes (default audit.log beside the "
        "token file)",
    )
    serve.add_argument(
        "--drain-grace",
        type=float,
        metavar="S",
        help="on SIGTERM, let running turns finish for up to S seconds, opening no new conversation (config: [serve] "
        "drain_grace; default 0: cancel them)",
    )
    serve.add_argument(
        "--open-metrics",
        action="store_true",
        help="answer /metrics to clients on loopback without a key (config: [serve] open_metrics)",
    )
    serve.add_argument("--allow-remote", action="store_true", help="allow a non-loopback --listen address (needs TLS)")
    serve.add_argument("--tls-cert", metavar="FILE", help="TLS certificate chain (PEM)")
    serve.add_argument("--tls-key", metavar="FILE", help="TLS private key (PEM)")
    serve.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="accept WebSocket handshakes from this browser Origin (repeatable; default none)",
    )
    serve.add_argument("--max-connections", type=int, default=64, metavar="N", help="concurrent editors (default 64)")
    serve.add_argument(
        "--max-message-bytes",
        type=int,
        default=64 * 1024 * 1024,
        metavar="N",
        help="largest message accepted (default 64 MiB)",
    )
    serve.add_argument(
        "--idle-timeout",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="close connections idle this long (default 3600)",
    )
    serve.add_argument(
        "--max-requests", type=int, default=32, metavar="N", help="requests in flight per connection (default 32)"
    )

    chat = commands.add_parser(
        "chat", parents=[_common("warning")], help="chat with an agent from the terminal, for trying agents"
    )
    chat.add_argument(
        "--connect",
        metavar="URL",
        help="a running lmbridge serve (ws://..., ws+unix://...); default: start lmbridge stdio",
    )
    chat.add_argument(
        "--token-file", metavar="FILE", help="token for --connect (default $XDG_STATE_HOME/lmbridge/token)"
    )
    chat.add_argument("--agent", default=None, help="model to talk to (default: the first configured)")

    demo = commands.add_parser(
        "demo",
        parents=[_common("warning")],
        help="run a short scripted conversation through lmbridge stdio and the demo agent",
    )
    demo.add_argument("--agent", default="demo", help="agent to talk to (default: the built-in demo agent)")

    from bridge.conform.command import add_conform_parser
    from bridge.fakemodel.command import add_fake_model_parser
    from bridge.harness.commands import add_replay_parser, add_test_parser

    from .agents import add_agents_parser
    from .keys import add_keys_parser
    from .usage import add_usage_parser

    add_test_parser(commands)
    add_replay_parser(commands)
    add_conform_parser(commands)
    add_fake_model_parser(commands)
    add_agents_parser(commands)
    add_keys_parser(commands)
    add_usage_parser(commands)

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in ("test", "replay"):  # the harness reads no config of its own and logs nothing here
        from bridge.harness.commands import run

        return run(args)
    if args.command == "conform":  # the kit reads the config only for an agent id, and logs nothing here
        from bridge.conform.command import run_conform

        return run_conform(args)
    if args.command == "fake-model":  # a model server: no config, its own lines on stdout
        from bridge.fakemodel.command import run_fake_model

        return run_fake_model(args)
    if args.command == "agents":  # reads the config itself, where it needs it
        from .agents import run_agents

        return run_agents(args)
    if args.command == "keys":  # files only: no config, no logging
        from .keys import run_keys

        return run_keys(args)
    if args.command == "usage":  # the ledger only
        from .usage import run_usage

        return run_usage(args)
    from bridge.config import ConfigError, load_config

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"lmbridge: configuration error: {exc}", file=sys.stderr)
        return 2
    tracer = None
    if args.trace_dir:
        from wire.observe.trace import Tracer

        try:
            tracer = Tracer(args.trace_dir)
        except OSError as exc:
            print(f"lmbridge: cannot trace: {exc}", file=sys.stderr)
            return 2
    if args.command == "stdio":
        try:
            return _run_stdio(config, tracer, args)
        finally:
            if tracer is not None:
                tracer.close()
    from wire.observe.logs import configure

    configure(args.log_level, args.log_format)
    try:
        if args.command == "demo":
            from .demo import run_demo

            return run_demo(args)
        if args.command == "serve":
            return _run_serve(config, tracer, args)
        if args.command == "chat":
            from .chat import run_chat

            return run_chat(args)
    finally:
        if tracer is not None:
            tracer.close()
    raise AssertionError(args.command)


def _run_stdio(config: Config, tracer: Any, args: argparse.Namespace) -> int:
    from bridge.daemon.stdio import (
        answer_initialize,
        import_while_reading,
        load_service,
        read_initialize,
        reserve_stdout,
        start_first_chat_agent,
    )

    # The editor waits for the answer to initialize while it starts up: give it before importing the rest. A first
    # chat sent along with it has its agent started first: that start is the longest wait of the chat.
    try:
        http = _host_port(args.http, "--http") if args.http else None
    except ValueError as exc:
        print(f"lmbridge: {exc}", file=sys.stderr)
        return 2
    protocol_fd = reserve_stdout()
    first, pending = read_initialize(0, max_message_bytes=args.max_message_bytes)
    early_agent = start_first_chat_agent(config, first, pending, tracer=tracer)
    try:
        _pause_collector_while_starting()
        if first is not None:
            answer_initialize(config, first, protocol_fd, tracer=tracer)
            if early_agent is None:  # the first chat may come now that initialize is answered: read it meanwhile
                pending, early_agent = import_while_reading(
                    load_service,
                    0,
                    pending,
                    max_message_bytes=args.max_message_bytes,
                    on_request=lambda read: start_first_chat_agent(config, first, read, tracer=tracer),
                )
        import trio

        from bridge.daemon.security import ServeError
        from bridge.daemon.stdio import serve_stdio
        from wire.observe.logs import configure, get_logger

        configure(args.log_level, args.log_format)
        log = get_logger()
        try:
            code: int = trio.run(
                lambda: serve_stdio(
                    config,
                    log=log,
                    tracer=tracer,
                    stdout_fd=protocol_fd,
                    max_message_bytes=args.max_message_bytes,
                    hello=first.hello if first is not None else None,
                    pending_input=pending,
                    early_agent=early_agent,
                    http=http,
                    token_file=args.token_file,
                )
            )
        except ServeError as exc:
            print(f"lmbridge stdio: {exc}", file=sys.stderr)
            return 2
        return code
    finally:
        if early_agent is not None:
            early_agent.abandon()  # nothing when the pool adopted it


def _pause_collector_while_starting() -> None:
    """Start-up imports make ~100,000 objects that live as long as the process; the cyclic garbage collector scanning
    them as they come costs ~8 % of lmbridge's start. The service turns it back on once started (and freezes what
    was made out of every later scan): ``BridgeService.run``."""
    import gc

    gc.disable()


def _run_serve(config: Config, tracer: Any, args: argparse.Namespace) -> int:
    _pause_collector_while_starting()
    import trio

    from bridge.daemon.security import ServeError
    from bridge.daemon.serve import ServeOptions, serve_daemon
    from wire.observe.logs import get_logger

    http_address = args.http or config.serve.http
    websocket = not (http_address and args.listen is None and args.unix is None)
    try:
        host, port = _host_port(args.listen or "127.0.0.1:0", "--listen")
        http = _host_port(http_address, "--http") if http_address else None
    except ValueError as exc:
        print(f"lmbridge: {exc}", file=sys.stderr)
        return 2
    options = ServeOptions(
        host=host,
        port=port,
        unix_path=args.unix,
        token_file=args.token_file,
        keys_file=args.keys_file,
        ledger_file=args.ledger,
        audit_file=args.audit_log,
        allow_remote=args.allow_remote,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        allowed_origins=tuple(args.allow_origin) or config.serve.allowed_origins,
        max_connections=args.max_connections,
        max_message_bytes=args.max_message_bytes,
        idle_timeout=args.idle_timeout,
        max_requests=args.max_requests,
        websocket=websocket,
        http=http,
        http_max_turns=config.serve.max_turns,
        http_activity=config.serve.activity,
        drain_grace=args.drain_grace if args.drain_grace is not None else config.serve.drain_grace,
        open_metrics=args.open_metrics or config.serve.open_metrics,
    )
    log = get_logger()
    try:
        code: int = trio.run(lambda: serve_daemon(config, options, log=log, tracer=tracer))
    except ServeError as exc:
        print(f"lmbridge serve: {exc}", file=sys.stderr)
        return 2
    return code


def _host_port(value: str, option: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{option} needs HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


if __name__ == "__main__":
    sys.exit(main())
