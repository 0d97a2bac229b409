"""``lmbridge chat``: try an agent by hand from a terminal, the way an editor would use it.

Owns a small interactive editor: it keeps the conversation history, streams the agent's answer as it comes, runs
tool calls against a few built-in example tools (so editor-tool bridging can be tried without an editor), and asks
the person at the keyboard when the agent wants permission. It talks to ``lmbridge stdio`` (started for it) or to a
running ``lmbridge serve`` (``--connect``).

Lines starting with ``:`` are commands: ``:models``, ``:agent ID`` (an agent, or one of its models ``agent/model``),
``:commands`` (the agent's slash commands), ``:new`` (forget the conversation), ``:quit``. A line starting with
``/`` is sent as is: that is how an agent's slash commands run. On a terminal, Tab completes commands, slash commands
and model ids. Ctrl-C cancels a running answer; Ctrl-D quits.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import trio

from bridge.editor.client import ChatResult, EditorClient, connect_daemon, spawn_stdio
from wire.errors import RpcError

__all__ = ["EXAMPLE_TOOLS", "Completions", "run_chat", "run_example_tool", "status_line"]

_CHAT_COMMANDS = (":models", ":agent", ":commands", ":new", ":quit")

EXAMPLE_TOOLS = [
    {
        "name": "get_time",
        "description": "The current date and time on the user's machine.",
        "inputSchema": {"type": "object", "properties": {}},
    },
    {
        "name": "list_files",
        "description": "List the files in a directory of the user's workspace.",
        "inputSchema": {"type": "object", "properties": {"path": {"type": "string", "description": "relative path"}}},
    },
    {
        "name": "read_file",
        "description": "Read a text file of the user's workspace (at most 64 KB).",
        "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
]
_MAX_READ = 64 * 1024


def run_example_tool(name: str, arguments: dict[str, Any], root: Path) -> tuple[str, bool]:
    """Run one of the example tools; ``(text, is_error)``. Paths stay inside ``root``."""
    try:
        if name == "get_time":
            return datetime.datetime.now().astimezone().isoformat(timespec="seconds"), False
        target = (root / str(arguments.get("path", "."))).resolve()
        if target != root and root not in target.parents:
            return f"{arguments.get('path')!r} is outside the workspace", True
        if name == "list_files":
            entries = sorted(p.name + ("/" if p.is_dir() else "") for p in target.iterdir())
            return "\n".join(entries) or "(empty)", False
        if name == "read_file":
            data = target.read_bytes()[:_MAX_READ]
            return data.decode("utf-8", "replace"), False
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror or exc}", True
    return f"unknown tool {name!r}", True


class Completions:
    """What Tab offers: the chat's own ``:`` commands, the model ids after ``:agent``, and the current agent's slash
    commands (from ``lm/models``)."""

    def __init__(self) -> None:
        self.models: list[str] = []
        self.commands: list[str] = []  # slash command names, without the /

    def candidates(self, line: str) -> list[str]:
        """The completions of the last word of ``line`` (what is typed so far)."""
        if line.startswith(":agent "):
            word = line[len(":agent ") :]
            return [model for model in self.models if model.startswith(word)]
        if " " in line:
            return []
        if line.startswith("/"):
            return [f"/{name}" for name in sorted(self.commands) if f"/{name}".startswith(line)]
        if line.startswith(":"):
            return [command for command in _CHAT_COMMANDS if command.startswith(line)]
        return []


class _Terminal:
    def __init__(self, completions: Completions | None = None) -> None:
        self.at_line_start = True
        self._readline = _line_editor(completions) if completions is not None and sys.stdin.isatty() else None

    def write(self, text: str) -> None:
        if text:
            sys.stdout.write(text)
            sys.stdout.flush()
            self.at_line_start = text.endswith("\n")

    def line(self, text: str = "") -> None:
        if not self.at_line_start:
            self.write("\n")
        self.write(text + "\n")

    async def ask(self, prompt: str) -> str | None:
        """One line from the keyboard; None at end of input."""
        self.line() if not self.at_line_start else None
        if self._readline is not None:
            try:
                return await trio.to_thread.run_sync(input, prompt, abandon_on_cancel=True)
            except EOFError:
                return None
            finally:
                self.at_line_start = True
        sys.stdout.write(prompt)
        sys.stdout.flush()
        line = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
        self.at_line_start = True
        return line.rstrip("\n") if line else None


def _line_editor(completions: Completions) -> Any:
    """GNU readline (or libedit) with Tab completing from ``completions``; None where Python has no readline."""
    try:
        import readline
    except ImportError:
        return None
    offered: list[str] = []

    def complete(text: str, state: int) -> str | None:
        if state == 0:
            offered[:] = completions.candidates(readline.get_line_buffer()[: readline.get_endidx()])
            if len(offered) == 1:
                offered[0] += " "  # the one completion: go on typing after it (Python's readline adds nothing)
        return offered[state] if state < len(offered) else None

    readline.set_completer_delims(" ")
    readline.set_completer(complete)
    readline.parse_and_bind("bind ^I rl_complete" if "libedit" in (readline.__doc__ or "") else "tab: complete")
    return readline


async def _answer_tools(terminal: _Terminal, result: ChatResult, permission_tool: str, root: Path) -> dict[str, Any]:
    content = []
    for call in result.tool_calls:
        if call["name"] == permission_tool:
            text = await _ask_permission(terminal, call["input"])
        else:
            text, error = run_example_tool(call["name"], call["input"] if isinstance(call["input"], dict) else {}, root)
            terminal.line(f"  [ran {call['name']} → {'error: ' if error else ''}{text[:80]!r}]")
            content.append(
                {
                    "type": "tool_result",
                    "callId": call["callId"],
                    "isError": error,
                    "content": [{"type": "text", "value": text}],
                }
            )
            continue
        content.append({"type": "tool_result", "callId": call["callId"], "content": [{"type": "text", "value": text}]})
    return {"role": "user", "content": content}


async def _ask_permission(terminal: _Terminal, request: dict[str, Any]) -> str:
    terminal.line(f"  ⚠ the agent asks: {request.get('title')}  ({request.get('kind')})")
    if request.get("command"):
        terminal.line(f"    command: {request['command']}")
    for path in request.get("paths", ()):
        terminal.line(f"    file: {path}")
    while True:
        answer = await terminal.ask("    allow? [y]es once / [a]lways / [n]o: ")
        if answer is None:
            return "reject"
        choice = answer.strip().lower()[:1]
        if choice in ("y", "a", "n"):
            return {"y": "allow", "a": "always", "n": "reject"}[choice]


async def _turn(
    client: EditorClient,
    terminal: _Terminal,
    model: str,
    history: list[dict[str, Any]],
    permission: dict[str, Any],
    root: Path,
) -> None:
    tools = [*EXAMPLE_TOOLS, permission]
    while True:
        terminal.write("agent › ")
        turn = await client.start_chat(
            model, history, tools=tools, on_part=lambda part: _show(terminal, part, permission["name"])
        )
        with trio.open_signal_receiver(signal.SIGINT) as interrupts:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_cancel_on_interrupt, interrupts, turn, terminal)
                result = await turn.result()
                nursery.cancel_scope.cancel()
        if result.error is not None:
            terminal.line(f"  ✗ error {result.error.code}: {result.error.message}")
            return
        history.append(result.assistant_message())
        if result.stop_reason != "tool_calls":
            terminal.line(f"  ⏎ {status_line(result.stop_reason, result.usage)}")
            return
        history.append(await _answer_tools(terminal, result, permission["name"], root))


def status_line(stop_reason: str | None, usage: dict[str, Any] | None) -> str:
    """What a turn ended with and what it cost, on one line: "end_turn · 1,200 in / 35 out · context 1,235 of
    200,000 (1%) · 0.0525 USD" (each figure only when the agent reported it)."""
    pieces = [str(stop_reason)]
    usage = usage or {}
    tokens_in, tokens_out = usage.get("inputTokens"), usage.get("outputTokens")
    if isinstance(tokens_in, int) and isinstance(tokens_out, int):
        pieces.append(f"{tokens_in:,} in / {tokens_out:,} out")
    used, size = usage.get("contextUsed"), usage.get("contextSize")
    if isinstance(used, int) and isinstance(size, int) and size > 0:
        pieces.append(f"context {used:,} of {size:,} ({used * 100 // size}%)")
    cost = usage.get("cost")
    if isinstance(cost, dict) and isinstance(cost.get("amount"), int | float):
        pieces.append(f"{cost['amount']:.4f} {cost.get('currency', '')}".rstrip())
    return " · ".join(pieces)


