"""The editor's ``initialize``, without I/O: checking its params and building its answer.

Kept free of Trio and of the rest of the bridge, so that ``lmbridge stdio`` can answer ``initialize`` before it
imports them: an editor waits for that answer when it starts.
"""

import os
from typing import Any, NamedTuple

from bridge import __version__
from bridge.config import DEMO_AGENT_ID, EDITOR_MODELS_PREFIX, AgentConfig, ConfigError, agent_from_mapping
from bridge.service.shared_models import SharedModel, parse_shared_models
from wire.errors import InvalidParams

__all__ = ["PROTOCOL_VERSION", "EditorHello", "initialize_result", "parse_initialize"]

PROTOCOL_VERSION = 1


class EditorHello(NamedTuple):
    """What an editor said about itself in ``initialize``. (A NamedTuple, as ``bridge.config``'s records are: this
    module is read before ``lmbridge stdio`` starts the agent of an editor's first chat.)"""

    client_info: dict[str, Any]
    workspace_folders: tuple[str, ...]
    thinking: bool
    acp_updates: bool
    agents: dict[str, AgentConfig]
    editor_models: tuple[SharedModel, ...] = ()  # the models the editor shares (docs/editor-models.md)


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidParams(where, "must be an object")
    return value


def parse_initialize(params: Any) -> EditorHello:
    """Check ``initialize`` params; ``InvalidParams`` names the first field that is wrong."""
    params = _object(params, "params")
    version = params.get("protocolVersion")
    if version != PROTOCOL_VERSION:
        raise InvalidParams(
            "protocolVersion", f"unsupported version {_short(version)}; this bridge speaks {PROTOCOL_VERSION}"
        )
    client_info: dict[str, Any] = {}
    if params.get("clientInfo") is not None:
        client_info = _object(params["clientInfo"], "clientInfo")
        for key in ("name", "version"):
            if key in client_info and not isinstance(client_info[key], str):
                raise InvalidParams(f"clientInfo.{key}", "must be a string")
    folders = params.get("workspaceFolders")
    if folders is not None:
        if not isinstance(folders, list):
            raise InvalidParams("workspaceFolders", "must be a list of absolute paths")
        for index, folder in enumerate(folders):
            if not isinstance(folder, str) or not os.path.isabs(folder):
                raise InvalidParams(f"workspaceFolders[{index}]", "must be an absolute path")
    capabilities: dict[str, Any] = {}
    if params.get("capabilities") is not None:
        capabilities = _object(params["capabilities"], "capabilities")
        for key in ("thinking", "acpUpdates"):
            if key in capabilities and not isinstance(capabilities[key], bool):
                raise InvalidParams(f"capabilities.{key}", "must be true or false")
    agents: dict[str, AgentConfig] = {}
    if params.get("agents") is not None:
        for agent_id, raw in _object(params["agents"], "agents").items():
            if agent_id == DEMO_AGENT_ID:
                raise InvalidParams("agents.demo", "'demo' is the built-in demo agent; choose another id")
            if agent_id == EDITOR_MODELS_PREFIX:
                raise InvalidParams("agents.editor", "'editor' names the models editors share; choose another id")
            try:
                agents[agent_id] = agent_from_mapping(agent_id, raw)
            except ConfigError as exc:
                raise InvalidParams(exc.key or f"agents.{agent_id}", str(exc).split(": ", 1)[-1]) from None
    shared = params.get("editorModels")
    return EditorHello(
        client_info,
        tuple(folders or ()),
        capabilities.get("thinking", False),
        capabilities.get("acpUpdates", False),
        agents,
        parse_shared_models(shared, "editorModels") if shared is not None else (),
    )


def _short(value: Any) -> str:
    if isinstance(value, int) and value.bit_length() > 100:
        return "(a number too large)"  # repr() of a 4,300-digit integer is slow, and of a longer one fails
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def initialize_result(permission_tool: dict[str, Any]) -> dict[str, Any]:
    return {
        "protocolVersion": PROTOCOL_VERSION,
        "serverInfo": {"name": "lmbridge", "version": __version__},
        "permissionTool": permission_tool,
    }
