"""Scale-out on a stock load balancer (docs/scale.md), for real: HAProxy from Debian's packages on loopback in front of
three ``lmbridge serve`` nodes that share nothing but the token; conversations with tool calls through the official
``openai`` SDK, consistent hashing on the conversation header; one node killed with SIGKILL halfway. Every
conversation completes every turn — the ones that lived on the dead node continue on another, re-seeded from the
history each request carries — none sees another's text, and HAProxy's own statistics agree with what the clients
saw. A node stopped with SIGTERM and a drain grace goes down in HAProxy's eyes while it still answers.

``make test`` runs 6 conversations; ``make scale`` runs 30 and prints the numbers (``LMBRIDGE_SCALE_CONVERSATIONS``).
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest
import trio
from conftest import HANG, processes_with_marker
from fakes import tool_result, user

from bridge.editor.client import connect_daemon

pytestmark = pytest.mark.wire

CONVERSATIONS = int(os.environ.get("LMBRIDGE_SCALE_CONVERSATIONS", "6"))
TURNS = 4  # each calls a tool; then one more request asks the session what it heard
KILLED_AFTER = 2  # turns every conversation has finished when a node is killed
EDITOR_TOOL = {"name": "read_file", "description": "Read a file", "inputSchema": {"type": "object"}}
TOOL = {
    "type": "function",
    "function": {"name": "read_file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}},
}


def _haproxy() -> str:
    found = shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.access("/usr/sbin/haproxy", os.X_OK) else None)
    if found is None:
        pytest.fail(
            "HAProxy is not installed: `make test` installs it from Debian's packages (apt-get install haproxy)"
        )
    return found


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class Node:
    name: str
    process: subprocess.Popen[bytes]
    port: int  # of its HTTP API
    stderr: Path
    websocket: str  # its editor-protocol URL ("" without --listen)


@dataclass
class Cluster:
    nodes: list[Node]
    url: str  # HAProxy's frontend
    stats: str  # HAProxy's statistics, as CSV
    token: str
    served: dict[str, int] = field(default_factory=dict)

    def stats_rows(self) -> dict[str, dict[str, str]]:
        with urllib.request.urlopen(self.stats, timeout=HANG) as reply:
            text = reply.read().decode().lstrip("# ")
        return {row["svname"]: row for row in csv.DictReader(io.StringIO(text)) if row["pxname"] == "lmbridge"}

    def wait_until(self, server: str, status: str) -> None:
        deadline = time.monotonic() + HANG
        while self.stats_rows()[server]["status"] != status:
            assert time.monotonic() < deadline, f"{server} never became {status}: {self.stats_rows()[server]}"
            time.sleep(0.05)  # polling HAProxy's health checks, which run on their own clock


def _start_node(name: str, tmp_path: Path, config: Path, token_file: Path, *extra: str) -> Node:
    home = tmp_path / name
    home.mkdir()
    stderr = home / "serve.stderr"
    command = [sys.executable, "-m", "bridge", "serve", "--config", str(config), "--http", "127.0.0.1:0"]
    command += ["--token-file", str(token_file), "--ledger", str(home / "usage.db"), *extra]
    env = {**os.environ, "XDG_STATE_HOME": str(home)}  # each node its own session state file
    with open(stderr, "wb") as err:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, env=env)
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line, f"node {name} exited: {stderr.read_text()}"
    ready = json.loads(line)
    return Node(name, process, int(ready["http"].rsplit(":", 1)[1]), stderr, ready.get("listening", ""))


def _haproxy_config(nodes: list[Node], front: int, stats: int) -> str:
    servers = "\n".join(f"    server {node.name} 127.0.0.1:{node.port} check" for node in nodes)
    return f"""
global
    tune.bufsize 262144

defaults
    mode http
    timeout connect 2s
    timeout client 120s
    timeout server 120s
    retries 3
    option redispatch 1
    retry-on conn-failure empty-response 503

frontend api
    bind 127.0.0.1:{front}
    default_backend lmbridge

backend lmbridge
    # A conversation stays on its node (consistent hashing on its header), else a client on its key.
    http-request set-var(txn.route) req.hdr(x-lmbridge-conversation)
    http-request set-var(txn.route) req.hdr(authorization) unless {{ req.hdr(x-lmbridge-conversation) -m found }}
    balance hash var(txn.route)
    hash-type consistent
    option httpchk GET /healthz
    http-check expect status 200
    default-server inter 200ms fall 2 rise 2
    http-response set-header x-served-by %s
{servers}

listen stats
    bind 127.0.0.1:{stats}
    stats enable
    stats uri /stats
