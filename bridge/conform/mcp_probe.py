"""The MCP server the kit gives an agent in ``session/new``: two tools, ``echo`` (read-only: answers
``echo: <text>``) and ``fail`` (answers an error result), and a log of every message it received, one JSON line
each, in the file named by ``--log``, so the kit can see what the agent did with it.

Run by path with the standard library only. Over stdio (``python -I -S mcp_probe.py --log FILE``) the agent starts
it once per session, and it must answer ``initialize`` at once. Over HTTP (``--http TOKEN``) the kit starts it: it
listens on 127.0.0.1 (a free port), prints its URL first, takes POSTed JSON-RPC (answers as JSON, 202 for
notifications; no event stream: GET is 405, as streamable HTTP allows) and logs whether each request carried
``Authorization: Bearer TOKEN`` (refused with 401 when not).
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


def serve_http(log_path: str, token: str) -> int:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    lock = threading.Lock()
    log = open(log_path, "a", encoding="utf-8")  # noqa: SIM115 (the process's whole life)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as MCP clients expect

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _reply(self, status: int, body: bytes = b"", extra: tuple[tuple[str, str], ...] = ()) -> None:
            self.send_response(status)
            for name, value in extra:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            size = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(size)
            authorized = self.headers.get("Authorization") == f"Bearer {token}"
            try:
                parsed = json.loads(raw)
            except ValueError:
                self._reply(400)
                return
            messages = [m for m in (parsed if isinstance(parsed, list) else [parsed]) if isinstance(m, dict)]
            with lock:
                for message in messages:
                    log.write(json.dumps({**message, "authorized": authorized}) + "\n")
                log.flush()
            if not authorized:
                self._reply(401, b'{"error": "unauthorized"}', (("Content-Type", "application/json"),))
                return
            replies = [reply for reply in map(answer, messages) if reply is not None]
            if not replies:
                self._reply(202)
                return
            body = json.dumps(replies if isinstance(parsed, list) else replies[0]).encode()
            self._reply(200, body, (("Content-Type", "application/json"),))

        def do_GET(self) -> None:
            self._reply(405, extra=(("Allow", "POST, DELETE"),))

        def do_DELETE(self) -> None:
            self._reply(200)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    sys.stdout.write(f"http://127.0.0.1:{server.server_address[1]}/mcp\n")
    sys.stdout.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


def main(argv: list[str]) -> int:
    log_path = argv[argv.index("--log") + 1]
    if "--http" in argv:
        return serve_http(log_path, argv[argv.index("--http") + 1])
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
