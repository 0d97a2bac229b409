"""The floor of the tool round trip: lmbridge's own transports with nothing between them.

It stands where ``lmbridge stdio`` stands in the tool benchmark — the bench editor on its stdin/stdout, the bench
agent as its child over ACP, the agent's MCP calls coming in over streamable HTTP — and is built from the same
parts: the JSON-RPC engine (``bridge.rpc.connection``, with the editor connection's history-reusing parser) on both
stdio links, and the MCP endpoint (``mcp_synthetic.http``, ``SessionTools``) for the calls. What it leaves out is
everything that makes lmbridge a bridge: no routing or history matching, no session actor or state machine, no
permission flow, batching, checks of the editor's messages, logging or cancel paths. It serves exactly the
conversations of ``bench.benchmarks._bridged_tool_timings`` (one prompt, then tool results answering one call at
a time) and nothing else.

So the tool round trip measured through it is what the hops themselves cost on this machine (Python, Trio, two
pipes, the loopback socket, the bench editor's own work): the part of lmbridge's overhead that no change to
lmbridge's logic could remove. ``python bench/tool_floor.py [--relay] AGENT_ARGV...`` runs AGENT_ARGV as the
agent.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import QuietLog
from bench.mcp_server import ECHO_TOOL
from bridge.editor.history_parse import HistoryReusingParser
from bridge.rpc.asgi import load_server
from bridge.rpc.connection import ACP_CANCEL, EDITOR_CANCEL, JsonRpcConnection, MethodTable, StreamWire
from mcp_synthetic.http import HttpEndpoints
from mcp_synthetic.server import SessionTools, load_sdk
from mcp_synthetic.wiring import HANDSHAKE, SHIM_PATH, _Prefixed


class _Turn:
    """One ``lm/chat`` being answered: its parts go out as ``lm/part``; ``done`` ends it with ``stop``."""

    def __init__(self, request_id: Any) -> None:
        self.request_id = request_id
        self.done = trio.Event()
        self.stop = "end_turn"


class Floor:
    """The editor link, the agent link and the MCP endpoint, wired to each other directly (see the module)."""

    def __init__(self, agent_argv: list[str], *, relay: bool = False) -> None:
        self.agent_argv = agent_argv
        self.relay = relay
        self.socket_dir = tempfile.mkdtemp(prefix="lmbridge-floor-")  # 0700
        self.nursery: trio.Nursery | None = None
        self.editor: JsonRpcConnection | None = None
        self.agent: JsonRpcConnection | None = None
        self.endpoints = HttpEndpoints(QuietLog("tool floor"), self._loaded, self._loaded)
        self.turn: _Turn | None = None
        self.waiting: tuple[trio.Event, list[Any]] | None = None  # the agent's call waiting for the editor's result
        self.calls = 0

    @staticmethod
    async def _loaded() -> None:
        load_server()

    async def run(self) -> None:
        if self.relay:
            await trio.to_thread.run_sync(load_sdk)
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            await nursery.start(self.endpoints.run)
            process = await trio.lowlevel.open_process(self.agent_argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            assert process.stdin is not None and process.stdout is not None
            agent_methods = MethodTable()
            agent_methods.notification("session/update", self._on_update, batch=True)
            self.agent = JsonRpcConnection(
                StreamWire(process.stdout, process.stdin), agent_methods, name="agent", cancel_style=ACP_CANCEL
            )
            await nursery.start(self.agent.serve)
            await self.agent.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})

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
                process.kill()
                with trio.CancelScope(shield=True):
                    await process.wait()
                shutil.rmtree(self.socket_dir, ignore_errors=True)
            nursery.cancel_scope.cancel()

    async def _initialize(self, params: Any, context: Any) -> dict[str, Any]:
        return {"protocolVersion": 1, "serverInfo": {"name": "tool-floor", "version": "1"}, "models": []}

    async def _chat(self, params: Any, context: Any) -> dict[str, Any]:
        assert self.agent is not None
        turn = self.turn = _Turn(context.id)
        last = params["messages"][-1]["content"]
        results = [part for part in last if part.get("type") == "tool_result"]
        if results and self.waiting is not None:
            (answered, holder), self.waiting = self.waiting, None
            holder.append(results[0])
            answered.set()
        else:  # a new conversation: a session with its own MCP route, then the prompt
            token = secrets.token_urlsafe(16)
            tools = SessionTools(self._invoke, log=QuietLog("tool floor"))
            tools.update([ECHO_TOOL])
            server = await self._relay(tools, token) if self.relay else self._http(tools, token)
            session = await self.agent.request("session/new", {"cwd": os.getcwd(), "mcpServers": [server]})
            text = "".join(part.get("value", "") for part in last if part.get("type") == "text")
            prompt = self.agent.start_request_nowait(
                "session/prompt", {"sessionId": session["sessionId"], "prompt": [{"type": "text", "text": text}]}
            )
            prompt.on_answer(lambda result, error: self._finished())
        await turn.done.wait()
        return {"stopReason": turn.stop}

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
            await tools.serve(_Prefixed(stream, rest))

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
    from bridge.observe.logs import configure

    configure("error")  # to stderr: stdout carries the editor protocol only
    relay = sys.argv[1:2] == ["--relay"]
    trio.run(Floor(sys.argv[2:] if relay else sys.argv[1:], relay=relay).run)
