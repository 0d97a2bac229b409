"""The floor of the tool round trip: lmbridge's own transports with nothing between them.

It stands where ``lmbridge stdio`` stands in the tool benchmark — the bench editor on its stdin/stdout, the bench agent
as its child over ACP, the agent's MCP calls coming in over streamable HTTP — and is built from the same parts: the
JSON-RPC engine (``wire.rpc.connection``, with the editor connection's history-reusing parser) on both stdio links, and
the MCP endpoint (``mcp_synthetic.http`` on ``wire.h11_server``, ``SessionTools``) for the calls. What it leaves out is
everything that makes lmbridge a bridge: no routing or history matching, no session actor or state machine, no
permission flow, batching, checks of the editor's messages, logging or cancel paths. It serves exactly the conversations
of ``bench.benchmarks._bridged_tool_timings`` (one prompt, then tool results answering one call at a time) and nothing
else — and, with ``--config FILE``, those of ``make bench-agents``' chats (``python -m bench.agents --floor``) with a
real agent of an lmbridge config: the agent the first chat names, started then (or when the editor connects, if the
config says ``prestart``) and set up as lmbridge sets it up (its environment, ``authenticate``, the config's session
options), the editor's tools offered over MCP, each later prompt of the conversation sent to the same session, every
permission request allowed.

So the tool round trip measured through it is what the hops themselves cost on this machine (Python, Trio, two
pipes, the loopback socket, the bench editor's own work): the part of lmbridge's overhead that no change to
lmbridge's logic could remove. ``python bench/tool_floor.py [--relay] AGENT_ARGV...`` runs AGENT_ARGV as the
agent; ``python bench/tool_floor.py --config FILE`` an agent of that config.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import QuietLog, options_to_set
from bench.mcp_server import ECHO_TOOL
from bridge.acp.handshake import CLIENT_CAPABILITIES
from bridge.acp.spawn import spawn_options
from bridge.config import AgentConfig, load_config
from bridge.editor.history_parse import HistoryReusingParser
from mcp_synthetic.http import HttpEndpoints
from mcp_synthetic.server import SessionTools, load_sdk
from mcp_synthetic.stdio import serve_stdio
from mcp_synthetic.validation import warm_up_schemas
from mcp_synthetic.wiring import HANDSHAKE, SHIM_PATH, _Prefixed
from session.permissions import permission_tool_schema
from wire.rpc.connection import ACP_CANCEL, EDITOR_CANCEL, JsonRpcConnection, MethodTable, StreamWire

PERMISSION_TOOL = permission_tool_schema()


class _Turn:
    """One ``lm/chat`` being answered: its parts go out as ``lm/part``; ``done`` ends it with ``stop``."""

    def __init__(self, request_id: Any) -> None:
        self.request_id = request_id
        self.done = trio.Event()
        self.stop = "end_turn"


class Floor:
    """The editor link, the agent link and the MCP endpoint, wired to each other directly (see the module)."""

    def __init__(
        self, agent_argv: list[str], *, relay: bool = False, agents: dict[str, AgentConfig] | None = None
    ) -> None:
        self.agent_argv = agent_argv
        self.relay = relay
        self.agents = agents  # --config: the agent is the first chat's, started then (or at initialize: prestart)
        self.started: trio.Event | None = None  # --config: set once the agent's start ended, however it ended
        self.ready = False  # --config: the agent answered initialize (and authenticate)
        self.config: AgentConfig | None = None
        self.process: trio.Process | None = None
        self.session_id: str | None = None
        self.tools: SessionTools | None = None
        self.socket_dir = tempfile.mkdtemp(prefix="lmbridge-floor-")  # 0700
        self.nursery: trio.Nursery | None = None
        self.editor: JsonRpcConnection | None = None
        self.agent: JsonRpcConnection | None = None
        ready = self._sdk_ready if agents is not None else self._loaded
        self.endpoints = HttpEndpoints(QuietLog("tool floor"), ready, self._loaded)
        self.turn: _Turn | None = None
        self.waiting: tuple[trio.Event, list[Any]] | None = None  # the agent's call waiting for the editor's result
        self.calls = 0

    @staticmethod
    async def _loaded() -> None:
        pass  # mcp_synthetic.http imported its HTTP server already

    @staticmethod
    async def _sdk_ready() -> None:
        """--config: the MCP SDK, imported only when an agent's MCP client asks what the endpoint leaves to it."""
        await trio.to_thread.run_sync(load_sdk)

    async def _load_in_background(self) -> None:
        """--config: what lmbridge loads while the editor connects and its agent starts: the schema checker and the
        HTTP server (the SDK only if a request needs it, as lmbridge). Done before the floor served its editor, it
        made a prestarted agent wait idle for ~0.6 s less than behind lmbridge, and agents run their next request
        slower after a pause (Codex's session/new: 21 against 38 ms); the SDK imported in the background made the
        turns right after a cold first chat 15 – 21 ms slower."""
        await trio.to_thread.run_sync(warm_up_schemas)

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            if self.agents is not None:
                nursery.start_soon(self._load_in_background)
            await nursery.start(self.endpoints.run)
            if self.agents is None:
                options = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE}
                await self._start_agent(self.agent_argv, options, {"protocolVersion": 1, "clientCapabilities": {}})

            editor_methods = MethodTable()
            editor_methods.request("initialize", self._initialize, inline=True)
            editor_methods.request("lm/chat", self._chat)
            self.editor = JsonRpcConnection(
                StreamWire(trio.lowlevel.FdStream(os.dup(0)), trio.lowlevel.FdStream(os.dup(1))),
                editor_methods,
                name="editor",
                cancel_style=EDITOR_CANCEL,
                parse=HistoryReusingParser(),
            )
            await nursery.start(self.editor.serve)
            try:
                await self.editor.peer_closed.wait()
            finally:
                if self.process is not None:
                    if self.agents is None:
                        self.process.kill()
                    else:  # the agent's whole process group, as lmbridge stops it
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(self.process.pid, signal.SIGKILL)
                    with trio.CancelScope(shield=True):
                        await self.process.wait()
                shutil.rmtree(self.socket_dir, ignore_errors=True)
            nursery.cancel_scope.cancel()

    async def _start_agent(self, argv: list[str], options: dict[str, Any], initialize: dict[str, Any]) -> None:
        assert self.nursery is not None
        process = self.process = await trio.lowlevel.open_process(argv, **options)
        assert process.stdin is not None and process.stdout is not None
        agent_methods = MethodTable()
        agent_methods.notification("session/update", self._on_update, batch=True)
        agent_methods.request("session/request_permission", self._allow)
        self.agent = JsonRpcConnection(
            StreamWire(process.stdout, process.stdin), agent_methods, name="agent", cancel_style=ACP_CANCEL
        )
        await self.nursery.start(self.agent.serve)
        await self.agent.request("initialize", initialize)

    async def _agent_for(self, model_id: str) -> None:
        """--config: the agent a chat names, started by the first chat or the editor's connection (prestart). Returns
        at once (no checkpoint) when it runs; raises for every chat if its start failed."""
        if self.started is None:
            self.started = trio.Event()
            try:
                await self._start_configured(model_id)
                self.ready = True
            finally:
                self.started.set()  # those waiting find out below; nothing waits for a start that ended
        elif not self.started.is_set():
            await self.started.wait()
        if not self.ready:
            raise RuntimeError(f"the agent of {model_id!r} did not start")

    async def _prestart(self, agent_id: str) -> None:
        await self._agent_for(agent_id)
        print("agent ready", file=sys.stderr, flush=True)  # what make bench-agents waits for, as in lmbridge's log

    async def _start_configured(self, model_id: str) -> None:
        assert self.agents is not None
        config = self.config = self.agents[model_id.partition("/")[0]]
        options = {**spawn_options(config), "stderr": subprocess.DEVNULL}
        initialize = {
            "protocolVersion": 1,
            "clientCapabilities": CLIENT_CAPABILITIES,
            "clientInfo": {"name": "lmbridge", "version": "floor"},
        }
        await self._start_agent(config.argv, options, initialize)
        if config.authenticate:
            assert self.agent is not None
            await self.agent.request("authenticate", {"methodId": config.authenticate})

    async def _allow(self, params: Any, context: Any) -> dict[str, Any]:
        options = params["options"]
        chosen = next((o for o in options if o.get("kind") == "allow_once"), options[0])
        return {"outcome": {"outcome": "selected", "optionId": chosen["optionId"]}}

    async def _initialize(self, params: Any, context: Any) -> dict[str, Any]:
        prestarted = [config.id for config in (self.agents or {}).values() if config.prestart]
        if prestarted:
            assert self.nursery is not None
            self.nursery.start_soon(self._prestart, prestarted[0])
        return {
            "protocolVersion": 1,
            "serverInfo": {"name": "tool-floor", "version": "1"},
            "models": [],
            "permissionTool": PERMISSION_TOOL,  # offered by editors with their tools, as lmbridge asks
        }

    async def _chat(self, params: Any, context: Any) -> dict[str, Any]:
        turn = self.turn = _Turn(context.id)
        messages = params["messages"]
        last = messages[-1]["content"]
        results = [part for part in last if part.get("type") == "tool_result"]
        if results and self.waiting is not None:
            (answered, holder), self.waiting = self.waiting, None
            holder.append(results[0])
            answered.set()
        else:
            if self.agents is not None:
                await self._agent_for(params["modelId"])
            offered = [ECHO_TOOL]
            if self.agents is not None:  # the editor's tools, minus lmbridge's permission tool, as lmbridge offers
                tools = (params.get("options") or {}).get("tools") or ()
                offered = [t for t in tools if t["name"] != PERMISSION_TOOL["name"]]
            if len(messages) == 1 or self.session_id is None:  # a new conversation: a session and its MCP route
                await self._new_session(offered)
            else:
                assert self.tools is not None
                self.tools.update(offered)
            assert self.agent is not None
            text = "".join(part.get("value", "") for part in last if part.get("type") == "text")
            prompt = self.agent.start_request_nowait(
                "session/prompt", {"sessionId": self.session_id, "prompt": [{"type": "text", "text": text}]}
            )
            prompt.on_answer(lambda result, error: self._finished())
        await turn.done.wait()
        return {"stopReason": turn.stop}

    async def _new_session(self, offered: list[dict[str, Any]]) -> None:
        assert self.agent is not None
        token = secrets.token_urlsafe(16)
        tools = self.tools = SessionTools(self._invoke, log=QuietLog("tool floor"))
        tools.update(offered)
        server = await self._relay(tools, token) if self.relay else self._http(tools, token)
        cwd = (self.config.cwd if self.config is not None else None) or os.getcwd()
        session = await self.agent.request("session/new", {"cwd": cwd, "mcpServers": [server]})
        self.session_id = session["sessionId"]
        for key, value in options_to_set(session, self.config.options if self.config is not None else ()):
            params = {"sessionId": self.session_id, "configId": key, "value": value}
            await self.agent.request("session/set_config_option", params)

    def _http(self, tools: SessionTools, token: str) -> dict[str, Any]:
        url, _stop = self.endpoints.add(tools, token)
        return {
            "type": "http",
            "name": "editor",
            "url": url,
            "headers": [{"name": "Authorization", "value": f"Bearer {token}"}],
        }

    async def _relay(self, tools: SessionTools, token: str) -> dict[str, Any]:
        path = os.path.join(self.socket_dir, f"{secrets.token_hex(6)}.sock")
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await sock.bind(path)
        sock.listen(4)
        assert self.nursery is not None
        self.nursery.start_soon(self._serve_relay, trio.SocketListener(sock), token, tools)
        return {
            "name": "editor",
            "command": sys.executable,
            "args": ["-I", "-S", SHIM_PATH],
            "env": [{"name": "LMBRIDGE_MCP_SOCKET", "value": path}, {"name": "LMBRIDGE_MCP_TOKEN", "value": token}],
        }

    async def _serve_relay(self, listener: trio.SocketListener, token: str, tools: SessionTools) -> None:
        async with listener:
            stream = await listener.accept()
        async with stream:
            line = b""
            while b"\n" not in line:
                data = await stream.receive_some(4096)
                if not data:
                    return
                line += data
            first, _, rest = line.partition(b"\n")
            assert first == HANDSHAKE + token.encode(), first
            await serve_stdio(tools, _Prefixed(stream, rest), sdk_ready=self._sdk_ready, log=QuietLog("tool floor"))

    def _finished(self) -> None:
        if self.turn is not None:
            self.turn.done.set()

    async def _on_update(self, batch: list[dict[str, Any]]) -> None:
        assert self.editor is not None
        for params in batch:
            update = params["update"]
            if update.get("sessionUpdate") == "agent_message_chunk" and self.turn is not None:
                part = {"type": "text", "value": update["content"]["text"]}
                await self.editor.notify("lm/part", {"requestId": self.turn.request_id, "part": part})

    async def _invoke(self, name: str, arguments: Any) -> tuple[dict[str, Any] | None, str]:
        assert self.editor is not None and self.turn is not None
        self.calls += 1
        part = {"type": "tool_call", "callId": f"call_{self.calls}", "name": name, "input": arguments}
        turn = self.turn
        await self.editor.notify("lm/part", {"requestId": turn.request_id, "part": part})
        answered, holder = trio.Event(), []
        self.waiting = answered, holder
        turn.stop = "tool_calls"
        turn.done.set()
        await answered.wait()
        return holder[0], ""


if __name__ == "__main__":
    from wire.observe.logs import configure

    configure("error")  # to stderr: stdout carries the editor protocol only
    relay = sys.argv[1:2] == ["--relay"]
    if sys.argv[1:2] == ["--config"]:
        trio.run(Floor([], agents=dict(load_config(sys.argv[2]).agents)).run)
    else:
        trio.run(Floor(sys.argv[2:] if relay else sys.argv[1:], relay=relay).run)
