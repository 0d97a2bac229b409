"""Who asks: the principal a front's request acts for, and what it may do.

Owns the ``Principal`` value (an id that scopes every conversation it opens, its scopes, the agents it may use) and
the local principal of a process with one user (``lmbridge stdio``). Keys and how a principal is recognised live in
``bridge.daemon.keys``; the session path only ever sees the id (``TurnRequest.principal``).
"""

from __future__ import annotations

from dataclasses import dataclass

from wire.errors import ScopeMissing

__all__ = ["LOCAL", "SCOPES", "Principal"]

# What a key may be given (docs/daemon.md#keys): ``chat`` runs turns and shares the editor's models, ``models``
# lists the models, ``metrics`` reads the metrics, ``admin`` sees the daemon's state (every principal's counts).
SCOPES = ("chat", "models", "metrics", "admin")


@dataclass(frozen=True, slots=True)
class Principal:
    """``id`` keeps conversations apart (never reused: a new key with an old name is someone else), ``name`` is what
    logs and the operator call it. ``agents``: the agents it may use (``None``: all), others are as if absent."""

    id: str
    name: str
    scopes: frozenset[str] = frozenset(SCOPES)
    agents: frozenset[str] | None = None

    def require(self, scope: str) -> None:
        """``ScopeMissing`` (-32006; 403 over HTTP) unless the principal has ``scope``."""
        if scope not in self.scopes:
            raise ScopeMissing(scope, list(self.scopes))

    def may_use(self, agent_id: str) -> bool:
        return self.agents is None or agent_id in self.agents


LOCAL = Principal("", "local")  # a process with one user: every scope, no scoping of its conversations
