"""How a client shows what the agent does: the one piece of a turn request that is a client's habit, not the turn's.

Imports nothing of lmbridge.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ClientView"]


@dataclass(frozen=True, slots=True)
class ClientView:
    thinking: bool = False  # the client renders thinking parts (the agent's thoughts)
    acp_updates: bool = False  # the client wants each raw ACP update as a data part too
    activity_as_thinking: bool = False  # the agent's tool and plan lines go out as thinking parts, not text