"""


@contextmanager
def cluster(tmp_path: Path, config: Path, *extra: str) -> Iterator[Cluster]:
    haproxy = _haproxy()
    token_file = tmp_path / "shared" / "token"
    nodes: list[Node] = []
    balancer: subprocess.Popen[bytes] | None = None
    try:
        for n in range(3):  # one after the other: the first makes the token the others read
            nodes.append(_start_node(f"node{n + 1}", tmp_path, config, token_file, *extra))
        front, stats = _free_port(), _free_port()
        (tmp_path / "haproxy.cfg").write_text(_haproxy_config(nodes, front, stats))
        with open(tmp_path / "haproxy.stderr", "wb") as err:
            balancer = subprocess.Popen([haproxy, "-db", "-f", str(tmp_path / "haproxy.cfg")], stderr=err)
        live = Cluster(
            nodes, f"http://127.0.0.1:{front}/v1", f"http://127.0.0.1:{stats}/stats;csv", token_file.read_text().strip()
        )
        deadline = time.monotonic() + HANG
        while True:
            try:
                rows = live.stats_rows()
                if all(rows[node.name]["status"] == "UP" for node in nodes):
                    break
            except OSError:
                pass  # HAProxy not listening yet
            assert time.monotonic() < deadline and balancer.poll() is None, (tmp_path / "haproxy.stderr").read_text()
            time.sleep(0.05)
        yield live
    finally:
        if balancer is not None:
            balancer.terminate()
            balancer.wait(HANG)
        for node in nodes:
            if node.process.poll() is None:
                node.process.send_signal(signal.SIGTERM)
        for node in nodes:
            node.process.wait(HANG)


class Conversation:
    """One client's conversation through the balancer: its history, and which node answered each request."""

    def __init__(self, live: Cluster, number: int) -> None:
        self.number = number
        self.client = openai.OpenAI(base_url=live.url, api_key=live.token, max_retries=0, timeout=HANG)
        self.headers = {"x-lmbridge-conversation": f"conversation-{number}"}
        self.messages: list[Any] = []
        self.nodes: list[str] = []  # the node of each request, in order
        self.answers: list[str] = []

    def _ask(self) -> Any:
        raw = self.client.chat.completions.with_raw_response.create(
            model="scripted",
            messages=self.messages,
            tools=[TOOL],  # type: ignore[list-item]
            extra_headers=self.headers,
        )
        self.nodes.append(raw.headers["x-served-by"])
        return raw.parse()

    def recall(self) -> str:
        """What the session that answers now heard before (the demo agent's ``/recall``)."""
        self.messages.append({"role": "user", "content": "/recall"})
        return self._ask().choices[0].message.content or ""

    def turn(self, k: int) -> None:
        self.messages.append({"role": "user", "content": f'/tool read_file {{"path": "c{self.number}-t{k}"}}'})
        asked = self._ask().choices[0]
        assert asked.finish_reason == "tool_calls", (self.number, k, asked)
        (call,) = asked.message.tool_calls or []
        self.messages += [
            asked.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": f"secret-{self.number}-{k}"},
        ]
        answer = self._ask().choices[0].message.content or ""
        self.messages.append({"role": "assistant", "content": answer})
        self.answers.append(answer)


def _config(tmp_path: Path, agents_toml: Path, extra: str = "") -> Path:
    config = tmp_path / "cluster.toml"
    config.write_text(agents_toml.read_text() + extra)
    return config


