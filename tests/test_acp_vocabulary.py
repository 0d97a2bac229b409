"""lmbridge spells the ACP words it relies on once, without importing the SDK; they must stay the schema's."""

from __future__ import annotations

import typing


def test_stop_reasons_are_the_acp_schemas() -> None:
    from acp.schema import PromptResponse

    from wire.vocabulary import STOP_REASONS

    assert typing.get_args(PromptResponse.model_fields["stop_reason"].annotation) == STOP_REASONS


def test_protocol_version_is_the_sdks() -> None:
    import acp

    from wire.vocabulary import PROTOCOL_VERSION

    assert PROTOCOL_VERSION == acp.PROTOCOL_VERSION