async def _cancel_on_interrupt(interrupts: Any, turn: Any, terminal: _Terminal) -> None:
    async for _signal in interrupts:
        terminal.line("  [cancelling…]")
        turn.cancel()


def _show(terminal: _Terminal, part: dict[str, Any], permission_tool: str) -> None:
    kind = part.get("type")
    if kind == "tool_call" and part["name"] == permission_tool:
        return  # asked at the keyboard once the turn ends
    if kind == "text":
        terminal.write(part["value"])
    elif kind == "thinking":
        terminal.line(f"  (thinking: {part['value'].strip()})")
    elif kind == "tool_call":
        terminal.line(f"  [tool call {part['name']} {json.dumps(part['input'])}]")


async def _session(client: EditorClient, args: argparse.Namespace) -> int:
    completions = Completions()
    terminal = _Terminal(completions)
    root = Path.cwd().resolve()
    info = await client.initialize(
        clientInfo={"name": "lmbridge-chat", "version": "1"},
        workspaceFolders=[str(root)],
        capabilities={"thinking": True},
    )
    listed = {m["id"]: m for m in await client.models()}
    models = list(listed)
    model = args.agent or models[0]
    if model not in listed:
        try:  # an agent/model entry the agent has not shown yet is still worth a try
            await client.count_tokens(model, text="")
        except RpcError:
            terminal.line(f"no model {model!r}; configured: {', '.join(models)}")
            return 1
    terminal.line(f"lmbridge chat — talking to {model!r} (models: {', '.join(models)}). :quit to leave.")
    history: list[dict[str, Any]] = []
    seen_changes = client.models_changes

    def take(entries: dict[str, dict[str, Any]]) -> None:
        nonlocal listed
        listed = entries
        completions.models = list(entries)
        completions.commands = [c["name"] for c in listed.get(model, {}).get("commands", ())]

    take(listed)
    while True:
        if client.models_changes != seen_changes:  # an agent showed its models or commands: list them again
            seen_changes = client.models_changes
            take({m["id"]: m for m in await client.models()})
        line = await terminal.ask("you › ")
        if line is None or line.strip() == ":quit":
            return 0
        if not line.strip():
            continue
        if line.startswith(":"):
            command, _, rest = line[1:].partition(" ")
            if command == "models":
                terminal.line(", ".join(listed))
            elif command == "agent" and rest.strip() in listed:
                model = rest.strip()
                history = []
                take(listed)
                terminal.line(f"now talking to {model!r} (new conversation)")
            elif command == "commands":
                terminal.line(_commands_text(listed.get(model, {}).get("commands", ())))
            elif command == "new":
                history = []
                terminal.line("new conversation")
            else:
                terminal.line("commands: :models, :agent ID, :commands, :new, :quit")
            continue
        history.append({"role": "user", "content": [{"type": "text", "value": line}]})
        await _turn(client, terminal, model, history, info["permissionTool"], root)


def _commands_text(commands: Any) -> str:
    """The agent's slash commands, one per line; or why there are none yet."""
    if not commands:
        return "the agent has announced no slash commands (yet: agents announce them once a session is open)"
    return "\n".join(
        f"/{c['name']}{' ' + c['hint'] if c.get('hint') else ''} — {c.get('description', '')}" for c in commands
    )


async def _main(args: argparse.Namespace) -> int:
    if args.connect:
        from bridge.daemon.security import default_token_path

        token_path = Path(args.token_file).expanduser() if args.token_file else default_token_path()
        try:
            token = token_path.read_text().strip()
        except OSError as exc:
            print(f"lmbridge chat: cannot read the token file {token_path}: {exc.strerror}", file=sys.stderr)
            return 2
        async with connect_daemon(args.connect, token) as client:
            return await _session(client, args)
    child = ["--log-level", args.log_level, "--log-format", args.log_format]
    if args.config:
        child += ["--config", args.config]
    if args.trace_dir:
        child += ["--trace-dir", args.trace_dir]
    async with spawn_stdio(child) as (client, _process):
        return await _session(client, args)


def run_chat(args: argparse.Namespace) -> int:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    try:
        return trio.run(_main, args)
    except KeyboardInterrupt:
        return 130
