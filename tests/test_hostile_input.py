"""Inputs that could end ``lmbridge stdio`` if they were not checked: each is valid JSON, so
each gets an answer — an error naming what cannot be accepted — and the process serves on and exits 0 at EOF."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.wire  # lmbridge and its agents as processes: make test, not make check

INITIALIZE = '{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":1}}'
MODELS = '{"jsonrpc":"2.0","id":"after","method":"lm/models","params":{}}'


def run_stdio(tmp_path: Path, *lines: str) -> dict[Any, dict[str, Any]]:
    """Feed ``lines`` to a fresh ``lmbridge stdio``; its replies by id (it must exit 0 at EOF)."""
    result = subprocess.run(
        [sys.executable, "-m", "bridge", "stdio", "--log-level", "debug"],
        input="".join(line + "\n" for line in lines).encode(),
        capture_output=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "XDG_CONFIG_HOME": str(tmp_path), "HOME": str(tmp_path)},
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-3000:]
    replies = [json.loads(line) for line in result.stdout.splitlines()]
    return {reply.get("id"): reply for reply in replies if "method" not in reply}


@pytest.mark.parametrize(
    ("line", "reply_id", "code"),
    [
        ('{"jsonrpc":"2.0","id":2,"method":"lm/\\ud800","params":{}}', 2, -32601),
        ('{"jsonrpc":"2.0","id":"\\ud800","method":"lm/models","params":{}}', "\ud800", None),
        ('{"jsonrpc":"2.0","id":3,"method":"lm/countTokens","params":{"modelId":"d\\udfff","text":"x"}}', 3, -32602),
        ('{"jsonrpc":"2.0","id":4,"method":"lm/countTokens","params":{"modelId":"demo","text":"a\\ud800b"}}', 4, None),
    ],
    ids=["method", "id", "model", "text"],
)
def test_a_lone_surrogate_is_answered_and_the_process_lives(
    tmp_path: Path, line: str, reply_id: Any, code: Any
) -> None:
    replies = run_stdio(tmp_path, INITIALIZE, line, MODELS)
    reply = replies[reply_id]
    assert (reply["error"]["code"] if "error" in reply else None) == code, reply
    assert replies["after"]["result"]["models"][0]["id"] == "demo"


def test_a_lone_surrogate_in_chat_text_reaches_the_agent_and_back(tmp_path: Path) -> None:
    chat = {
        "jsonrpc": "2.0",
        "id": 5,
        "method": "lm/chat",
        "params": {"modelId": "demo", "messages": [{"role": "user", "content": "/say half \ud800 pair"}]},
    }
    replies = run_stdio(tmp_path, INITIALIZE, json.dumps(chat), MODELS)
    assert replies[5]["result"]["stopReason"] in ("end_turn", "cancelled")  # EOF may cut the turn short
    assert replies["after"]["result"]["models"]


@pytest.mark.parametrize("bad_id", [[1], {"a": 1}, None, 1.5, True, "\ud800"], ids=repr)
def test_cancel_request_with_an_id_of_any_type_is_dropped(tmp_path: Path, bad_id: Any) -> None:
    cancel = json.dumps({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": bad_id}})
    replies = run_stdio(
        tmp_path, INITIALIZE, cancel, '{"jsonrpc":"2.0","method":"$/cancelRequest","params":[]}', MODELS
    )
    assert replies["after"]["result"]["models"]


@pytest.mark.parametrize(
    ("agents", "field"),
    [
        ({"x": {"command": "true", "initializeTimeout": 10**4299}}, "agents.x.initialize_timeout"),
        ({"x": {"command": "true", "maxInputTokens": 10**4299}}, "agents.x.max_input_tokens"),
        ({"x": {"command": "true", "maxOutputTokens": -(10**300)}}, "agents.x.max_output_tokens"),
        ({"x": {"command": "true", "initializeTimeout": 1e308}}, "agents.x.initialize_timeout"),
    ],
    ids=["4300-digit timeout", "4300-digit tokens", "negative", "1e308"],
)
def test_out_of_range_numbers_in_the_first_initialize_are_refused_by_name(
    tmp_path: Path, agents: dict[str, Any], field: str
) -> None:
    first = json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1, "agents": agents}}
    )
    replies = run_stdio(tmp_path, first, INITIALIZE, MODELS)
    assert replies[1]["error"]["code"] == -32602 and replies[1]["error"]["data"]["field"] == field
    assert replies["init"]["result"]["protocolVersion"] == 1  # the connection stays usable
    assert replies["after"]["result"]["models"]


def test_a_number_longer_than_python_reads_is_a_parse_error_that_says_so(tmp_path: Path) -> None:
    huge = '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1' + "0" * 5000 + "}}"
    replies = run_stdio(tmp_path, huge, INITIALIZE, MODELS)
    assert replies[None]["error"] == {"code": -32700, "message": "Parse error: a number has more than 4300 digits"}
    version = '{"jsonrpc":"2.0","id":2,"method":"initialize","params":{"protocolVersion":1' + "0" * 4000 + "}}"
    assert "a number too large" in run_stdio(tmp_path, version, INITIALIZE, MODELS)[2]["error"]["message"]
