"""The benchmarks' clients of ``lmbridge serve``: blocking and minimal (a socket and a sans-IO parser each — wsproto
for the WebSocket editor protocol, h11 for HTTP), so that the HTTP API front and the WebSocket editor path are read
at the same cost and their ratio is the fronts' own.

- ``Daemon``: ``lmbridge serve --listen … --http …`` as a subprocess, its ready line read.
- ``WsEditor``: an editor on the WebSocket (``lm/chat``, ``lm/part`` notifications).
- ``HttpStreamer``: a client of ``POST /v1/chat/completions`` with ``stream: true`` on one keep-alive connection.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import h11
import wsproto
import wsproto.events as ws_events

from .wire import clock, loads

__all__ = ["Daemon", "HttpStreamer", "WsEditor"]


class Daemon:
    def __init__(self, argv: list[str], *, env: dict[str, str], stderr: Any, token_file: Path) -> None:
        self.process = subprocess.Popen(
            [*argv, "--token-file", str(token_file), "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
        )
        assert self.process.stdout is not None
        ready = json.loads(self.process.stdout.readline())
        self.ws_url, self.http_url = ready["listening"], ready["http"]
        self.token = Path(ready["tokenFile"]).read_text().strip()

    def close(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stdout.close()  # type: ignore[union-attr]


def _connect(url: str, timeout: float | None = None) -> tuple[socket.socket, str]:
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock, parts.netloc


class WsEditor:
    """A blocking editor on one WebSocket connection, initialized. ``timeout`` (seconds) bounds every read."""

    def __init__(
        self, url: str, token: str, *, timeout: float | None = None, initialize: dict[str, Any] | None = None
    ) -> None:
        """``initialize``: more ``initialize`` params (``editorModels`` for an editor that shares models)."""
        self._sock, host = _connect(url, timeout)
        self._ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
        headers = [(b"authorization", f"Bearer {token}".encode())]
        self._sock.sendall(self._ws.send(ws_events.Request(host=host, target="/", extra_headers=headers)))
        self._messages: list[str] = []
        self._partial: list[str] = []
        self._next_id = 0
        self.read_at = 0.0
        while not self._accepted():
            self._fill()
        hello = {"protocolVersion": 1, "clientInfo": {"name": "lmbridge-bench", "version": "1"}, **(initialize or {})}
        self.request("initialize", hello)

    def _accepted(self) -> bool:
        return self._ws.state is wsproto.connection.ConnectionState.OPEN

    def _fill(self) -> None:
        data = self._sock.recv(1 << 16)
        self.read_at = clock()
        if not data:
            raise EOFError("the daemon closed the WebSocket")
        self._ws.receive_data(data)
        for event in self._ws.events():
            if isinstance(event, ws_events.TextMessage):
                self._partial.append(event.data)
                if event.message_finished:
                    self._messages.append("".join(self._partial))
                    self._partial.clear()
            elif isinstance(event, ws_events.Ping):
                self._sock.sendall(self._ws.send(event.response()))

    def message(self) -> dict[str, Any]:
        while not self._messages:
            self._fill()
        result: dict[str, Any] = loads(self._messages.pop(0))
        return result

    def send(self, message: dict[str, Any]) -> None:
        self.send_text(json.dumps(message))

    def send_text(self, text: str) -> None:
        """One text frame, as it is (for sending what is not a well-formed message)."""
        self._sock.sendall(self._ws.send(ws_events.TextMessage(data=text)))

    def request(self, method: str, params: Any) -> Any:
        request_id = self.start(method, params)
        while True:
            reply = self.message()
            if reply.get("id") == request_id and "method" not in reply:
                return reply.get("result")

    def start(self, method: str, params: Any) -> int:
        self._next_id += 1
        self.send({"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params})
        return self._next_id

    def chat_parts(self, model: str, messages: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """The parts of one ``lm/chat``, as they arrive (``read_at`` is when each one's bytes were read)."""
        request_id = self.start("lm/chat", {"modelId": model, "messages": messages})
        while True:
            message = self.message()
            if "method" in message:
                yield message["params"]["part"]
            elif message.get("id") == request_id:
                return

    def close(self) -> None:
        self._sock.close()


class HttpStreamer:
    def __init__(self, url: str, token: str) -> None:
        self._sock, self._host = _connect(url)
        self._token = token
        self._http = h11.Connection(h11.CLIENT)
        self.read_at = 0.0

    def chat_deltas(self, model: str, messages: list[dict[str, Any]]) -> Iterator[str]:
        """The content deltas of one streamed chat completion, as they arrive."""
        body = json.dumps({"model": model, "messages": messages, "stream": True}).encode()
        headers = [
            ("host", self._host),
            ("authorization", f"Bearer {self._token}"),
            ("content-type", "application/json"),
            ("content-length", str(len(body))),
        ]
        http = self._http
        data = http.send(h11.Request(method="POST", target="/v1/chat/completions", headers=headers))
        data += http.send(h11.Data(data=body)) + http.send(h11.EndOfMessage())  # type: ignore[operator]
        self._sock.sendall(data)
        rest = b""
        while True:
            event = http.next_event()
            if event is h11.NEED_DATA:
                received = self._sock.recv(1 << 16)
                self.read_at = clock()
                http.receive_data(received)
                continue
            if isinstance(event, h11.Response):
                assert event.status_code == 200, event
            elif isinstance(event, h11.Data):
                events = (rest + bytes(event.data)).split(b"\n\n")
                rest = events.pop()
                for raw in events:
                    if raw.startswith(b"data: {"):
                        choices = loads(raw[6:])["choices"]
                        if choices and "content" in choices[0]["delta"]:
                            yield choices[0]["delta"]["content"]
            elif isinstance(event, h11.EndOfMessage):
                http.start_next_cycle()
                return

    def close(self) -> None:
        self._sock.close()
