"""Agents on the editor's models (``make bench-agents``, its last rows): what lmbridge adds to each model request
of an agent that thinks with a model the editor shares (``model_source = "editor"``), against the same agent whose
model is served directly.

Both sides run the agent through ``lmbridge stdio`` with the same scripted conversation (a text turn, then a tool
turn and five later ones, each with a call of the editor's tool), and the model answers at once from the same script:

- model served directly: the agent's model API points at the interop suite's fake model (HTTP on 127.0.0.1);
- the editor's model: the agent's requests go to lmbridge's route, which asks the editor (``editor/chat`` over the
  stdio pipe); the editor is this process and answers from the script at once, without another HTTP hop.

Paired runs, the side that goes first alternating. Figures: each turn's time on both sides; what the editor path
adds to a model request is the Hodges-Lehmann shift of the later tool turns divided by the model requests such a
turn makes (counted on both sides: they must agree), and the same for the text turn. A turn's time also holds the
agent's own work between its requests, which moves by more than lmbridge's share (Claude Code orders a title
request before or after a tool call, at random), so the request alone is measured too: the agent's last model
request, replayed ``--replays`` times over one keep-alive connection to the fake model and to a route lmbridge
opened for the demo agent, alternating (the same body; the editor answers at once from this process). Then
lmbridge's resident memory over ``--memory-requests`` model requests on the editor path (one conversation, text
turns): growth per request.

    python -m bench.agents_on_editor [--reps 5] [--agents claude,codex,opencode] [--replays 200]
                                     [--memory-requests 200]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import trio

from bench.agents import STEP_TIMEOUT, WEATHER_TOOL, _lmbridge, _turn, _user, run_agents
from bench.common import RESULTS, Row, rss_kib, shift, summarize
from bench.wire import ROOT

sys.path.insert(0, str(ROOT / "tests"))

from interop.kits import KITS, write_config

from bridge.fakemodel.server import Call, FakeModel, ModelRequest, Text, Turn, call, open_fake_model, say
from bridge.service.editor_models import SYSTEM_MARKER

AGENTS = ("claude", "codex", "opencode")  # those whose model API lmbridge serves (docs/agents.md)
EDITOR_MODEL = {
    "id": "bench-model",
    "name": "Benchmark model",
    "vendor": "bench",
    "maxInputTokens": 1_000_000,
    "maxOutputTokens": 32_000,
    "capabilities": {"toolCalling": True, "imageInput": True},
}
CITIES = ("Paris", "Oslo", "Lima", "Cairo", "Quito", "Hanoi")  # the first tool turn, then the later ones
# Model requests an agent makes for itself, recognised by their system prompt (as the fake model does).
_CHORES = {"You are naming a coding session": "Bench session title"}
clock = time.perf_counter
Samples = dict[str, list[float]]


class ScriptedEditor:
    """The editor's model: answers each ``editor/chat`` from the script at once (text parts, tool calls named as the
    agent offered them), counting the calls."""

    def __init__(self) -> None:
        self.script: list[Turn] = []
        self.calls = 0
        self.errors: list[str] = []

    async def answer(self, params: dict[str, Any], send_part: Any, cancel: Any) -> dict[str, Any]:
        messages = params.get("messages") or []
        first = json.dumps(messages[0]) if messages else ""
        chore = next((text for marker, text in _CHORES.items() if SYSTEM_MARKER in first and marker in first), None)
        if chore is not None:
            await send_part({"type": "text", "value": chore})
            return {"stopReason": "end_turn"}
        self.calls += 1
        if not self.script:
            self.errors.append(f"unscripted editor/chat #{self.calls}")
            await send_part({"type": "text", "value": "(no script)"})
            return {"stopReason": "end_turn"}
        turn = self.script.pop(0)
        offered = [tool["name"] for tool in (params.get("options") or {}).get("tools") or ()]
        calls = 0
        for item in turn.items:
            if isinstance(item, Text):
                await send_part({"type": "text", "value": item.text})
            else:
                calls += 1
                name = _offered(item, offered)
                await send_part({"type": "tool_call", "callId": f"call_{self.calls}_{calls}", "name": name,
                                 "input": item.arguments})  # fmt: skip
        return {"stopReason": "tool_calls" if calls else "end_turn", "usage": {"inputTokens": 1, "outputTokens": 1}}


def _offered(item: Call, offered: list[str]) -> str:
    """The tool's name as the agent offered it (Codex's namespace tools arrive joined: ``mcp__editor__x``)."""
    return next((n for n in offered if n == item.name or n.endswith(("__" + item.name, "_" + item.name))), item.name)


class Sides:
    """The fake model, the scripted editor and the agent's files of one agent's runs."""

    def __init__(self, agent: str, model: FakeModel, editor: ScriptedEditor, scratch: Path) -> None:
        self.kit = KITS[agent]
        self.model = model
        self.editor = editor
        self.scratch = scratch
        self._count = 0

    def _config(self, on_editor: bool) -> tuple[Path, Path]:
        self._count += 1
        base = self.scratch / f"run-{self._count}"
        home, project = base / "home", base / "project"
        home.mkdir(parents=True)
        project.mkdir()
        marker = f"bench-editor-{os.getpid()}-{self._count}"
        table_ = self.kit.agent_table(model_url=self.model.base_url, home=home, project=project, marker=marker)
        if on_editor:
            table_["model_source"] = f"editor:{EDITOR_MODEL['id']}"
        return write_config(base / "lmbridge.toml", {self.kit.id: table_}), project

    def _script(self, on_editor: bool, *turns: Turn) -> None:
        (self.editor.script if on_editor else self.model.script).extend(turns)

    def _requests(self, on_editor: bool) -> int:
        return self.editor.calls if on_editor else len(self.model.turns)

    async def run(self, on_editor: bool, samples: Samples) -> None:
        config, project = self._config(on_editor)
        self._script(on_editor, say("Hello there, ready."), say("Fine, thanks."))
        async with _lmbridge(config, project) as (client, _pid):
            client.serve_models(self.editor.answer)  # shared on both sides: the agent gets the same tools
            await client.initialize(workspaceFolders=[str(project)], editorModels=[EDITOR_MODEL])
            tools = [WEATHER_TOOL]
            history = [_user("Hello?")]
            with trio.fail_after(STEP_TIMEOUT):
                history += await _turn(client, self.kit.id, history, tools)
                history.append(_user("How are you?"))
                before, begun = self._requests(on_editor), clock()
                history += await _turn(client, self.kit.id, history, tools)
                samples["text turn"].append(clock() - begun)
                samples["requests per text turn"].append(self._requests(on_editor) - before)
            later: list[float] = []
            for index, city in enumerate(CITIES):
                self._script(on_editor, call(self.kit.editor_tool("get_weather", {"city": city})), say(f"Told {city}."))
                history.append(_user(f"What is the weather in {city}?"))
                with trio.fail_after(STEP_TIMEOUT):
                    before, begun = self._requests(on_editor), clock()
                    history += await _turn(client, self.kit.id, history, tools)
                    seconds = clock() - begun
                if index == 0:
                    samples["first tool turn"].append(seconds)
                    continue
                later.append(seconds)
                samples["requests per tool turn"].append(self._requests(on_editor) - before)
            samples["later tool turn"].append(statistics.median(later))

    async def memory(self, requests: int) -> tuple[int, int, int]:
        """lmbridge's RSS (KiB) after the first 20 model requests on the editor path and after ``requests``, and the
        size (bytes) of the last request's messages as the editor got them."""
        config, project = self._config(True)
        sizes: list[int] = []

        async def answer(params: dict[str, Any], send_part: Any, cancel: Any) -> dict[str, Any]:
            sizes.append(len(json.dumps(params["messages"])))
            return await self.editor.answer(params, send_part, cancel)

        async with _lmbridge(config, project) as (client, pid):
            client.serve_models(answer)
            await client.initialize(workspaceFolders=[str(project)], editorModels=[EDITOR_MODEL])
            history: list[dict[str, Any]] = []
            first = 0
            for number in range(requests):
                self.editor.script.append(say(f"Answer {number}: " + "words of an answer " * 20))
                history.append(_user(f"Question {number}: " + "a line of the question " * 20))
                with trio.fail_after(STEP_TIMEOUT):
                    history += await _turn(client, self.kit.id, history, [WEATHER_TOOL])
                if number == 19:
                    first = rss_kib(pid)
            last = rss_kib(pid)
        return first, last, sizes[-1] if sizes else 0


