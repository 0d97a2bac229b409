"""Wiring the synthetic MCP server into sessions: the ``mcpServers`` entry each session's agent gets — a URL on the
shared streamable-HTTP listener (``http.py``) when the agent takes HTTP MCP servers, else the stdio relay
(``shim.py``) it starts, which reaches a per-session unix socket.

Owns the choice of transport (``mcp_transport``: auto, http, stdio), the runtime directory (0700, removed at exit),
one listening socket per stdio session (0600) with its own token, checked before a single byte is relayed, and the
session hooks the router calls (``SessionSetup``): the servers for
``session/new``, the tool list at each turn, and clean-up when the session closes.
"""

from __future__ import annotations

import gc
import hmac
import os
import secrets
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from wire.observe.logger import Logger

from .server import SERVER_NAME, LocalTool, SessionTools, load_sdk, receive_some
from .stdio import serve_stdio
from .validation import warm_up_schemas

if TYPE_CHECKING:
    from .http import HttpEndpoints

__all__ = ["HANDSHAKE", "SHIM_PATH", "EditorToolsSetup"]

SHIM_PATH = str(Path(__file__).with_name("shim.py"))
HANDSHAKE = b"LMBRIDGE-MCP-1 "
HANDSHAKE_TIMEOUT = 5.0


@dataclass(slots=True)
class _Served:
    """What serves one session's tools."""

    tools: SessionTools
    client: Any = None  # the client of the session's last request: whose own tools (``local_tools``) it is offered
    listener: trio.CancelScope | None = None  # stops serving the session (its unix socket, or its HTTP route)
    socket_path: Path | None = None  # the unix socket to remove afterwards (stdio relay)


def _remove_stale_runtime_dirs(parent: Path) -> None:
    """Socket directories of lmbridge processes that no longer run (killed with SIGKILL) and were ours."""
    for directory in parent.glob("lmbridge-*"):
        pid_text = directory.name.split("-")[1]
        if not pid_text.isdigit() or not directory.is_dir():
            continue
        try:
            if directory.stat().st_uid != os.getuid():
                continue
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            shutil.rmtree(directory, ignore_errors=True)
        except (OSError, OverflowError):
            continue


def _load_front() -> None:
    """What a session needs first, soonest first: the schema checker (each session's ``session/new`` compiles its
    tools' schemas), then the HTTP server and lmbridge's MCP endpoint (an agent's MCP connection may come ~0.2 s after
    it started; a prestarted agent's comes with the first chat, which should not import them)."""
    warm_up_schemas()
    from . import http  # noqa: F401  (and with it wire.h11_server)


def _load_sdk_parts() -> None:
    """The MCP SDK (about half a second of CPU): for what ``mcp_synthetic.early`` (HTTP) and ``mcp_synthetic.stdio``
    (the stdio relay) leave to it."""
    load_sdk()
    from .http import load_http

    load_http()


