"""``lmbridge stdio``: one editor on stdin/stdout, the way an editor extension spawns the bridge.

Owns the process-level plumbing of that mode: stdout is reserved for the protocol (the original fd is kept for
it and fd 1 is pointed at stderr, so a stray print or a library writing to stdout cannot corrupt the stream),
and the stop conditions — ``shutdown``, end of stdin, SIGTERM/SIGINT — all lead to the same orderly exit:
running turns answered ``cancelled``, sessions closed, agent process groups stopped, exit status 0.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import trio

from .config import Config
from .daemon import Daemon
from .editor import EditorConnection
from .rpc import EDITOR_CANCEL, JsonRpcConnection, StreamWire

__all__ = ["serve_stdio", "reserve_stdout"]


def reserve_stdout() -> int:
    """Keep a private copy of stdout for the protocol and send everything else written to fd 1 to stderr."""
    protocol_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return protocol_fd


async def serve_stdio(config: Config, *, log: Any, tracer: Any = None, stdin_fd: int = 0, stdout_fd: int | None = None,
                      max_message_bytes: int = 64 * 1024 * 1024) -> int:
    protocol_fd = reserve_stdout() if stdout_fd is None else stdout_fd
    daemon = Daemon(config, log=log, tracer=tracer)
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        editor = EditorConnection(daemon)
        wire = StreamWire(trio.lowlevel.FdStream(os.dup(stdin_fd)), trio.lowlevel.FdStream(protocol_fd))
        connection = JsonRpcConnection(wire, editor.methods, name="editor", cancel_style=EDITOR_CANCEL, tracer=tracer,
                                       max_message_bytes=max_message_bytes)
        editor.connection = connection
        await nursery.start(connection.serve)
        stop = trio.Event()
        nursery.start_soon(_set_when, connection.peer_closed, stop, "end of input")
        nursery.start_soon(_set_when, editor.shutdown_requested, stop, "shutdown request")
        nursery.start_soon(_stop_on_signals, stop, log)
        log.info("lmbridge stdio ready", pid=os.getpid(), agents=sorted(config.agents))
        await stop.wait()
        editor.cancel_turns()
        await daemon.shutdown()
        await connection.aclose()
        nursery.cancel_scope.cancel()
    return 0


async def _set_when(event: trio.Event, stop: trio.Event, why: str) -> None:
    await event.wait()
    stop.set()


async def _stop_on_signals(stop: trio.Event, log: Any) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("stopping on signal", signal=signal.Signals(signum).name)
            stop.set()
            return
