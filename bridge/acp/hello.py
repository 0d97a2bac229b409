"""What lmbridge says first to an agent: the ``initialize`` request's params, with the client capabilities it offers.

Standard library only: ``bridge.acp.spawn`` sends it to the agent of an editor's first chat as soon as that agent is
started, before Trio and the rest of lmbridge are imported; ``bridge.acp.handshake`` sends it to every other agent.
"""

from __future__ import annotations

from typing import Any

from bridge import __version__
from wire.vocabulary import PROTOCOL_VERSION

__all__ = ["CLIENT_CAPABILITIES", "initialize_params"]

# lmbridge offers no file system or terminal of its own: the agent works in its own environment, and the client's
# tools reach it through the synthetic MCP server. It answers the (unstable) elicitation requests, forms and URLs: the
# client is asked as for a permission, or the request is declined when nobody can be asked.
CLIENT_CAPABILITIES: dict[str, Any] = {
    "fs": {"readTextFile": False, "writeTextFile": False},
    "terminal": False,
    "elicitation": {"form": {}, "url": {}},
}


def initialize_params(*, protocol_version: int = PROTOCOL_VERSION, client_name: str = "lmbridge") -> dict[str, Any]:
    return {
        "protocolVersion": protocol_version,
        "clientCapabilities": CLIENT_CAPABILITIES,
        "clientInfo": {"name": client_name, "title": client_name, "version": __version__},
    }