async def _import_quietly(load: Callable[[], None]) -> BaseException | None:
    """Run ``load`` in a worker thread; the exception it raised, if any.

    The SDK's import makes ~100,000 objects that live as long as the process: the cyclic collector scanning them as
    they come costs ~12 % of it. Paused meanwhile; they are then frozen out of every later scan, as the bridge service
    does for everything imported at start (with whatever garbage the turns of that moment left: a one-off)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        await trio.to_thread.run_sync(load)
    except Exception as exc:
        return exc
    finally:
        gc.freeze()
        if collecting:
            gc.enable()
    return None


class EditorToolsSetup:
    """The router's ``SessionSetup``: gives each session that has editor tools its MCP server."""

    def __init__(
        self,
        *,
        log: Logger,
        tracer: Any = None,
        runtime_dir: str | None = None,
        parallel_tools: bool = True,
        local_tools: Callable[[Any], list[LocalTool]] | None = None,
        watch_local_tools: Callable[[Callable[[], None]], Callable[[], None]] | None = None,
    ) -> None:
        """``local_tools(client)``: the tools lmbridge answers itself for a conversation of that client (the
        request's ``client``: the editor whose models the agent may ask); ``watch_local_tools(callback)`` has
        ``callback()`` called when they may have changed (an editor shared other models), and returns what stops
        that: the sessions' agents are told at once, not at their next turn."""
        self._local_tools = local_tools or (lambda client: [])
        self._watch_local_tools = watch_local_tools
        self._log = log
        self._parallel_tools = parallel_tools
        self._tracer = tracer
        self._runtime_parent = runtime_dir
        self._runtime: Path | None = None
        self._nursery: trio.Nursery | None = None
        self._front_loaded: trio.Event | None = None  # the schema checker and the HTTP server are imported (or not)
        self._front_error: BaseException | None = None
        self._sdk_loaded: trio.Event | None = None
        self._sdk_error: BaseException | None = None
        self._served: dict[str, _Served] = {}  # by session key
        self._http: HttpEndpoints | None = None  # one streamable-HTTP listener for every session, started on demand
        self._http_lock = trio.Lock()
        self._http_failed = False

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                # Socket directories of killed lmbridges: cleaned at start, in a worker thread (a glob of the temp
                # directory), off every turn's path.
                nursery.start_soon(trio.to_thread.run_sync, _remove_stale_runtime_dirs, self._runtime_base())
                unwatch = self._watch_local_tools(self._local_tools_changed) if self._watch_local_tools else None
                try:
                    task_status.started()
                    await trio.sleep_forever()
                finally:
                    if unwatch is not None:
                        unwatch()
        finally:
            if self._runtime is not None:
                shutil.rmtree(self._runtime, ignore_errors=True)

    # -- SessionSetup -------------------------------------------------------------------------------------------

    def prepare(self, request: Any) -> None:
        """Start importing what serving tools needs as soon as a request with tools arrives."""
        if request.tools:
            self.preload()

    def preload(self) -> None:
        """Start importing the schema checker and the HTTP server (~60 ms) in a worker thread, once, then listen
        for MCP over HTTP. The MCP SDK is imported only when something needs it (``sdk_ready``)."""
        if self._front_loaded is None and self._nursery is not None:
            self._front_loaded = trio.Event()
            self._nursery.start_soon(self._import_front)

    async def server_ready(self) -> None:
        """Wait for ``preload``'s import (starting it if need be); ``RuntimeError`` when it failed."""
        self.preload()
        assert self._front_loaded is not None
        await self._front_loaded.wait()
        if self._front_error is not None:
            raise RuntimeError(f"the HTTP server failed to load: {self._front_error}")

    def _preload_sdk(self) -> None:
        if self._sdk_loaded is None and self._nursery is not None:
            self._sdk_loaded = trio.Event()
            self._nursery.start_soon(self._import_sdk)

    async def sdk_ready(self) -> None:
        """Import the MCP SDK, once (about half a second of CPU, in a worker thread); ``RuntimeError`` when it
        failed."""
        await self.server_ready()
        self._preload_sdk()
        assert self._sdk_loaded is not None
        await self._sdk_loaded.wait()
        if self._sdk_error is not None:
            raise RuntimeError(f"the MCP SDK failed to load: {self._sdk_error}")

    async def mcp_servers(self, session: Any, request: Any) -> list[dict[str, Any]]:
        """The session's server entry, at once: the imports run on while the agent starts its session; the MCP
        connections wait for them (the HTTP server's and the schema checker's; the SDK's for what
        ``mcp_synthetic.early`` and ``mcp_synthetic.stdio`` leave to it), not ``session/new``."""
        local = self._local_tools(getattr(request, "client", None))
        if not request.tools and not local:
            return []
        self.preload()

        async def invoke(name: str, arguments: Any) -> Any:
            actor = session.actor
            if actor is None:
                return None, "The session is not ready yet; call the tool again."
            return await actor.invoke_tool(name, arguments)

        def prompt_cancelled() -> Any:
            actor = session.actor
            return actor.prompt_cancelled() if actor is not None else None

        tools = SessionTools(
            invoke,
            log=self._log.bind(session=session.key),
            tracer=self._tracer,
            name=f"mcp:{session.key.rsplit(':', 1)[-1][:12]}",
            parallel=self._parallel_tools,
            prompt_cancelled=prompt_cancelled,
        )
        tools.update(list(request.tools))
        tools.set_local(local)
        self._compile_later(tools)
        token = secrets.token_urlsafe(32)
        if self._tracer is not None:
            self._tracer.add_secret(token)
        served = self._served[session.key] = _Served(tools, getattr(request, "client", None))
        assert self._nursery is not None
        url = await self._http_url(session.agent, tools, token, served)
        if url is not None:
            return [
                {
                    "type": "http",
                    "name": SERVER_NAME,
                    "url": url,
                    "headers": [{"name": "Authorization", "value": f"Bearer {token}"}],
                }
            ]
        path = self._socket_path()
        served.listener = await self._nursery.start(self._listen, path, token, tools)
        served.socket_path = path
        return [
            {
                "name": SERVER_NAME,
                "command": sys.executable,
                "args": ["-I", "-S", SHIM_PATH],
                "env": [
                    {"name": "LMBRIDGE_MCP_SOCKET", "value": str(path)},
                    {"name": "LMBRIDGE_MCP_TOKEN", "value": token},
                ],
            }
        ]

    async def _http_url(self, agent: Any, tools: SessionTools, token: str, served: _Served) -> str | None:
        """The session's URL on the shared streamable-HTTP listener, when the agent takes HTTP MCP servers and the
        configuration allows; ``None``: use the stdio relay."""
        wanted = getattr(agent, "mcp_transport", "auto")
        if wanted == "stdio":
            return None
        if not (agent.info is not None and agent.info.mcp("http")):
            if wanted == "http":
                self._log.warning(
                    "mcp_transport is http but the agent does not advertise mcpCapabilities.http: stdio relay used",
                    agent=getattr(agent, "id", None),
                )
            return None
        endpoints = await self.loopback_listener()
        if endpoints is None:
            return None
        try:
            url, served.listener = endpoints.add(tools, token)
        except RuntimeError as exc:  # the listener gave up (the SDK could not be imported): the relay says why
            self._log.warning("MCP over HTTP is not available; using the stdio relay", error=str(exc))
            return None
        return url

    async def loopback_listener(self) -> HttpEndpoints | None:
        """The shared listener on 127.0.0.1, started by the first session that needs it, or by another user of
        it (``HttpEndpoints.mount``); ``None`` when it cannot listen."""
        async with self._http_lock:
            if self._http is None and not self._http_failed:
                from .http import HttpEndpoints

                endpoints = HttpEndpoints(self._log, self.sdk_ready, self.server_ready)
                assert self._nursery is not None
                try:
                    await self._nursery.start(endpoints.run)
                except OSError as exc:
                    self._http_failed = True
                    self._log.warning(
                        "cannot listen on 127.0.0.1 for MCP over HTTP; using the stdio relay", error=str(exc)
                    )
                else:
                    self._http = endpoints
        return self._http

    def turn_started(self, session: Any, request: Any) -> None:
        served = self._served.get(session.key)
        if served is None:
            return
        # The tools of this request's client: a conversation follows its editor (and the models it shares now).
        served.client = getattr(request, "client", None)
        changed = served.tools.update(list(request.tools))
        changed = served.tools.set_local(self._local_tools(served.client)) or changed
        if changed:
            self._tools_changed(served.tools, session=session.session_id)

    def _local_tools_changed(self) -> None:
        for served in self._served.values():
            if served.tools.set_local(self._local_tools(served.client)):
                self._tools_changed(served.tools)

    def _tools_changed(self, tools: SessionTools, **context: Any) -> None:
        if self._nursery is None:
            return
        self._log.info("the editor's tools changed; telling the agent", tools=sorted(tools.editor_names), **context)
        self._compile_later(tools)
        self._nursery.start_soon(tools.notify_changed)

    def _compile_later(self, tools: SessionTools) -> None:
        """Compile the tools' schemas in the background once the schema checker is imported: not on the path of
        ``session/new`` nor of the agent's tool list (which compiles what is still left when it comes)."""

        async def compile_schemas() -> None:
            try:
                await self.server_ready()
            except RuntimeError:
                return  # the import failed (logged); a tool list or call says so to the agent
            await tools.compile_schemas()

        if self._nursery is not None:
            self._nursery.start_soon(compile_schemas)

    async def session_closed(self, session: Any) -> None:
        served = self._served.pop(session.key, None)
        if served is None:
            return
        if served.listener is not None:
            served.listener.cancel()
        if served.socket_path is not None:
            try:
                os.unlink(served.socket_path)
            except FileNotFoundError:
                pass

    # -- sockets ----------------------------------------------------------------------------------------------

    async def _import_front(self) -> None:
        assert self._front_loaded is not None
        self._front_error = await _import_quietly(_load_front)
        if self._front_error is not None:
            self._log.error("cannot import the HTTP server", error=str(self._front_error))
        self._front_loaded.set()
        if self._front_error is None:
            # The listener too, now rather than on the path of the first session/new that needs it (~0.4 ms).
            await self.loopback_listener()

    async def _import_sdk(self) -> None:
        assert self._sdk_loaded is not None
        if self._front_loaded is not None:  # one import at a time: the relay starts this one beside preload's
            await self._front_loaded.wait()
        begun = trio.current_time()
        self._sdk_error = await _import_quietly(_load_sdk_parts)
        if self._sdk_error is None:
            self._log.debug("MCP SDK imported", seconds=round(trio.current_time() - begun, 3))
        else:
            self._log.error("cannot import the mcp SDK", error=str(self._sdk_error))
        self._sdk_loaded.set()

    def _runtime_base(self) -> Path:
        parent = self._runtime_parent or os.environ.get("XDG_RUNTIME_DIR")
        return Path(parent) if parent and os.path.isdir(parent) else Path(tempfile.gettempdir())

    def _socket_path(self) -> Path:
        if self._runtime is None:
            # 0700; socket paths must stay short (about 100 bytes on Linux). The pid in the name lets a later
            # lmbridge remove it if this one is killed before it can (see run()).
            base = self._runtime_base()
            try:
                self._runtime = base / f"lmbridge-{os.getpid()}"
                self._runtime.mkdir(mode=0o700)
            except FileExistsError:  # a second setup in this process
                self._runtime = Path(tempfile.mkdtemp(prefix=f"lmbridge-{os.getpid()}-", dir=base))
        return self._runtime / f"{secrets.token_hex(6)}.sock"

    async def _listen(
        self,
        path: Path,
        token: str,
        tools: SessionTools,
        task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await sock.bind(str(path))
        os.chmod(path, 0o600)
        sock.listen(16)
        listener = trio.SocketListener(sock)
        with trio.CancelScope() as scope:
            task_status.started(scope)
            async with listener, trio.open_nursery() as connections:
                while True:
                    stream = await listener.accept()
                    connections.start_soon(self._connection, stream, token, tools)

    async def _connection(self, stream: trio.SocketStream, token: str, tools: SessionTools) -> None:
        async with stream:
            line = b""
            with trio.move_on_after(HANDSHAKE_TIMEOUT):
                while b"\n" not in line and len(line) < 512:
                    data = await receive_some(stream, 4096)
                    if not data:
                        break
                    line += data
            first, _, rest = line.partition(b"\n")
            expected = HANDSHAKE + token.encode()
            if not hmac.compare_digest(first, expected):
                self._log.warning("refused a connection to an MCP socket: wrong or missing token")
                return
            try:
                await self.server_ready()  # the schema checker, which the tool list compiles with
            except RuntimeError:
                pass  # logged; the tool list says so to the agent
            await serve_stdio(tools, _Prefixed(stream, rest), sdk_ready=self.sdk_ready, log=self._log)


class _Prefixed(trio.abc.Stream):
    """A stream with some already-received bytes put back in front."""

    def __init__(self, stream: trio.abc.Stream, prefix: bytes) -> None:
        self._stream = stream
        self._prefix = prefix

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self._prefix:
            data, self._prefix = self._prefix, b""
            return data
        return await self._stream.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self._stream.aclose()
