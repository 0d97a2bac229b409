"""``lmbridge demo``: a small scripted editor drives ``lmbridge stdio`` and the built-in demo agent through a short
conversation and prints it as it streams — who said what, the streamed text, tool calls, stop reasons.

Owns the demo script and its presentation. Everything goes through the real wire: the bridge and the agent are
separate processes, exactly as with an editor and a real agent.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import trio

from bridge.editor.client import ChatResult, EditorClient, spawn_stdio

__all__ = ["DEMO_TOOLS", "run_demo"]

DEMO_TOOLS = [
    {
        "name": "get_weather",
        "description": "Current weather for a city (the demo editor answers with canned data).",
        "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
]


class _Printer:
    def __init__(self, out: Any) -> None:
        self.out = out
        self.at_line_start = True

    def write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()
        if text:
            self.at_line_start = text.endswith("\n")

    def line(self, text: str = "") -> None:
        if not self.at_line_start:
            self.write("\n")
        self.write(text + "\n")

    def part(self, part: dict[str, Any]) -> None:
        kind = part.get("type")
        if kind == "text":
            self.write(part["value"])
        elif kind == "thinking":
            self.line(f"  (thinking: {part['value'].strip()})")
        elif kind == "tool_call":
            self.line(f"  [tool call {part['name']} {part['input']} · {part['callId'][:12]}…]")


async def _turn(
    client: EditorClient,
    printer: _Printer,
    model: str,
    history: list[dict[str, Any]],
    text: str,
    *,
    cancel_when: str | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> ChatResult:
    """One turn; with ``cancel_when``, the editor cancels it once the streamed text contains that string."""
    history.append({"role": "user", "content": [{"type": "text", "value": text}]})
    printer.line()
    for number, line in enumerate(text.splitlines()):
        printer.line(("you   › " if number == 0 else "        ") + line)
    printer.write("agent › ")
    started = time.perf_counter()
    streamed: list[str] = []
    cancel = trio.Event()

    def on_part(part: dict[str, Any]) -> None:
        printer.part(part)
        streamed.append(part.get("value", "") if part.get("type") == "text" else "")
        if cancel_when is not None and not cancel.is_set() and cancel_when in "".join(streamed):
            cancel.set()

    turn = await client.start_chat(model, history, tools=tools or (), on_part=on_part)
    async with trio.open_nursery() as nursery:
        if cancel_when is not None:
            nursery.start_soon(_cancel_on, cancel, turn, printer)
        result = await turn.result()
        nursery.cancel_scope.cancel()
    took = (time.perf_counter() - started) * 1000
    if result.error is not None:
        printer.line(f"  ✗ error {result.error.code}: {result.error.message}")
    else:
        printer.line(f"  ⏎ {result.stop_reason} · {len(result.parts)} parts · {took:.0f} ms")
        history.append(result.assistant_message())
    return result


async def _cancel_on(event: trio.Event, turn: Any, printer: _Printer) -> None:
    await event.wait()
    printer.line("  [editor → $/cancelRequest]")
    turn.cancel()


async def _demo(args: argparse.Namespace) -> int:
    out = _Printer(sys.stdout)
    child_args = ["--log-level", args.log_level, "--log-format", args.log_format]
    if args.config:
        child_args += ["--config", args.config]
    if args.trace_dir:
        child_args += ["--trace-dir", args.trace_dir]
    out.line("lmbridge demo — a scripted editor ⇄ lmbridge stdio ⇄ the demo agent (ACP), all real processes")
    async with spawn_stdio(child_args) as (client, _process):
        started = time.perf_counter()
        info = await client.initialize(
            clientInfo={"name": "lmbridge-demo", "version": "1"}, capabilities={"thinking": True}
        )
        out.line(
            f"initialize → {info['serverInfo']['name']} {info['serverInfo']['version']} "
            f"in {(time.perf_counter() - started) * 1000:.0f} ms"
        )
        models = await client.models()
        if args.agent not in {m["id"] for m in models}:
            out.line(f"no model {args.agent!r}; configured: {', '.join(m['id'] for m in models)}")
            return 1
        out.line("models → " + ", ".join(f"{m['id']} ({m['name']})" for m in models))
        history: list[dict[str, Any]] = []
        steps: list[tuple[str, dict[str, Any]]] = [
            (
                "Hi! Show me what you can do.\n/think The user wants a tour.\n/plan Greet; Stream; Show activity\n"
                "/say Streaming works: this sentence arrives in several chunks.\n/run git status",
                {},
            ),
            ("/recall", {}),
            (
                "/say Counting slowly — the editor will cancel me.\n/stream 5\n/sleep 5000\n/say (never said)",
                {"cancel_when": "5 "},
            ),
            ("/say Still here after the cancel: the session survived.", {}),
        ]
        for text, options in steps:
            result = await _turn(client, out, args.agent, history, text, **options)
            if result.error is not None:
                return 1
        # The agent's session showed its models and slash commands: lmbridge lists them as models of their own.
        listed = await client.models()
        own = [m["id"] for m in listed if m.get("agent") == args.agent and m["id"] != args.agent]
        commands = next((m.get("commands") or [] for m in listed if m["id"] == args.agent), [])
        if own or commands:
            out.line()
            shown = " ".join(f"/{c['name']}" for c in commands[:8]) + (" …" if len(commands) > 8 else "")
            out.line(f"models now → {', '.join(own) or '(no more)'}; slash commands → {shown}")
    out.line()
    out.line("done: 4 turns on one ACP session, one of them cancelled mid-stream.")
    return 0


def run_demo(args: argparse.Namespace) -> int:
    return trio.run(_demo, args)
