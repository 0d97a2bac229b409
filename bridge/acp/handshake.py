"""The ACP handshake, written once: what lmbridge says in ``initialize``, what it keeps of the answer (``AgentInfo``),
and ``authenticate``.

Everyone who starts an agent goes through here: each agent process of the pool (``process.AgentProcess``) and the
harness's version-negotiation probe. The sequence runs over any ``request(method, params)`` coroutine, so it is the
same whatever carries it — for an agent started early, whose ``initialize`` went out with its start
(``bridge.acp.spawn``), over the answer to that one; a step that fails raises ``HandshakeError`` with words that
finish the sentence "the agent failed to start: …".
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from wire.errors import RpcError
from wire.observe.logger import Logger
from wire.rpc.connection import ConnectionClosed
from wire.vocabulary import PROTOCOL_VERSION

from .hello import CLIENT_CAPABILITIES, initialize_params

__all__ = ["CLIENT_CAPABILITIES", "AgentInfo", "HandshakeError", "handshake", "initialize_params", "read_agent_info"]

Request = Callable[[str, Any], Awaitable[Any]]


class HandshakeError(Exception):
    """A handshake step failed; the message says which and why."""


@dataclass(frozen=True, slots=True)
class AgentInfo:
    """What the agent said in ``initialize``, reduced to what the bridge uses."""

    protocol_version: int
    capabilities: dict[str, Any]
    auth_methods: list[Any]
    agent_info: dict[str, Any]

    @property
    def session_capabilities(self) -> dict[str, Any]:
        value = self.capabilities.get("sessionCapabilities")
        return value if isinstance(value, dict) else {}

    @property
    def can_close(self) -> bool:
        return self.session_capabilities.get("close") is not None

    @property
    def can_resume(self) -> bool:
        return self.session_capabilities.get("resume") is not None

    @property
    def can_load(self) -> bool:
        return self.capabilities.get("loadSession") is True

    def mcp(self, transport: str) -> bool:
        value = self.capabilities.get("mcpCapabilities")
        return isinstance(value, dict) and value.get(transport) is True

    def prompt(self, kind: str) -> bool:
        value = self.capabilities.get("promptCapabilities")
        return isinstance(value, dict) and value.get(kind) is True


def read_agent_info(result: Any) -> AgentInfo:
    """The answer to ``initialize``; ``HandshakeError`` unless it is one lmbridge can work with."""
    if not isinstance(result, dict):
        raise HandshakeError(f"initialize returned {type(result).__name__}, expected an object")
    version = result.get("protocolVersion")
    if version != PROTOCOL_VERSION:
        raise HandshakeError(f"it speaks ACP protocol version {version!r}; lmbridge speaks {PROTOCOL_VERSION}")
    capabilities = result.get("agentCapabilities")
    auth_methods = result.get("authMethods")
    agent_info = result.get("agentInfo")
    return AgentInfo(
        protocol_version=version,
        capabilities=capabilities if isinstance(capabilities, dict) else {},
        auth_methods=auth_methods if isinstance(auth_methods, list) else [],
        agent_info=agent_info if isinstance(agent_info, dict) else {},
    )


async def handshake(
    request: Request,
    *,
    timeout: float,
    authenticate: str | None = None,
    log: Logger | None = None,
    initialize_sent: Callable[[], Awaitable[Any]] | None = None,
) -> AgentInfo:
    """``initialize``, then ``authenticate`` when a method is configured; each step within ``timeout`` seconds.
    ``initialize_sent``: the answer to an ``initialize`` sent already (an agent started early), awaited instead of
    sending one."""
    ask = request if initialize_sent is None else (lambda _method, _params: initialize_sent())
    result = await _step(ask, "initialize", initialize_params(), timeout, "before answering initialize")
    info = read_agent_info(result)
    if authenticate:
        offered = [m.get("id") for m in info.auth_methods if isinstance(m, dict)]
        if offered and authenticate not in offered and log is not None:
            log.warning("configured authenticate method not offered by the agent", method=authenticate, offered=offered)
        await _step(
            request,
            "authenticate",
            {"methodId": authenticate},
            timeout,
            "during authenticate",
            f"authenticate with method {authenticate!r} failed",
        )
    return info


async def _step(
    request: Request, method: str, params: dict[str, Any], timeout: float, exited: str, failed: str | None = None
) -> Any:
    try:
        with trio.fail_after(timeout):
            return await request(method, params)
    except trio.TooSlowError:
        raise HandshakeError(f"no answer to {method} within {timeout:g} s") from None
    except ConnectionClosed:
        raise HandshakeError(f"it exited {exited}") from None
    except RpcError as exc:
        raise HandshakeError(f"{failed or method + ' failed'}: {exc.message}") from None