# -- the request alone ---------------------------------------------------------------------------------------------


_HOSTED = {"web_search", "file_search", "computer_use_preview", "image_generation", "code_interpreter"}


def _replayable(request: ModelRequest) -> tuple[str, dict[str, str], bytes]:
    """The agent's request as both sides take it: its path, API headers and body (hosted tools, which only its own
    provider runs and the recipe switches off on the route, left out)."""
    body = dict(request.body or {})
    if isinstance(body.get("tools"), list):
        body["tools"] = [t for t in body["tools"] if not (isinstance(t, dict) and t.get("type") in _HOSTED)]
    headers = {"content-type": "application/json"}
    headers.update({k: v for k, v in request.headers.items() if k in ("anthropic-version", "anthropic-beta")})
    return request.path, headers, json.dumps(body).encode()


class _Replayer:
    """One keep-alive connection that sends the same request again and again (in a worker thread: both servers run
    on this process's event loop); each call's time is request written → response read to its end."""

    def __init__(self, base_url: str, path: str, headers: dict[str, str], body: bytes) -> None:
        url = urlsplit(base_url)
        self._connection = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=STEP_TIMEOUT)
        self._path, self._headers, self._body = url.path.rstrip("/") + path, headers, body

    def once(self) -> float:
        begun = clock()
        self._connection.request("POST", self._path, self._body, self._headers)
        response = self._connection.getresponse()
        answer = response.read()
        if response.status != 200:
            raise RuntimeError(f"replayed model request: {response.status} {answer[:300]!r}")
        return clock() - begun

    def close(self) -> None:
        self._connection.close()


