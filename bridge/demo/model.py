"""The demo agent's own model, when lmbridge gives it one (``[agents.demo] model_source = "editor"``): one streamed
Anthropic Messages request to ``$LMBRIDGE_MODEL_BASE_URL`` with ``$LMBRIDGE_MODEL_TOKEN``, standard library only.

Owns the request and reading its server-sent events in a worker thread; text deltas go to a queue the agent's event
loop reads. ``ModelUnavailable`` says what is wrong (no model given, a refusal with the server's message).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import socket
import threading
from collections.abc import AsyncGenerator
from typing import Any
from urllib.parse import urlsplit

__all__ = ["ModelUnavailable", "stream_answer"]


class ModelUnavailable(Exception):
    """The model could not be asked, or refused; the message says why."""


_END = object()


async def stream_answer(prompt: str, cancelled: asyncio.Event, *, max_tokens: int = 1024) -> AsyncGenerator[str, None]:
    """The answer to ``prompt``, text delta by text delta, until it ends or ``cancelled`` is set; then the connection
    is closed, which the server sees as the client going away."""
    base, token = os.environ.get("LMBRIDGE_MODEL_BASE_URL"), os.environ.get("LMBRIDGE_MODEL_TOKEN")
    if not base or not token:
        raise ModelUnavailable('no model: lmbridge gives the agent one with [agents.<id>] model_source = "editor"')
    url = urlsplit(base)
    body = json.dumps(
        {
            "model": "editor",
            "max_tokens": max_tokens,
            "stream": True,
            "messages": [{"role": "user", "content": prompt}],
        }
    ).encode()
    connection = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=600)
    queue: asyncio.Queue[Any] = asyncio.Queue()
    loop = asyncio.get_running_loop()

    def read() -> None:
        try:
            connection.request(
                "POST",
                url.path + "/v1/messages",
                body,
                {"content-type": "application/json", "x-api-key": token, "anthropic-version": "2023-06-01"},
            )
            response = connection.getresponse()
            if response.status != 200:
                error = json.loads(response.read() or b"{}").get("error", {})
                message = error.get("message") if isinstance(error, dict) else None
                raise ModelUnavailable(f"the model refused ({response.status}): {message or response.reason}")
            for line in response:
                if line.startswith(b"data:"):
                    event = json.loads(line[5:])
                    delta = event.get("delta", {}) if event.get("type") == "content_block_delta" else {}
                    if delta.get("type") == "text_delta":
                        loop.call_soon_threadsafe(queue.put_nowait, delta["text"])
                    elif event.get("type") == "error":
                        raise ModelUnavailable(f"the model failed: {event.get('error', {}).get('message')}")
            loop.call_soon_threadsafe(queue.put_nowait, _END)
        except BaseException as exc:
            loop.call_soon_threadsafe(queue.put_nowait, exc)

    reader = threading.Thread(target=read, name="demo-model", daemon=True)
    reader.start()
    stop = asyncio.ensure_future(cancelled.wait())
    try:
        while True:
            item = asyncio.ensure_future(queue.get())
            await asyncio.wait({item, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not item.done():
                item.cancel()
                return
            item = item.result()
            if item is _END:
                return
            if isinstance(item, BaseException):
                if isinstance(item, ModelUnavailable):
                    raise item
                raise ModelUnavailable(f"cannot reach the model at {base}: {item}") from item
            yield item
    finally:
        stop.cancel()
        if connection.sock is not None:
            try:
                connection.sock.shutdown(socket.SHUT_RDWR)  # unblocks the reader at once
            except OSError:
                pass
        connection.close()
