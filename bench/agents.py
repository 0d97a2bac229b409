"""The real agents, direct and through lmbridge: what lmbridge adds to what a user waits for (``make bench-agents``).

Each agent of the interop suite (Claude Code, Codex, Gemini CLI, OpenCode at their pinned releases, installed by
``tests/interop/installs.py``) runs offline against the interop suite's fake model on 127.0.0.1, which answers at
once. Paired runs, the side that goes first alternating:

- direct: a minimal ACP client (raw JSON-RPC over the agent's stdio, Trio) drives the agent, and gives it the tool
  the usual way: an MCP server that shares no code with lmbridge (``bench/weather_mcp.py``, the official MCP SDK's
  ``MCPServer``) over stdio — the baseline of the verdicts. Beside it, with ``--baselines``: the same server over
  streamable HTTP (``http``), and lmbridge's own MCP endpoint code over streamable HTTP in this process (``same``:
  both sides then speak the same MCP, which leaves out what lmbridge's way of serving tools costs). Each answers at
  once;
- through lmbridge: ``lmbridge stdio`` with the agent configured as a user would, driven as an editor drives it;
  the editor answers each tool call at once, in its next request.

Figures (medians over the runs, and the ratio):

    cold first chat   spawn → first text of the first chat (lmbridge gets initialize and lm/chat at once)
    prestart chat     an editor connected (lmbridge: ``prestart``) and the user typed for a second, the agent is ready
                      → first text of a new chat (direct: the agent started, initialized, and a second passed)
    text turn         a later turn of the same conversation: request → end of the answer
    first tool turn   the first turn of the process with a tool call: request → call → result → end of the answer
    later tool turn   the same, a later turn of that conversation: the median of the five that follow the first
                      tool turn (one turn's time spreads by milliseconds within a process; a 3 ms goal needs less)

Two traced runs through lmbridge follow the paired ones: its own time on each figure's path, and the editor's (from
an answer asking for its tools to its next request), are read off its wire traces and given in each row's notes.

What lmbridge adds is given twice: the difference of the two medians, and the Hodges-Lehmann estimate (the median of
every pairwise difference, with a 90 % bootstrap interval), which the verdict uses: some agents' own times are
bimodal (Claude Code's session start), and a difference of medians of ten such samples swings by hundreds of
milliseconds from run to run (``bench.common.shift``).

    python -m bench.agents [--reps 10] [--agents claude,codex] [--output FILE] [--lmbridge-tree DIR]
                           [--floor [bare,parts]] [--baselines stdio,same] [--mcp-transport stdio[,http]]

``--lmbridge-tree`` runs lmbridge from another source tree (a ``git worktree`` of an older commit) to compare
commits with the same benchmark; the benchmark's own code (the direct side) stays this one. ``--floor`` adds a side
to every round, the same chats through a floor in lmbridge's place, with a row for each figure: what any bridge of
this design adds to a real agent's chats on this machine, the floor under lmbridge's, with lmbridge's distance above
it. Two floors (``--floor bare,parts``): ``bare`` (the default), ``bench/bare_floor.py --launch``, the standard
library alone — blocking threads, ``http.server`` and a stdio relay of its own, no code of lmbridge's — the agent
started and set up as lmbridge would (the launch file, written here from the config) and given the editor's tools
over the transport lmbridge gives it; ``parts``, ``bench/tool_floor.py --config``, lmbridge's own transports wired to
each other with nothing of a bridge between them (its tools always over HTTP; no cold first chat row: it imports all
of itself before it starts the agent).
``--mcp-transport`` sets the agent's ``mcp_transport`` on the bridged side; given several (``stdio,http``), each is
a side of every round, the first the verdicts', and rows named ``agent over <transport>`` compare the others with
it: how ``mcp_transport = "auto"`` is chosen for each agent (docs/agents.md). ``--agent-setting KEY=VALUE`` puts a
key in the agent's table on lmbridge's side alone (``tool_batch_idle=0``): what a setting changes, against the same
direct side and floor. The sides of a round run in an order of a Williams design (``bench.common.balanced_orders``):
over a cycle of rounds each side runs first as often as the others, and right after each other side as often.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import trio

from bench.common import (
    RESULTS,
    QuietLog,
    Row,
    balanced_orders,
    cpu_ms,
    options_to_set,
    shift,
    summarize,
    with_bytecode_cache,
)
from bench.run import table
from bench.weather_mcp import ANSWER as WEATHER_ANSWER
from bench.weather_mcp import TOOL as WEATHER_TOOL
from bench.wire import BARE_FLOOR, ROOT, TOOL_FLOOR

sys.path.insert(0, str(ROOT / "tests"))  # the interop suite's fake model, agent kits and installs

from interop.installs import ensure_installed, npm_missing
from interop.kits import FOREIGN_ENV, KITS, AgentKit, write_config

from bridge.acp.handshake import CLIENT_CAPABILITIES
from bridge.config import AgentConfig, load_config, mcp_transport
from bridge.editor.client import EditorClient, spawn_stdio
from bridge.fakemodel.server import FakeModel, call, open_fake_model, say

TYPING = 1.0  # seconds between an editor connecting and its first chat, in the prestart figure
STEP_TIMEOUT = 90.0  # seconds: one chat, including an agent's cold start
FIGURES = ("cold first chat", "prestart chat", "text turn", "first tool turn", "later tool turn")
LATER_CITIES = ("Oslo", "Lima", "Cairo", "Quito", "Hanoi")  # the later tool turns of each run, their median its sample
REQUEST_BYTES = "model request bytes"  # beside the figures in a side's samples: the size of each model turn's request
# Beside them on the bridged sides: the bridge process's CPU per later tool turn (median of a run's), in ms. On two
# cores an agent that keeps both busy (Claude Code) waits for it; its spread is a fraction of the turn time's.
BRIDGE_CPU = "bridge CPU per later tool turn"
OWN_FIGURES = FIGURES[1:]  # lmbridge's own time is read off its traces for these (a cold start has no message before)
TRACED_RUNS = 2  # bridged runs per agent with --trace-dir, after the paired ones: lmbridge's own time
LMBRIDGE_TREE: Path | None = None  # --lmbridge-tree
BRIDGED_SETTINGS: dict[str, Any] = {}  # --agent-setting: keys of the agent's table on lmbridge's side alone
FLOORS = ("bare", "parts")  # --floor: bench/bare_floor.py (the standard library alone), bench/tool_floor.py
FLOOR_FIGURES = {"bare": FIGURES, "parts": FIGURES[1:]}  # --floor: the rows of each
clock = time.perf_counter


def _environment(extra: dict[str, str]) -> dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        if not FOREIGN_ENV.match(name) and not name.startswith("LMBRIDGE_")  # nor the user's lmbridge settings
    }
    return {**env, **extra}


# -- the direct side: a minimal ACP client -------------------------------------------------------------------------


class DirectAgent:
    """An ACP agent process driven over raw newline-delimited JSON-RPC; permission requests are allowed at once."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self._next_id = 0
        self._answers: dict[int, Any] = {}
        self._answered: dict[int, trio.Event] = {}
        self.on_update: Callable[[dict[str, Any]], None] | None = None

    async def _send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send_all(json.dumps(message).encode() + b"\n")

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        self._next_id += 1
        request_id = self._next_id
        self._answered[request_id] = trio.Event()
        await self._send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        await self._answered[request_id].wait()
        answer = self._answers.pop(request_id)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer.get("result")

    async def read(self) -> None:
        assert self.process.stdout is not None
        rest = b""
        async for data in self.process.stdout:
            lines = (rest + data).split(b"\n")
            rest = lines.pop()
            for line in lines:
                if line.strip():
                    await self._receive(json.loads(line))

    async def _receive(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        if method is None:
            request_id = message.get("id")
            if request_id in self._answered:
                self._answers[request_id] = message
                self._answered.pop(request_id).set()
            return
        if "id" in message:
            result: Any = None
            if method == "session/request_permission":
                options = message.get("params", {}).get("options") or []
                allow = next((o for o in options if str(o.get("kind", "")).startswith("allow")), options[0])
                result = {"outcome": {"outcome": "selected", "optionId": allow["optionId"]}}
                await self._send({"jsonrpc": "2.0", "id": message["id"], "result": result})
            else:
                error = {"code": -32601, "message": f"not offered: {method}"}
                await self._send({"jsonrpc": "2.0", "id": message["id"], "error": error})
            return
        if method == "session/update" and self.on_update is not None:
            self.on_update(message.get("params", {}).get("update") or {})

    async def prompt(self, session_id: str, text: str) -> tuple[float | None, float]:
        """Send a prompt; returns (first text chunk, end of the turn) as clock() readings."""
        first: list[float] = []

        def update(update: dict[str, Any]) -> None:
            if update.get("sessionUpdate") == "agent_message_chunk" and not first:
                first.append(clock())

        self.on_update = update
        await self.request("session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]})
        return (first[0] if first else None), clock()


@asynccontextmanager
async def direct_agent(table_: dict[str, Any], cwd: Path) -> AsyncIterator[DirectAgent]:
    process = await trio.lowlevel.open_process(
        [table_["command"], *table_.get("args", [])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=_environment(table_.get("env") or {}),
        cwd=table_.get("cwd") or str(cwd),
        start_new_session=True,
    )
    agent = DirectAgent(process)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(agent.read)
            try:
                yield agent
            finally:
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            if process.returncode is None:
                os.killpg(process.pid, 15)
                with trio.move_on_after(5):
                    await process.wait()
            if process.returncode is None:
                os.killpg(process.pid, 9)
                await process.wait()


async def _open_direct(agent: DirectAgent, table_: dict[str, Any]) -> None:
    await agent.request(
        "initialize",
        # lmbridge's own capabilities, so the agent offers its model the same tools on both sides (Claude Code's
        # AskUserQuestion comes with elicitation: ~4.3 KB more in every request to the model).
        {
            "protocolVersion": 1,
            "clientCapabilities": CLIENT_CAPABILITIES,
            "clientInfo": {"name": "lmbridge-bench", "version": "1"},
        },
    )
    if table_.get("authenticate"):
        await agent.request("authenticate", {"methodId": table_["authenticate"]})


async def _new_session(agent: DirectAgent, table_: dict[str, Any], cwd: Path, tool_server: dict[str, Any]) -> Any:
    """``session/new``, then the table's ``options`` set as lmbridge sets them (only those that differ), so both
    sides run the agent alike (Claude Code's mode, for one)."""
    new = await agent.request("session/new", {"cwd": str(cwd), "mcpServers": [tool_server]})
    for key, value in options_to_set(new, (table_.get("options") or {}).items()):
        params = {"sessionId": new["sessionId"], "configId": key, "value": value}
        await agent.request("session/set_config_option", params)
    return new


# -- one round per side --------------------------------------------------------------------------------------------


class Round:
    """The fake model, the agent's files and the tool server of one agent's runs."""

    def __init__(self, kit: AgentKit, model: FakeModel, scratch: Path, tool_servers: dict[str, dict[str, Any]]) -> None:
        self.kit = kit
        self.model = model
        self.scratch = scratch
        self.tool_servers = tool_servers  # the direct side's, by baseline
        self._count = 0

    def table(self) -> tuple[dict[str, Any], Path]:
        self._count += 1
        base = self.scratch / f"run-{self._count}"
        home, project = base / "home", base / "project"
        home.mkdir(parents=True)
        project.mkdir()
        marker = f"bench-agents-{os.getpid()}-{self._count}"
        return self.kit.agent_table(model_url=self.model.base_url, home=home, project=project, marker=marker), project

    def _bridged_config(self, floor: str | None, transport: str | None, **keys: Any) -> tuple[Path, Path]:
        """A bridged run's config file and project: the agent's table with ``keys``, lmbridge's ``--agent-setting``s
        unless a floor serves it, and ``transport`` as its ``mcp_transport`` (``None``: as configured)."""
        table_, project = self.table()
        table_.update(keys)
        if floor is None:
            table_.update(BRIDGED_SETTINGS)
        if transport is not None:
            table_["mcp_transport"] = transport
        return write_config(project.parent / "lmbridge.toml", {self.kit.id: table_}), project

    def tool_turns(self, city: str) -> None:
        self.model.add(call(self.kit.editor_tool("get_weather", {"city": city})), say(f"Weather told for {city}."))

    def _request_sizes(self, samples: dict[str, list[float]], since: int) -> None:
        """The sizes of the model turns' requests since ``since``: equal on both sides when the agent runs alike."""
        turns = [r for r in self.model.requests[since:] if r.turn is not None]
        samples.setdefault(REQUEST_BYTES, []).extend(len(json.dumps(r.body)) for r in turns)

    async def direct(self, samples: dict[str, list[float]], baseline: str) -> None:
        tool_server = self.tool_servers[baseline]
        since = len(self.model.requests)
        table_, project = self.table()
        self.model.add(say("Hello there, ready."), say("Fine, thanks."))
        started = clock()
        async with direct_agent(table_, project) as agent:
            with trio.fail_after(STEP_TIMEOUT):
                await _open_direct(agent, table_)
                new = await _new_session(agent, table_, project, tool_server)
                first, _ = await agent.prompt(new["sessionId"], "Hello?")
            assert first is not None, "no text from the agent"
            samples["cold first chat"].append(first - started)
            with trio.fail_after(STEP_TIMEOUT):
                begun = clock()
                await agent.prompt(new["sessionId"], "How are you?")
                samples["text turn"].append(clock() - begun)
            later: list[float] = []
            for index, city in enumerate(("Paris", *LATER_CITIES)):
                self.tool_turns(city)
                with trio.fail_after(STEP_TIMEOUT):
                    begun = clock()
                    await agent.prompt(new["sessionId"], f"What is the weather in {city}?")
                    seconds = clock() - begun
                (later if index else samples["first tool turn"]).append(seconds)
            samples["later tool turn"].append(statistics.median(later))
        # prestart: the agent started and initialized, the user typed for TYPING as on the bridged sides (an agent
        # runs its next request at another speed after a pause than right after its start); a new chat
        table_, project = self.table()
        self.model.add(say("Ready when you are."))
        connected = trio.current_time()
        async with direct_agent(table_, project) as agent:
            with trio.fail_after(STEP_TIMEOUT):
                await _open_direct(agent, table_)
                await trio.sleep_until(connected + TYPING)  # what the scenario models, not a synchronisation
                begun = clock()
                new = await _new_session(agent, table_, project, tool_server)
                first, _ = await agent.prompt(new["sessionId"], "Are you there?")
            assert first is not None, "no text from the agent"
            samples["prestart chat"].append(first - begun)
        self._request_sizes(samples, since)

    async def bridged(
        self,
        samples: dict[str, list[float]],
        *,
        traced: Traced | None = None,
        floor: str | None = None,
        transport: str | None = None,
    ) -> None:
        """One run through lmbridge; ``traced``: with ``--trace-dir``, each figure's span noted for ``own_times``;
        ``floor``: through that floor instead (``FLOORS``); ``transport``: the agent's ``mcp_transport`` (``None``:
        as configured)."""
        since = len(self.model.requests)
        config, project = self._bridged_config(floor, transport)
        self.model.add(say("Hello there, ready."), say("Fine, thanks."))
        trace = traced.args() if traced is not None else ()

        def took(figure: str, begun: float, wall: float, ended: float) -> None:
            samples[figure].append(ended - begun)
            if traced is not None:
                traced.span(figure, wall, ended - begun)

        started = clock()
        async with _lmbridge(config, project, extra=trace, floor=floor, agent_id=self.kit.id) as (client, bridge_pid):
            assert client.connection is not None
            init = await client.connection.start_request(
                "initialize",
                {"protocolVersion": 1, "clientInfo": {"name": "lmbridge-bench", "version": "1"},
                 "workspaceFolders": [str(project)]},
            )  # fmt: skip
            tools = [WEATHER_TOOL]
            history: list[dict[str, Any]] = [_user("Hello?")]
            with trio.fail_after(STEP_TIMEOUT):
                first = await _first_text(client, self.kit.id, history, tools)
                samples["cold first chat"].append(first[0] - started)
                tools.append((await init.result())["permissionTool"])
                history.append(first[1])
            history.append(_user("How are you?"))
            with trio.fail_after(STEP_TIMEOUT):
                begun, wall = clock(), time.time()
                history += await _turn(client, self.kit.id, history, tools)
                took("text turn", begun, wall, clock())
            later: list[float] = []
            later_cpu: list[float] = []
            for index, city in enumerate(("Paris", *LATER_CITIES)):
                self.tool_turns(city)
                history.append(_user(f"What is the weather in {city}?"))
                with trio.fail_after(STEP_TIMEOUT):
                    cpu_before = cpu_ms(bridge_pid)
                    begun, wall = clock(), time.time()
                    added = await _turn(client, self.kit.id, history, tools)
                    ended = clock()
                    cpu = cpu_ms(bridge_pid) - cpu_before
                if not any(part.get("type") == "tool_call" for message in added for part in message["content"]):
                    # An agent that did not get the tool answers the model's call with an error, and its turn
                    # still ends with text: a tool turn that never reached the editor must not count as one.
                    raise RuntimeError(f"{self.kit.id}: the tool turn for {city} made no call to the editor's tool")
                history += added
                if index == 0:
                    took("first tool turn", begun, wall, ended)
                    continue
                later.append(ended - begun)
                later_cpu.append(cpu)
                if traced is not None:
                    traced.span("later tool turn", wall, ended - begun)
            samples["later tool turn"].append(statistics.median(later))
            samples.setdefault(BRIDGE_CPU, []).append(statistics.median(later_cpu))
        config, project = self._bridged_config(floor, transport, prestart=True)
        self.model.add(say("Ready when you are."))
        stderr = project.parent / "lmbridge.stderr"
        async with _lmbridge(config, project, stderr, extra=trace, floor=floor, agent_id=self.kit.id) as (client, _pid):
            with trio.fail_after(STEP_TIMEOUT):
                connected = trio.current_time()
                info = await client.initialize(workspaceFolders=[str(project)])
                # The prestarted agent answered initialize: a line in lmbridge's log, written by another process.
                while "agent ready" not in stderr.read_text():  # noqa: ASYNC110
                    await trio.sleep(0.01)
                await trio.sleep_until(connected + TYPING)  # what the scenario models, not a synchronisation
                begun, wall = clock(), time.time()
                first = await _first_text(
                    client, self.kit.id, [_user("Are you there?")], [WEATHER_TOOL, info["permissionTool"]]
                )
                took("prestart chat", begun, wall, first[0])
        self._request_sizes(samples, since)


def floor_launch(config: Path, agent_id: str) -> Path:
    """The launch file of ``bench/bare_floor.py`` beside ``config``: how lmbridge starts and sets up the agent
    ``agent_id``, read with lmbridge's own config code here, so that the floor itself needs none of it."""
    agent = load_config(config).agents[agent_id]
    launch = {
        "argv": list(agent.argv),
        "env": dict(agent.env),
        "unset_env": list(agent.unset_env),
        "cwd": agent.cwd,
        "authenticate": agent.authenticate,
        "options": [list(option) for option in agent.options],
        "prestart": agent.prestart,
        "transport": mcp_transport(agent),
    }
    path = config.with_suffix(".launch.json")
    path.touch(mode=0o600)  # the agent's environment may hold keys
    path.write_text(json.dumps(launch))
    return path


@asynccontextmanager
async def _lmbridge(
    config: Path,
    project: Path,
    stderr: Path | None = None,
    *,
    extra: tuple[str, ...] = (),
    floor: str | None = None,
    agent_id: str = "",
) -> AsyncIterator[tuple[EditorClient, int]]:
    """``lmbridge stdio`` serving ``config``'s agents (``floor``: that floor instead, ``FLOORS``, serving the agent
    ``agent_id``): its client and its process id."""
    log = open(stderr or os.devnull, "wb")  # noqa: SIM115 (closed below)
    try:
        env = with_bytecode_cache(_environment({"XDG_STATE_HOME": str(project.parent / "state")}))
        if LMBRIDGE_TREE is not None:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(LMBRIDGE_TREE), env.get("PYTHONPATH")]))
        command, args = None, ["--config", str(config), *extra]
        if floor == "parts":
            command = [sys.executable, TOOL_FLOOR]
        elif floor == "bare":
            command = [sys.executable, BARE_FLOOR]
            args = ["--launch", str(floor_launch(config, agent_id))]
        async with spawn_stdio(args, env=env, cwd=str(project), stderr=log, command=command) as (client, process):
            yield client, process.pid
    finally:
        log.close()


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "value": text}]}


