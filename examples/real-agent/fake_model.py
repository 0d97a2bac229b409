"""A scripted fake model for real agents, as a standalone server: the worked example of docs/harness.md.

Serves lmbridge's fake model (``bridge.fakemodel``: Anthropic Messages, OpenAI Responses and Chat Completions, and
Gemini streaming APIs) on 127.0.0.1, answering each model request with the next turn of a JSON script, until
interrupted; and writes an lmbridge config file with the agent pointed at it (``tests/interop/kits.py``, from the
recipes of docs/fake-model.md: the tables of docs/agents.md, a private HOME, and what each agent needs there). Run it
from the repository root:

    python examples/real-agent/fake_model.py --agent claude --dir /tmp/lmbridge-example \\
        examples/real-agent/weather-model.json

A script is a list of model turns: ``{"say": "text"}``, or ``{"tool": "get_weather", "arguments": {...}}`` — a call
of the editor's tool, named as the agent's model sees it (``mcp__editor__get_weather`` for Claude Code, and so on).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bridge.fakemodel.server import call, open_fake_model, say
from tests.interop.kits import KITS, write_config


def load(path: str, agent: str) -> list:
    kit = KITS[agent]
    turns = []
    for entry in json.loads(Path(path).read_text()):
        if "tool" in entry:
            turns.append(call(kit.editor_tool(entry["tool"], entry.get("arguments", {})), entry.get("say", "")))
        else:
            turns.append(say(entry["say"]))
    return turns


async def serve(args: argparse.Namespace) -> None:
    async with open_fake_model(load(args.script, args.agent), port=args.port) as model:
        directory = Path(args.dir).resolve()
        home, project = directory / "home", directory / "project"
        home.mkdir(parents=True, exist_ok=True)
        project.mkdir(parents=True, exist_ok=True)
        table = KITS[args.agent].agent_table(model_url=model.base_url, home=home, project=project, marker="example")
        config = write_config(directory / "agents.toml", {args.agent: table})
        print(
            f"fake model for {args.agent} on {model.base_url} ({len(model.script)} turns); config: {config}; "
            f"workspace: {project}",
            flush=True,
        )
        while True:
            before = len(model.requests)
            await model.changed()
            for request in model.requests[before:]:
                print(
                    f"  {request.api} {request.method} {request.path}" + (" (a model turn)" if request.turn else ""),
                    flush=True,
                )
            for error in model.errors:
                print(f"  ! {error}", flush=True)
            model.errors.clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("script", help="the model's turns (JSON)")
    parser.add_argument(
        "--agent", choices=sorted(KITS), default="claude", help="the agent to configure (default claude)"
    )
    parser.add_argument("--dir", default="/tmp/lmbridge-example", help="where to write agents.toml, home/, project/")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any free one)")
    try:
        trio.run(serve, parser.parse_args())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
