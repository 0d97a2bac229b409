"""The MCP server the kit gives an agent in ``session/new`` (stdio): two tools, ``echo`` (read-only: answers
``echo: <text>``) and ``fail`` (answers an error result), and a log of every message it received, one JSON line
each, in the file named by ``--log``, so the kit can see what the agent did with it.

Run by path with the standard library only (``python -I -S mcp_probe.py --log FILE``): the agent starts it once per
session, and it must answer ``initialize`` at once.
"""

from __future__ import annotations

import json
import sys
from typing import Any

REVISIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
TOOLS = [
    {
        "name": "echo",
        "description": "Echo the text back (conformance probe).",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "fail",
        "description": "Always fails (conformance probe).",
        "inputSchema": {"type": "object", "properties": {}},
    },
]


def answer(message: dict[str, Any]) -> dict[str, Any] | None:
    method = message.get("method")
    if "id" not in message or not isinstance(method, str):
        return None
    params = message.get("params") or {}
    if method == "initialize":
        asked = params.get("protocolVersion")
        result: Any = {
            "protocolVersion": asked if asked in REVISIONS else REVISIONS[-1],
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": "lmbridge-conform-probe", "version": "1"},
        }
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif method == "ping":
        result = {}
    elif method == "tools/call" and params.get("name") == "echo":
        text = (params.get("arguments") or {}).get("text", "")
        result = {"content": [{"type": "text", "text": f"echo: {text}"}], "isError": False}
    elif method == "tools/call" and params.get("name") == "fail":
        result = {"content": [{"type": "text", "text": "the probe's fail tool failed, as asked"}], "isError": True}
    else:
        error = {"code": -32601, "message": f"method not found: {method}"}
        return {"jsonrpc": "2.0", "id": message["id"], "error": error}
    return {"jsonrpc": "2.0", "id": message["id"], "result": result}


def main(argv: list[str]) -> int:
    log_path = argv[argv.index("--log") + 1]
    with open(log_path, "a", encoding="utf-8") as log:
        for line in sys.stdin:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if not isinstance(message, dict):
                continue
            log.write(json.dumps(message) + "\n")
            log.flush()
            reply = answer(message)
            if reply is not None:
                sys.stdout.write(json.dumps(reply) + "\n")
                sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