def test_a_node_killed_midway_loses_no_conversation(tmp_path: Path, agents_toml: Path, marker: str) -> None:
    with cluster(tmp_path, _config(tmp_path, agents_toml)) as live:
        conversations = [Conversation(live, n) for n in range(CONVERSATIONS)]
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=min(CONVERSATIONS, 16)) as pool:
            for k in range(1, KILLED_AFTER + 1):
                list(pool.map(lambda c: c.turn(k), conversations))  # noqa: B023  # run now, k is this turn's
            # The node with the most conversations dies without a word.
            by_node: dict[str, int] = {}
            for conversation in conversations:
                by_node[conversation.nodes[-1]] = by_node.get(conversation.nodes[-1], 0) + 1
            victim = max(by_node, key=lambda name: by_node[name])
            [dead] = [node for node in live.nodes if node.name == victim]
            dead.process.send_signal(signal.SIGKILL)
            dead.process.wait(HANG)
            killed_at = time.monotonic()
            # The next turn meets the dead node: HAProxy retries its requests on another (``retry-on``).
            list(pool.map(lambda c: c.turn(KILLED_AFTER + 1), conversations))
            # Until HAProxy has marked the node down, a retried request may land on another node than the one the
            # hash gives afterwards (each re-seeds the conversation from its history); from then on a conversation
            # stays where it is, and /recall shows what its session was told.
            live.wait_until(victim, "DOWN")
            for k in range(KILLED_AFTER + 2, TURNS + 1):
                list(pool.map(lambda c: c.turn(k), conversations))  # noqa: B023
            finished = time.monotonic()
            recalls = list(pool.map(Conversation.recall, conversations))
        # HAProxy's counters can trail the clients' reads: a make test on a busy machine read 53 of 54 answers at once
        # (every one of them right). Polled, with a deadline; a count over the answers still fails below.
        requests = sum(len(c.nodes) for c in conversations)
        deadline = time.monotonic() + HANG
        rows = live.stats_rows()
        while (
            time.monotonic() < deadline
            and min(int(rows["BACKEND"]["hrsp_2xx"]), sum(int(rows[node.name]["hrsp_2xx"]) for node in live.nodes))
            < requests
        ):
            time.sleep(0.05)
            rows = live.stats_rows()

    moved = [c for c in conversations if c.nodes[2 * KILLED_AFTER - 1] == victim]
    for conversation in conversations:
        n = conversation.number
        after_kill = conversation.nodes[2 * KILLED_AFTER :]
        assert victim not in after_kill, (n, conversation.nodes)
        for k, answer in enumerate(conversation.answers, start=1):
            assert f"secret-{n}-{k}" in answer, (n, k, answer)  # every tool turn completed with its own result
        recall = recalls[n]
        # Its own history, whole, also where it was re-seeded on another node...
        assert all(f"c{n}-t{k}" in recall for k in range(1, TURNS + 1)), (n, conversation.nodes, recall)
        # ...and nobody else's.
        others = [m for m in range(CONVERSATIONS) if m != n]
        assert not any(f"c{m}-t" in recall or f"secret-{m}-" in recall for m in others), (n, recall)
    assert moved, f"no conversation lived on {victim}"
    # HAProxy's view: the dead node is down, and every answer the clients got came through it, each once.
    assert rows[victim]["status"] == "DOWN"
    assert int(rows["BACKEND"]["hrsp_2xx"]) == requests
    assert sum(int(rows[node.name]["hrsp_2xx"]) for node in live.nodes) == requests
    for node in live.nodes:
        if node.name != victim:
            assert node.process.returncode == 0, node.stderr.read_text()[-2000:]
    assert processes_with_marker(marker) == []  # the dead node's agents did not outlive it (its watchdog)

    summary = {
        "conversations": CONVERSATIONS,
        "turns": TURNS,
        "requests": requests,
        "killed": victim,
        "conversations_on_the_killed_node": len(moved),  # each re-seeded on another node and completed
        # ...of which moved twice: a retry landed on one node, and the hash chose another once HAProxy saw it down.
        "moved_twice": sum(1 for c in moved if len(set(c.nodes[2 * KILLED_AFTER :])) > 1),
        "seconds_before_kill": round(killed_at - started, 2),
        "seconds_after_kill": round(finished - killed_at, 2),
        "haproxy": {
            name: {key: row[key] for key in ("status", "hrsp_2xx", "hrsp_5xx", "wretr", "wredis", "stot")}
            for name, row in rows.items()
        },
    }
    print("\nscale-out:", json.dumps(summary, indent=2))
    (tmp_path / "scale.json").write_text(json.dumps(summary, indent=2))


async def test_a_draining_node_goes_down_in_haproxys_eyes_while_it_still_answers(
    tmp_path: Path, agents_toml: Path, marker: str
) -> None:
    extra = ("--listen", "127.0.0.1:0", "--drain-grace", "600")
    with cluster(tmp_path, _config(tmp_path, agents_toml), *extra) as live:
        node = live.nodes[0]
        async with connect_daemon(node.websocket, live.token) as editor:
            with trio.fail_after(HANG):
                await editor.initialize(clientInfo={"name": "code"}, workspaceFolders=[str(tmp_path)])
            history = [user('/tool read_file {"path": "a.txt"}')]
            asked = await editor.chat("scripted", history, tools=[EDITOR_TOOL])
            (call,) = asked.tool_calls  # out with the editor: the node owes this conversation its end
            node.process.send_signal(signal.SIGTERM)
            await trio.to_thread.run_sync(live.wait_until, node.name, "DOWN")  # /healthz: draining
            assert node.process.poll() is None  # down for HAProxy, still answering what it owes
            newcomer = Conversation(live, 1)
            await trio.to_thread.run_sync(newcomer.turn, 1)
            assert node.name not in newcomer.nodes and "secret-1-1" in newcomer.answers[0]
            history += [asked.assistant_message(), tool_result(call["callId"], "the contents of a.txt")]
            finished = await editor.chat("scripted", history, tools=[EDITOR_TOOL])
            assert finished.error is None and "the contents of a.txt" in finished.text
        assert await trio.to_thread.run_sync(node.process.wait, HANG) == 0  # drained: it stops by itself
        assert "drained" in node.stderr.read_text()
    assert processes_with_marker(marker) == []
