"""The benchmarks' editor that shares a model: it answers ``editor/chat`` for ``bench-model`` the same way on two
transports, so that lmbridge's part of serving an editor's model is what a benchmark sees between them.

    python -m bench.editor -- lmbridge stdio --http 127.0.0.1:0 ...   # starts lmbridge as an extension does, shares
                                                                      # the model, prints the HTTP API's address
    python -m bench.editor --stdio      # answers editor/chat sent on stdin (the baseline: no lmbridge)

The last user message of a call is its script: ``flood N`` (N text parts, ``"1 "``, ``"2 "``, …, written as fast as
the transport takes them), or anything else (one part, the text itself). Calls are answered one after the other.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

MODEL = "bench-model"
SHARED = [
    {
        "id": MODEL,
        "name": "bench model",
        "vendor": "bench",
        "family": "bench",
        "capabilities": {"toolCalling": True, "imageInput": False},
    }
]


def answer(request_id: Any, params: dict[str, Any], write: Callable[[list[bytes]], None]) -> None:
    """Write the call's parts (``editor/part``, batched 256 to a write) and its answer."""
    messages = params.get("messages") or [{}]
    text = "".join(p.get("value", "") for p in messages[-1].get("content") or () if p.get("type") == "text")
    word, _, rest = text.partition(" ")
    pieces = [f"{n} " for n in range(1, int(rest) + 1)] if word == "flood" else [text]
    head = b'{"jsonrpc":"2.0","method":"editor/part","params":{"requestId":' + json.dumps(request_id).encode()
    batch: list[bytes] = []
    for piece in pieces:
        part = json.dumps({"type": "text", "value": piece}).encode()
        batch.append(head + b',"part":' + part + b"}}")
        if len(batch) == 256:
            write(batch)
            batch = []
    result = {"jsonrpc": "2.0", "id": request_id, "result": {"stopReason": "end_turn"}}
    write([*batch, json.dumps(result).encode()])


def serve_stdio() -> int:
    """The baseline: editor/chat read from stdin, parts and answers on stdout, one NDJSON line each."""
    out = sys.stdout.buffer

    def write(lines: list[bytes]) -> None:
        out.write(b"\n".join(lines) + b"\n")
        out.flush()

    for line in sys.stdin.buffer:
        message = json.loads(line)
        if message.get("method") == "editor/chat":
            answer(message["id"], message.get("params") or {}, write)
    return 0


def serve_lmbridge(argv: list[str]) -> int:
    """Through lmbridge, as an editor extension runs it: ``lmbridge stdio --http ...`` started here, the model shared
    in ``initialize``, its ``editor/chat`` answered on the same pipe. The HTTP API's address (``daemon/status``) is
    printed, then this serves until lmbridge's output ends."""
    import subprocess
    import threading

    process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    to_lmbridge, from_lmbridge, log = process.stdin, process.stdout, process.stderr
    hello = {"protocolVersion": 1, "clientInfo": {"name": "lmbridge-bench-editor", "version": "1"}}
    to_lmbridge.write(
        json.dumps(
            {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {**hello, "editorModels": SHARED}}
        ).encode()
        + b"\n"
    )
    to_lmbridge.flush()
    threading.Thread(target=lambda: [None for _ in log], daemon=True).start()  # keep lmbridge's stderr drained
    to_lmbridge.write(b'{"jsonrpc":"2.0","id":1,"method":"daemon/status","params":{}}\n')
    to_lmbridge.flush()
    for line in from_lmbridge:
        message = json.loads(line)
        if message.get("id") == 1:
            print(message["result"]["http"], flush=True)  # where the HTTP API listens
            break

    def write(lines: list[bytes]) -> None:
        to_lmbridge.write(b"\n".join(lines) + b"\n")
        to_lmbridge.flush()

    for line in from_lmbridge:
        message = json.loads(line)
        if message.get("method") == "editor/chat":
            answer(message["id"], message.get("params") or {}, write)
    return process.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stdio", action="store_true", help="answer editor/chat on stdin (the baseline)")
    parser.add_argument("lmbridge", nargs=argparse.REMAINDER, help="else: lmbridge's command line, started here")
    args = parser.parse_args()
    if args.stdio:
        return serve_stdio()
    return serve_lmbridge([arg for arg in args.lmbridge if arg != "--"])


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
