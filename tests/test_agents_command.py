"""``lmbridge agents``: the registry snapshot and a fetched copy, ``list``, ``add`` into a config file, ``update``
from a server on 127.0.0.1, and ``doctor`` against real agent processes."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from bridge.config import load_config
from bridge.conform.registry import RegistryError, fetch_registry, load_registry, parse_registry

AGENT = str(Path(__file__).with_name("conform_agent.py"))


def _lmbridge(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("LMBRIDGE_CONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", "bridge", "agents", *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_the_shipped_snapshot_lists_the_registrys_agents_with_how_each_starts() -> None:
    agents, source = load_registry(Path("/nonexistent/registry.json"))
    assert len(agents) == 39 and "shipped with lmbridge" in source
    by_id = {agent.id: agent for agent in agents}
    assert by_id["qwen-code"].launch() == ("npx", ["-y", "@qwen-code/qwen-code@0.24.4", "--acp"])
    assert by_id["fast-agent"].launch() == ("uvx", ["--from", "fast-agent-mcp==0.10.48", "fast-agent-acp"])
    assert by_id["goose"].kind == "binary" and by_id["devin"].kind == "unknown"


def test_the_registrys_own_format_is_read_too() -> None:
    document = {
        "version": "1",
        "agents": [
            {"id": "qwen-code", "name": "Qwen Code", "distribution": {"npx": {"package": "q@1", "args": ["--acp"]}}},
            {"id": "tool", "name": "Tool", "distribution": {"uvx": {"package": "tool==2"}}},
            {"id": "bin", "name": "Bin", "distribution": {"binary": {"linux-x86_64": {"archive": "x"}}}},
            "not an agent",
        ],
    }
    agents = parse_registry(document)
    assert [a.launch() for a in agents[:2]] == [("npx", ["-y", "q@1", "--acp"]), ("uvx", ["tool==2"])]
    assert agents[2].kind == "binary"
    with pytest.raises(RegistryError, match="not a registry"):
        parse_registry({"items": []})


@pytest.mark.wire
def test_list_shows_every_agent_and_how_it_starts(tmp_path: Path) -> None:
    done = _lmbridge(tmp_path, "list", "--json")
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    assert len(listed["agents"]) == 39
    row = next(r for r in listed["agents"] if r["id"] == "cline")
    assert row["start"] == "npx -y cline@3.0.65 --acp"
    text = _lmbridge(tmp_path, "list").stdout
    assert text.startswith("39 agents (snapshot of") and "goose" in text and "(a binary: download it)" in text


@pytest.mark.wire
@pytest.mark.smoke
def test_add_writes_a_table_lmbridge_reads_and_refuses_what_it_cannot_add(tmp_path: Path) -> None:
    done = _lmbridge(tmp_path, "add", "cline")
    assert done.returncode == 0, done.stderr
    path = tmp_path / "config" / "lmbridge" / "config.toml"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    agent = load_config(path).agents["cline"]
    assert agent.argv == ["npx", "-y", "cline@3.0.65", "--acp"] and agent.name == "Cline"

    again = _lmbridge(tmp_path, "add", "cline")
    assert again.returncode == 2 and "already has [agents.cline]" in again.stderr
    renamed = _lmbridge(tmp_path, "add", "cline", "--as", "cline-2")
    assert renamed.returncode == 0 and set(load_config(path).agents) >= {"cline", "cline-2"}
    binary = _lmbridge(tmp_path, "add", "goose")
    assert binary.returncode == 2 and "distributed as a binary" in binary.stderr
    unknown = _lmbridge(tmp_path, "add", "no-such-agent")
    assert unknown.returncode == 2 and "no agent 'no-such-agent' in the registry" in unknown.stderr


class _Registry(BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: Any) -> None:
        pass


def _serve(body: bytes) -> tuple[HTTPServer, str]:
    handler = type("Handler", (_Registry,), {"body": body})
    server = HTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/registry.json"


def test_update_fetches_a_copy_that_list_then_uses_and_keeps_the_old_one_on_failure(tmp_path: Path) -> None:
    cache = tmp_path / "cache" / "lmbridge" / "registry.json"
    document = {"agents": [{"id": "only", "name": "Only", "distribution": {"npx": {"package": "only@1"}}}]}
    server, url = _serve(json.dumps(document).encode())
    try:
        assert fetch_registry(url, cache) == 1
    finally:
        server.shutdown()
    assert stat.S_IMODE(cache.stat().st_mode) == 0o600
    agents, source = load_registry(cache)
    assert [a.id for a in agents] == ["only"] and str(cache) in source

    server, url = _serve(b"<html>not json</html>")
    try:
        with pytest.raises(RegistryError, match="not JSON"):
            fetch_registry(url, cache)
    finally:
        server.shutdown()
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}/registry.json"
    with pytest.raises(RegistryError, match="stays in use"):
        fetch_registry(closed, cache, timeout=5)
    assert [a.id for a in load_registry(cache)[0]] == ["only"]  # the fetched copy is kept


@pytest.mark.wire
def test_doctor_starts_each_agent_and_says_what_is_wrong(tmp_path: Path) -> None:
    config = tmp_path / "agents.toml"
    state = tmp_path / "state"
    state.mkdir()
    env = f'{{ CONFORM_AGENT_STATE = "{state}" }}'
    config.write_text(
        f"""
[agents.fine]
command = "{sys.executable}"
args = ["{AGENT}"]
env = {env}

[agents.locked]
command = "{sys.executable}"
args = ["{AGENT}", "--require-auth"]
env = {env}

[agents.missing]
command = "{tmp_path / "no-such-agent"}"
"""
    )
    done = _lmbridge(tmp_path, "doctor", "--config", str(config), "--timeout", "60")
    assert done.returncode == 1, done.stdout + done.stderr
    lines = dict(line.split(": ", 1) for line in done.stdout.splitlines())
    assert lines["fine"].startswith("conform-test-agent 1.0, protocol 1") and lines["fine"].endswith("OK")
    assert "needs a login" in lines["locked"] and "token" in lines["locked"]
    assert lines["missing"].startswith("does not start as an ACP agent: cannot start")
    unknown = _lmbridge(tmp_path, "doctor", "--config", str(config), "nope")
    assert unknown.returncode == 2 and "not configured: nope" in unknown.stderr
