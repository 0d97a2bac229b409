"""Installs the launcher for agents on the editor's models (``bridge.http.agent_models``) in a service's agent pool,
importing the HTTP front only when such an agent starts: ``lmbridge stdio`` without one pays nothing for it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bridge.config import AgentConfig
from bridge.service.composition import BridgeService
from wire.observe.logger import Logger

if TYPE_CHECKING:
    from bridge.http.agent_models import AgentModelGateway

__all__ = ["install_agent_models"]


class _Launcher:
    def __init__(self, service: BridgeService, log: Logger) -> None:
        self._service = service
        self._log = log
        self.gateway: AgentModelGateway | None = None

    async def prepare(self, config: AgentConfig, principal: str | None) -> Any:  # bridge.acp.pool.Launch | None
        if not config.model_source:
            return None
        if self.gateway is None:
            from bridge.http.agent_models import AgentModelGateway
            from bridge.http.app import HttpSettings

            # Model requests at once, over every agent on the editor's models: the editors' own limits
            # ([editor_models] max_concurrent, each) are what bounds them.
            self.gateway = AgentModelGateway(self._service, HttpSettings(max_turns=1024), log=self._log)
        return await self.gateway.prepare(config, principal)


def install_agent_models(service: BridgeService, log: Logger) -> None:
    service.pool.launcher = _Launcher(service, log)
