"""``lmbridge fake-model``: serve a script on 127.0.0.1 until stopped (Ctrl-C, SIGTERM). The first line on stdout
is the base URL (for scripts that start it with port 0); with ``--record FILE`` every request is appended to FILE
as one JSON line (api, method, path, body, and the turn's number when it was one)."""

from __future__ import annotations

import argparse
import sys

__all__ = ["add_fake_model_parser", "run_fake_model"]


def add_fake_model_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "fake-model",
        help="a scripted model server on 127.0.0.1 for running agents offline (docs/fake-model.md)",
        description="Answer Anthropic Messages, OpenAI Responses and Chat Completions, and Gemini requests on "
        "127.0.0.1 with the turns of a script, in order. Prints the base URL first.",
    )
    parser.add_argument("--script", metavar="FILE", help="the turns (JSON; docs/fake-model.md); default: none")
    parser.add_argument("--say", metavar="TEXT", help="answer every request with this text (instead of a script)")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--record", metavar="FILE", help="append every request to FILE (JSON lines)")


def run_fake_model(args: argparse.Namespace) -> int:
    import json
    from functools import partial

    import trio

    from .script import ScriptError, load_script
    from .server import FakeModel, ModelRequest, Turn, open_fake_model, say

    turns: list[Turn] = []
    then = say(args.say) if args.say else None
    if args.script:
        try:
            turns, scripted_then = load_script(args.script)
        except ScriptError as exc:
            print(f"lmbridge fake-model: {exc}", file=sys.stderr)
            return 2
        then = scripted_then or then
    if not 0 <= args.port <= 65535:
        print("lmbridge fake-model: --port must be 0..65535", file=sys.stderr)
        return 2
    record = None
    if args.record:
        try:
            record = open(args.record, "a", encoding="utf-8")  # noqa: SIM115 (closed below, written from a task)
        except OSError as exc:
            print(f"lmbridge fake-model: cannot write {args.record}: {exc.strerror}", file=sys.stderr)
            return 2

    async def serve() -> None:
        try:
            async with open_fake_model(turns, default=then, port=args.port) as model:
                model.on_request = partial(_note, model)
                print(model.base_url, flush=True)
                await trio.sleep_forever()
        except OSError as exc:
            print(f"lmbridge fake-model: cannot listen on 127.0.0.1:{args.port}: {exc.strerror}", file=sys.stderr)
            raise SystemExit(2) from exc

    def _note(model: FakeModel, request: ModelRequest) -> None:
        """Each request on stderr and in the record, before it is answered: a client that has its answer finds
        its request recorded, even if it stops the server at once."""
        print(f"{request.method} {request.path}", file=sys.stderr, flush=True)
        if record is None:
            return
        line: dict[str, object] = {"api": request.api, "method": request.method, "path": request.path}
        line["body"] = request.body
        if request.turn is not None:
            line["turn"] = len(model.turns)
        record.write(json.dumps(line, ensure_ascii=False) + "\n")
        record.flush()

    try:
        trio.run(serve)
    except KeyboardInterrupt:
        pass
    finally:
        if record is not None:
            record.close()
    return 0
