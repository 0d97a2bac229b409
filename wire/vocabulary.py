"""The ACP words lmbridge relies on, spelled out once.

The official ``acp.schema`` models define them too, but importing the SDK takes most of a second; these constants
cost nothing to import, and ``tests/test_acp_vocabulary.py`` keeps them equal to the schema's.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

__all__ = ["PROTOCOL_VERSION", "STOP_REASONS", "TOOL_CALLS", "TURN_STOP_REASONS", "StopReason"]

PROTOCOL_VERSION: Final = 1

# ``session/prompt``'s ``stopReason`` (ACP v1 ``StopReason``).
StopReason = Literal["end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"]
STOP_REASONS: Final[tuple[str, ...]] = get_args(StopReason)

# A bridged turn may also end because the agent waits for the client: for its tools or a permission answer. Not an
# ACP stop reason (the agent's prompt is still running), but the one every front reports besides them.
TOOL_CALLS: Final = "tool_calls"
TURN_STOP_REASONS: Final[tuple[str, ...]] = (*STOP_REASONS, TOOL_CALLS)