async def replay(request: ModelRequest, model: FakeModel, count: int, scratch: Path) -> Samples:
    """The agent's ``request`` replayed ``count`` times to each side, alternating (ms a request)."""
    scratch.mkdir(parents=True, exist_ok=True)
    project = scratch / "project"
    project.mkdir(exist_ok=True)
    config = scratch / "lmbridge.toml"
    config.write_text(
        f'[agents.replayer]\ncommand = {json.dumps(sys.executable)}\nargs = ["-m", "bridge.demo"]\n'
        f'model_source = "editor:{EDITOR_MODEL["id"]}"\n'
    )
    path, headers, body = _replayable(request)
    answer_text = "Told Paris."

    async def answer(params: dict[str, Any], send_part: Any, cancel: Any) -> dict[str, Any]:
        await send_part({"type": "text", "value": answer_text})
        return {"stopReason": "end_turn", "usage": {"inputTokens": 1, "outputTokens": 1}}

    async def env(client: Any, name: str) -> str:
        result = await client.chat("replayer", [_user(f"/env {name}")])
        return "".join(p.get("value", "") for p in result.parts if p.get("type") == "text").strip().partition("=")[2]

    samples: Samples = {"route": [], "direct": []}
    default, model.default = model.default, say(answer_text)
    try:
        async with _lmbridge(config, project) as (client, _pid):
            client.serve_models(answer)
            await client.initialize(workspaceFolders=[str(project)], editorModels=[EDITOR_MODEL])
            with trio.fail_after(STEP_TIMEOUT):
                route, token = await env(client, "LMBRIDGE_MODEL_BASE_URL"), await env(client, "LMBRIDGE_MODEL_TOKEN")
            keys = {"x-api-key": token, "authorization": f"Bearer {token}"}
            sides = {
                "route": _Replayer(route, path, {**headers, **keys}, body),
                "direct": _Replayer(model.base_url, path, {**headers, "x-api-key": "bench"}, body),
            }
            try:
                for number in range(count + 10):  # the first ten warm both up
                    for side in ("route", "direct") if number % 2 else ("direct", "route"):
                        seconds = await trio.to_thread.run_sync(sides[side].once)
                        if number >= 10:
                            samples[side].append(seconds * 1000)
            finally:
                for side in sides.values():
                    side.close()
    finally:
        model.default = default
    return samples


async def measure(
    agent: str, reps: int, memory_requests: int, scratch: Path, replays: int = 0
) -> tuple[Samples, Samples, Any, Samples | None, int]:
    figures = ("text turn", "first tool turn", "later tool turn", "requests per text turn", "requests per tool turn")
    direct: Samples = {f: [] for f in figures}
    editor_path: Samples = {f: [] for f in figures}
    editor = ScriptedEditor()
    async with open_fake_model() as model:
        sides = Sides(agent, model, editor, scratch / agent)
        for on_editor in (False, True):  # untimed: page cache, compile caches
            await sides.run(on_editor, {f: [] for f in figures})
        for rep in range(reps):
            order = (False, True) if rep % 2 == 0 else (True, False)
            for on_editor in order:
                await sides.run(on_editor, editor_path if on_editor else direct)
            print(f"  {agent}: {rep + 1}/{reps}", file=sys.stderr, flush=True)
        memory = await sides.memory(memory_requests) if memory_requests else None
        if model.errors or editor.errors:
            raise RuntimeError(f"unscripted model requests: {(model.errors + editor.errors)[:3]}")
        last = model.turns[-1]
        alone = await replay(last, model, replays, scratch / agent / "replay") if replays else None
    return direct, editor_path, memory, alone, len(json.dumps(last.body))