async def _first_text(
    client: EditorClient, model: str, history: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> tuple[float, dict[str, Any]]:
    """Start a chat; returns when its first text part came, and (once it ended) the assistant message."""
    first: list[float] = []

    def part(part: dict[str, Any]) -> None:
        if part.get("type") == "text" and not first:
            first.append(clock())

    turn = await client.start_chat(model, history, tools=tools, on_part=part)
    result = await turn.result()
    if result.error is not None or not first:
        raise RuntimeError(f"lmbridge: {result.error or 'no text'}")
    return first[0], result.assistant_message()


async def _turn(
    client: EditorClient, model: str, history: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """One user turn to its end, the editor answering each tool call at once; returns the messages it added."""
    added: list[dict[str, Any]] = []
    while True:
        result = await client.chat(model, history + added, tools=tools)
        if result.error is not None:
            raise RuntimeError(f"lmbridge: {result.error}")
        added.append(result.assistant_message())
        if result.stop_reason != "tool_calls":
            return added
        answers = [
            {"type": "tool_result", "callId": c["callId"], "content": [{"type": "text", "value": WEATHER_ANSWER}]}
            for c in result.tool_calls
        ]
        added.append({"role": "user", "content": answers})


# -- the tool server of the direct side ----------------------------------------------------------------------------


BASELINES = {  # the direct side's tool server: what each baseline's rows are named
    "stdio": "an independent stdio MCP server",
    "http": "an independent HTTP MCP server",
    "same": "lmbridge's own MCP code over HTTP",
}
WEATHER_MCP = ROOT / "bench" / "weather_mcp.py"


@asynccontextmanager
async def tool_server(kind: str) -> AsyncIterator[dict[str, Any]]:
    """The ``mcpServers`` entry of the direct side's MCP server named ``editor``, with ``get_weather`` answering at
    once, while it runs: ``bench/weather_mcp.py`` (the agent starts it per session over stdio; over HTTP one process
    for the run), or lmbridge's own MCP endpoint in this process (``same``)."""
    if kind == "stdio":
        yield {"name": "editor", "command": sys.executable, "args": [str(WEATHER_MCP)], "env": []}
    elif kind == "http":
        process = await trio.lowlevel.open_process(
            [sys.executable, str(WEATHER_MCP), "--http"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert process.stdout is not None and process.stdin is not None
        try:
            with trio.fail_after(STEP_TIMEOUT):
                line = b""
                while not line.endswith(b"\n"):
                    data = await process.stdout.receive_some(4096)
                    if not data:
                        raise RuntimeError("bench/weather_mcp.py --http ended before it said where it listens")
                    line += data
            yield {"type": "http", "name": "editor", "url": json.loads(line)["url"], "headers": []}
        finally:
            with trio.CancelScope(shield=True):
                await process.stdin.aclose()  # its input ends: it stops
                with trio.move_on_after(5):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
                    await process.wait()
                await process.stdout.aclose()
    else:
        async with same_code_tool_server() as server:
            yield server


@asynccontextmanager
async def same_code_tool_server() -> AsyncIterator[dict[str, Any]]:
    """An MCP server named ``editor`` with ``get_weather`` on streamable HTTP in this process, answering at once."""
    from mcp_synthetic.http import HttpEndpoints, load_http
    from mcp_synthetic.server import SessionTools, load_sdk

    async def invoke(name: str, arguments: Any) -> Any:
        return {"content": [{"type": "text", "value": WEATHER_ANSWER}]}, ""  # as an editor's tool_result

    async def ready() -> None:
        pass

    load_sdk()
    load_http()
    log = QuietLog("tool server")
    tools = SessionTools(invoke, log=log)
    tools.update([WEATHER_TOOL])
    endpoints = HttpEndpoints(log, ready)
    async with trio.open_nursery() as nursery:
        await nursery.start(endpoints.run)
        url, _scope = endpoints.add(tools, "bench-token")
        yield {
            "type": "http",
            "name": "editor",
            "url": url,
            "headers": [{"name": "Authorization", "value": "Bearer bench-token"}],
        }
        nursery.cancel_scope.cancel()


# -- the run -------------------------------------------------------------------------------------------------------


class Traced:
    """A bridged run with ``--trace-dir``: the directory, and each figure's span (wall clock, as the traces)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.spans: list[tuple[str, float, float]] = []

    def args(self) -> tuple[str, ...]:
        return ("--trace-dir", str(self.directory))

    def span(self, figure: str, wall_start: float, seconds: float) -> None:
        self.spans.append((figure, wall_start, wall_start + seconds))


def own_times(traced: Traced) -> dict[str, list[float]]:
    """lmbridge's own time on each figure's path, in ms, from its wire traces: for every message it received, the
    time until the next message it sent, when it sent one before receiving another — what it spent turning what came
    in into what went out (the agent's, the editor's and the model's time are the gaps between). An upper bound: the
    traces' own writes (a write(2) per message, tens of microseconds each in the running daemon) are included —
    measured beside timestamps taken inside the daemon, a figure comes out up to 1.6 ms higher. A reply the bridge
    sends on a timer (a tool batch's idle window) counts from the message before it: time lmbridge made the user
    wait all the same."""
    events = [(float(r["ts"]), r["dir"] == "in", r["dir"] != "in") for r in _trace_records(traced)]
    return _span_sums(traced, events)


def editor_hops(traced: Traced) -> dict[str, list[float]]:
    """The editor's own time on each figure's path, in ms, from lmbridge's wire traces: from each answer to an
    ``lm/chat`` that ended with tool calls to the editor's next message — the editor running its tools and sending
    the next request (here: answering at once). The direct side has no such hop; it is in the paired figure of a
    tool turn, and neither lmbridge's own time nor the agent's."""
    events = []
    for record in _trace_records(traced):
        if record.get("conn") != "editor":
            continue
        result = (record.get("msg") or {}).get("result")
        asks = isinstance(result, dict) and result.get("stopReason") == "tool_calls"
        incoming = record["dir"] == "in"
        events.append((float(record["ts"]), asks and not incoming, incoming))
    return _span_sums(traced, events)


def _trace_records(traced: Traced) -> Iterator[dict[str, Any]]:
    for path in traced.directory.glob("*.ndjson"):
        with path.open("rb") as handle:
            for line in handle:
                yield json.loads(line)


def _span_sums(traced: Traced, events: list[tuple[float, bool, bool]]) -> dict[str, list[float]]:
    """Per figure, per span: the sum, in ms, of the times from an event that opens a wait to the next one that
    closes it (events are ``(time, opens, closes)``; a later opening restarts the wait)."""
    events.sort()
    sums: dict[str, list[float]] = {figure: [] for figure in OWN_FIGURES}
    for figure, start, end in traced.spans:
        spent, opened = 0.0, None
        for ts, opens, closes in events:
            if ts < start:
                continue
            if ts > end:
                break
            if closes and opened is not None:
                spent += ts - opened
                opened = None
            if opens:
                opened = ts
        sums[figure].append(spent * 1000)
    return sums


Samples = dict[str, list[float]]


class Measured(NamedTuple):
    direct: dict[str, Samples]  # by baseline: seconds per figure
    bridged: Samples  # over the first of ``transports`` (the verdicts')
    others: dict[str, Samples]  # over each other transport, in the same rounds
    own: Samples  # ms per figure, from the traced runs
    editor: Samples
    floors: dict[str, Samples]  # --floor: seconds per figure through each floor (FLOORS)


async def measure(
    agent: str,
    reps: int,
    scratch: Path,
    *,
    floors: tuple[str, ...] = (),
    baselines: tuple[str, ...] = ("stdio",),
    transports: tuple[str | None, ...] = (None,),
) -> Measured:
    """The paired runs (direct with each baseline's tool server, bridged over each of ``transports`` — ``None``:
    as configured — and through each of ``floors``, in turn first), then ``TRACED_RUNS`` traced bridged runs over the
    first transport for lmbridge's own time and the editor's."""
    direct: dict[str, Samples] = {baseline: {figure: [] for figure in FIGURES} for baseline in baselines}
    over: dict[str | None, Samples] = {transport: {figure: [] for figure in FIGURES} for transport in transports}
    bridged = over[transports[0]]
    floored: dict[str, Samples] = {kind: {figure: [] for figure in FIGURES} for kind in floors}
    own: Samples = {figure: [] for figure in OWN_FIGURES}
    editor: Samples = {figure: [] for figure in OWN_FIGURES}
    async with open_fake_model() as model, AsyncExitStack() as servers:
        started = {baseline: await servers.enter_async_context(tool_server(baseline)) for baseline in baselines}
        runs = Round(KITS[agent], model, scratch / agent, started)

        Run = Callable[[Samples], Awaitable[None]]
        sides: list[tuple[Run, Samples]] = [
            *((partial(runs.direct, baseline=baseline), direct[baseline]) for baseline in baselines),
            *((partial(runs.bridged, transport=transport), over[transport]) for transport in transports),
        ]
        sides += [(partial(runs.bridged, floor=kind, transport=transports[0]), floored[kind]) for kind in floors]
        for run, _ in sides:  # untimed: page cache, compile caches, the model
            await run({figure: [] for figure in FIGURES})
        orders = balanced_orders(len(sides))
        for rep in range(reps):
            for side in orders[rep % len(orders)]:
                run, samples = sides[side]
                await run(samples)
            print(f"  {agent}: {rep + 1}/{reps}", file=sys.stderr, flush=True)
        for index in range(TRACED_RUNS):  # apart from the paired runs: tracing costs time of its own
            traced = Traced(scratch / agent / f"trace-{index}")
            await runs.bridged({figure: [] for figure in FIGURES}, traced=traced, transport=transports[0])
            for figure, values in own_times(traced).items():
                own[figure] += values
            for figure, values in editor_hops(traced).items():
                editor[figure] += values
        if model.errors:
            raise RuntimeError(f"the fake model saw unscripted requests: {model.errors[:3]}")
    others = {
        transport: samples for transport, samples in over.items() if transport is not None and samples is not bridged
    }
    return Measured(direct, bridged, others, own, editor, floored)


def rows_for(
    agent: str,
    direct: dict[str, list[float]],
    bridged: dict[str, list[float]],
    own: dict[str, list[float]] | None = None,
    editor: dict[str, list[float]] | None = None,
    baseline: str = "stdio",
) -> list[Row]:
    """Each figure through lmbridge against the agent driven directly with ``baseline``'s tool server: the verdicts
    for the first baseline, the same rows named ``agent (baseline)`` for the others."""
    goals = {"first tool turn": 10.0, "later tool turn": 3.0, "cold first chat": 100.0, "prestart chat": 5.0}
    # The agent must run alike on both sides (the same tools and prompts to its model): its requests' sizes show it.
    sizes = {side: statistics.median(s[REQUEST_BYTES]) if s.get(REQUEST_BYTES) else 0.0 for side, s in
             (("direct", direct), ("lmbridge", bridged))}  # fmt: skip
    alike = abs(sizes["lmbridge"] - sizes["direct"]) <= 0.01 * max(sizes.values(), default=0.0)
    requests_note = (
        f"; the agent's requests to its model: median {sizes['direct'] / 1000:.1f} KB direct, "
        f"{sizes['lmbridge'] / 1000:.1f} KB through lmbridge"
        + ("" if alike else " — NOT ALIKE: the two sides configure the agent differently")
    )
    rows = []
    for figure in FIGURES:
        bridged_ms, direct_ms = [s * 1000 for s in bridged[figure]], [s * 1000 for s in direct[figure]]
        b, d = summarize(bridged_ms), summarize(direct_ms)
        added = {"median": b.median - d.median, "p99": (b.p99 or 0) - (d.p99 or 0)}
        estimate, low, high = shift(bridged_ms, direct_ms)
        goal = goals.get(figure)
        own_ms = (own or {}).get(figure) or []
        own_note = (
            f"; lmbridge's own time on the path {statistics.median(own_ms):.2f} ms (median of {len(own_ms)} traced "
            "runs: from each message it received to the one it sent because of it)"
            if own_ms
            else ""
        )
        editor_ms = (editor or {}).get(figure) or []
        if editor_ms and max(editor_ms) > 0:
            own_note += (
                f"; the editor's own hop on it (its tools run, its next request sent; the direct side has none) "
                f"{statistics.median(editor_ms):.2f} ms"
            )
        rows.append(
            Row(
                agent if baseline == "stdio" else f"{agent} ({baseline})",
                figure,
                "ms",
                b,
                d,
                f"{agent} driven directly over ACP, its tool from {BASELINES[baseline]}",
                goal=f"added ≤ {goal:g} ms" if goal is not None else "",
                passed=estimate <= goal if goal is not None else None,
                added=added,
                notes=f"{b.n} paired runs, alternating; added (Hodges-Lehmann, the verdict's figure) "
                f"{estimate:+.1f} ms, 90 % interval {low:+.1f} … {high:+.1f} ms{own_note}"
                + (requests_note if figure == FIGURES[0] or not alike else ""),
                extra={
                    "model_request_bytes": sizes,
                    "added_hodges_lehmann": {"estimate": estimate, "low": low, "high": high},
                    "samples": {"lmbridge": bridged_ms, "direct": direct_ms},
                    "own_ms": own_ms,
                    "editor_ms": editor_ms,
                },
            )
        )
    return rows


def transport_rows(agent: str, first: str, bridged: Samples, transport: str, other: Samples) -> list[Row]:
    """Each figure through lmbridge over ``transport`` against the same over ``first``, in the same rounds: which
    is faster for this agent (what ``mcp_transport = "auto"`` should give it)."""
    rows = []
    for figure in FIGURES:
        other_ms, first_ms = [s * 1000 for s in other[figure]], [s * 1000 for s in bridged[figure]]
        o, f = summarize(other_ms), summarize(first_ms)
        estimate, low, high = shift(other_ms, first_ms)
        rows.append(
            Row(
                f"{agent} over {transport}",
                figure,
                "ms",
                o,
                f,
                f"{agent} through lmbridge over {first}",
                added={"median": o.median - f.median, "p99": (o.p99 or 0) - (f.p99 or 0)},
                notes=f"{o.n} paired runs, alternating; difference (Hodges-Lehmann) {estimate:+.1f} ms, 90 % interval "
                f"{low:+.1f} … {high:+.1f} ms",
                extra={
                    "difference_hodges_lehmann": {"estimate": estimate, "low": low, "high": high},
                    "samples": {transport: other_ms, first: first_ms},
                },
            )
        )
    return rows


FLOOR_NAMES = {
    "bare": "bench/bare_floor.py (the standard library alone, no code of lmbridge's)",
    "parts": "bench/tool_floor.py (lmbridge's transports alone)",
}


def floor_rows(agent: str, kind: str, direct: Samples, floor: Samples, bridged: Samples) -> list[Row]:
    """The chats through the floor ``kind`` against the same direct runs, and lmbridge's distance above it."""
    goals = {"cold first chat": 100.0, "first tool turn": 10.0, "later tool turn": 3.0, "prestart chat": 5.0}
    sizes = {side: statistics.median(s[REQUEST_BYTES]) for side, s in (("direct", direct), ("floor", floor))}
    alike = abs(sizes["floor"] - sizes["direct"]) <= 0.01 * max(sizes.values())
    rows = []
    for figure in FLOOR_FIGURES[kind]:
        floor_ms, direct_ms = [s * 1000 for s in floor[figure]], [s * 1000 for s in direct[figure]]
        bridged_ms = [s * 1000 for s in bridged[figure]]
        f, d = summarize(floor_ms), summarize(direct_ms)
        estimate, low, high = shift(floor_ms, direct_ms)
        above, above_low, above_high = shift(bridged_ms, floor_ms)
        goal = goals.get(figure)
        cpu_note, cpu_extra = "", {}
        if figure == "later tool turn" and bridged.get(BRIDGE_CPU) and floor.get(BRIDGE_CPU):
            cpu = {side: statistics.median(s[BRIDGE_CPU]) for side, s in (("lmbridge", bridged), ("floor", floor))}
            cpu_note = f"; the bridge's CPU per later tool turn: lmbridge {cpu['lmbridge']:.2f} ms, "
            cpu_note += f"the floor {cpu['floor']:.2f}"
            cpu_extra = {"bridge_cpu_ms": {"lmbridge": bridged[BRIDGE_CPU], "floor": floor[BRIDGE_CPU]}}
        rows.append(
            Row(
                f"{agent} {kind} floor",
                figure,
                "ms",
                f,
                d,
                f"{agent} driven directly over ACP",
                goal=f"added ≤ {goal:g} ms" if goal is not None else "",
                passed=estimate <= goal if goal is not None else None,
                added={"median": f.median - d.median, "p99": (f.p99 or 0) - (d.p99 or 0)},
                notes=f"through {FLOOR_NAMES[kind]} in lmbridge's place, {f.n} runs "
                f"in the same rounds; added (Hodges-Lehmann) {estimate:+.1f} ms, 90 % interval {low:+.1f} … "
                f"{high:+.1f} ms; lmbridge above the floor {above:+.1f} ms [{above_low:+.1f} … {above_high:+.1f}]"
                + cpu_note
                + ("" if alike else f" — NOT ALIKE: the agent's requests to its model {sizes}"),
                extra={
                    **cpu_extra,
                    "model_request_bytes": sizes,
                    "added_hodges_lehmann": {"estimate": estimate, "low": low, "high": high},
                    "lmbridge_above_floor": {"estimate": above, "low": above_low, "high": above_high},
                    "samples": {"floor": floor_ms, "direct": direct_ms},
                },
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.agents", description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=10, help="paired runs per agent (default 10)")
    parser.add_argument("--agents", default=",".join(KITS), help="comma-separated (default: all)")
    parser.add_argument("--output", type=Path, default=RESULTS / "agents.json")
    parser.add_argument("--lmbridge-tree", type=Path, help="run lmbridge from this source tree (compare commits)")
    parser.add_argument(
        "--floor",
        nargs="?",
        const="bare",
        default="",
        help="also the chats through a floor in lmbridge's place: bare (the default: bench/bare_floor.py, the "
        "standard library alone), parts (bench/tool_floor.py, lmbridge's transports alone), or both: bare,parts",
    )
    parser.add_argument(
        "--mcp-transport",
        help="how lmbridge serves the editor's tools to the agent (the agent's mcp_transport: auto, http, stdio; "
        "default: as configured); several, comma-separated, run in the same rounds and the others are compared "
        "with the first",
    )
    parser.add_argument(
        "--baselines",
        default="stdio,same",
        help="the direct side's tool servers, the first the verdicts' (stdio, http, same; default stdio,same)",
    )
    parser.add_argument(
        "--agent-setting",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a key of the agent's table on lmbridge's side alone, VALUE in TOML (tool_batch_idle=0): what a "
        "setting changes, measured against the same direct side and floor; repeatable",
    )
    args = parser.parse_args(argv)
    for setting in args.agent_setting:
        key, _, value = (part.strip() for part in setting.partition("="))
        if key not in AgentConfig._fields or key in ("id", "command", "args", "env", "prestart", "mcp_transport"):
            parser.error(f"--agent-setting {setting!r}: KEY must be a key of an agent's table the runs do not set")
        try:
            BRIDGED_SETTINGS[key] = tomllib.loads(f"value = {value}")["value"]
        except tomllib.TOMLDecodeError as exc:
            parser.error(f"--agent-setting {setting!r}: KEY=VALUE with VALUE in TOML ({exc})")
    transports: tuple[str | None, ...] = (None,)
    if args.mcp_transport is not None:
        transports = tuple(t for t in args.mcp_transport.split(",") if t)
        if (
            not transports
            or any(t not in ("auto", "http", "stdio") for t in transports)
            or len(set(transports)) < len(transports)
        ):
            parser.error("--mcp-transport: one or more of auto, http, stdio, comma-separated, each once")
    floors = tuple(f for f in args.floor.split(",") if f)
    if any(f not in FLOORS for f in floors) or len(set(floors)) < len(floors):
        parser.error(f"--floor: one or more of {', '.join(FLOORS)}, comma-separated, each once")
    baselines = tuple(b for b in args.baselines.split(",") if b)
    if not baselines or any(b not in BASELINES for b in baselines):
        parser.error(f"--baselines: a comma-separated list of {', '.join(BASELINES)}")
    if args.lmbridge_tree is not None:
        if not (args.lmbridge_tree / "bridge" / "__main__.py").is_file():
            parser.error(f"{args.lmbridge_tree} is not an lmbridge source tree (no bridge/__main__.py)")
        global LMBRIDGE_TREE
        LMBRIDGE_TREE = args.lmbridge_tree.resolve()
    agents = [a for a in args.agents.split(",") if a]
    unknown = [a for a in agents if a not in KITS]
    if unknown:
        parser.error(f"unknown agent(s) {', '.join(unknown)}; known: {', '.join(KITS)}")

    def rows_of(agent: str, scratch: Path) -> list[Row]:
        run = partial(measure, agent, args.reps, scratch, floors=floors, baselines=baselines, transports=transports)
        measured = trio.run(run)
        rows = []
        for baseline in baselines:
            rows += rows_for(
                agent, measured.direct[baseline], measured.bridged, measured.own, measured.editor, baseline
            )
        for transport, samples in measured.others.items():
            rows += transport_rows(agent, str(transports[0]), measured.bridged, transport, samples)
        for kind, samples in measured.floors.items():
            rows += floor_rows(agent, kind, measured.direct[baselines[0]], samples, measured.bridged)
        return rows

    return run_agents(agents, rows_of, reps=args.reps, output=args.output)


def run_agents(agents: list[str], rows_of: Callable[[str, Path], list[Row]], *, reps: int, output: Path) -> int:
    """Install the agents, measure each (``rows_of(agent, scratch)``; one that fails is reported and the others run
    on), print the table and write the report: the exit status (2 when npm is missing or an agent failed)."""
    problem = npm_missing()
    if problem:
        print(f"bench-agents: {problem}", file=sys.stderr)
        return 2
    ensure_installed(agents)
    started = time.monotonic()
    rows: list[Row] = []
    errors: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="lmbridge-bench-agents-") as scratch:
        for agent in agents:
            print(f"running {agent} …", file=sys.stderr, flush=True)
            try:
                rows += rows_of(agent, Path(scratch))
            except Exception as exc:
                errors[agent] = f"{type(exc).__name__}: {exc}"
                print(f"  {agent} FAILED: {errors[agent]}", file=sys.stderr)
    return write_report(rows, errors, reps=reps, started=started, output=output)


def write_report(rows: list[Row], errors: dict[str, str], *, reps: int, started: float, output: Path) -> int:
    """Print the table and write the JSON report; the exit status (2 when an agent failed)."""
    text = table(rows)
    print(text)
    report = {
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "seconds": round(time.monotonic() - started, 1),
        "reps": reps,
        "rows": [row.to_json() for row in rows],
        "errors": errors,
        "table": text,
    }
    if BRIDGED_SETTINGS:
        report["agent_settings"] = BRIDGED_SETTINGS  # --agent-setting: on lmbridge's side alone
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=1))
    print(f"written: {output}", file=sys.stderr)
    return 2 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