def rows_for(
    agent: str, direct: Samples, editor: Samples, memory: Any, memory_requests: int, alone: Samples | None = None,
    request_bytes: int = 0,
) -> list[Row]:  # fmt: skip
    rows = []
    if alone is not None:
        estimate, low, high = shift(alone["route"], alone["direct"])
        b, d = summarize(alone["route"]), summarize(alone["direct"])
        rows.append(
            Row(
                f"{agent} on the editor's model",
                "its model request alone: added",
                "ms",
                b,
                d,
                "the same request to the fake model directly",
                goal="added ≤ 3 ms per model request",
                passed=estimate <= 3.0,
                added={"median": b.median - d.median, "p99": (b.p99 or 0) - (d.p99 or 0)},
                notes=f"{agent}'s last model request ({request_bytes / 1000:.0f} KB) replayed {b.n} times a side, "
                f"alternating, over one keep-alive connection each: shift (Hodges-Lehmann) {estimate:+.2f} ms "
                f"[{low:+.2f} … {high:+.2f}]; the editor answers at once in the benchmark's process",
                extra={
                    "added_hodges_lehmann": {"estimate": estimate, "low": low, "high": high},
                    "request_bytes": request_bytes,
                },
            )
        )
    for figure, per in (("text turn", "requests per text turn"), ("later tool turn", "requests per tool turn")):
        on_editor, served = [s * 1000 for s in editor[figure]], [s * 1000 for s in direct[figure]]
        estimate, low, high = shift(on_editor, served)
        requests = {"direct": statistics.median(direct[per]), "editor": statistics.median(editor[per])}
        count = max(requests["editor"], 1)
        per_request = estimate / count
        b, d = summarize(on_editor), summarize(served)
        rows.append(
            Row(
                f"{agent} on the editor's model",
                f"{figure}: added per model request",
                "ms",
                b,
                d,
                f"{agent} through lmbridge, its model served directly",
                goal="added ≤ 3 ms per model request",
                passed=per_request <= 3.0,
                added={"median": b.median - d.median, "p99": (b.p99 or 0) - (d.p99 or 0)},
                notes=f"{b.n} paired runs; the turn's shift (Hodges-Lehmann) {estimate:+.2f} ms [{low:+.2f} … "
                f"{high:+.2f}] over {requests['editor']:g} model requests a turn (direct: {requests['direct']:g}): "
                f"{per_request:+.2f} ms per request"
                + ("" if requests["direct"] == requests["editor"] else " — NOT ALIKE: the request counts differ"),
                extra={
                    "added_per_request_ms": per_request,
                    "added_hodges_lehmann": {"estimate": estimate, "low": low, "high": high},
                    "requests_per_turn": requests,
                    "samples": {"editor": on_editor, "direct": served},
                },
            )
        )
    if memory is not None:
        first, last, size = memory
        growth = (last - first) / max(memory_requests - 20, 1)
        rows.append(
            Row(
                f"{agent} on the editor's model",
                f"lmbridge RSS growth per model request ({memory_requests} requests)",
                "KiB",
                summarize([growth], p99=False),
                None,
                "",
                notes=f"RSS {first / 1024:.1f} MiB after 20 requests, {last / 1024:.1f} MiB after {memory_requests}; "
                f"the last request's messages {size / 1000:.0f} KB as the editor got them",
                extra={"rss_kib": {"after_20": first, "after_all": last}, "last_request_bytes": size},
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.agents_on_editor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5, help="paired runs per agent (default 5)")
    parser.add_argument("--agents", default=",".join(AGENTS), help=f"comma-separated (default: {','.join(AGENTS)})")
    parser.add_argument("--memory-requests", type=int, default=200, help="model requests of the memory run (0: none)")
    parser.add_argument("--replays", type=int, default=200, help="replays a side of the request alone (0: none)")
    parser.add_argument("--output", type=Path, default=RESULTS / "agents_on_editor.json")
    args = parser.parse_args(argv)
    agents = [a for a in args.agents.split(",") if a]
    unknown = [a for a in agents if a not in AGENTS]
    if unknown:
        parser.error(f"unknown agent(s) {', '.join(unknown)}; lmbridge serves the model APIs of {', '.join(AGENTS)}")
    if args.memory_requests and args.memory_requests <= 20:
        parser.error("--memory-requests must be over 20 (the first 20 are the baseline) or 0")

    def rows_of(agent: str, scratch: Path) -> list[Row]:
        direct, editor, memory, alone, size = trio.run(
            partial(measure, agent, args.reps, args.memory_requests, scratch, args.replays)
        )
        return rows_for(agent, direct, editor, memory, args.memory_requests, alone, size)

    return run_agents(agents, rows_of, reps=args.reps, output=args.output)


if __name__ == "__main__":
    sys.exit(main())
