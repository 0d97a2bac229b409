"""A model the test editor shares whose answers come from the fake model: each ``editor/chat`` lmbridge sends the
editor is passed on to the fake model server as one streamed Anthropic Messages request (with the official
``anthropic`` SDK), the way a real editor's model provider calls its API, and the answer streams back as parts.

So an agent on the editor's models (``model_source``) is scripted exactly as one on its own model: the fake model
sees the agent's prompt, tools and tool results, carried by lmbridge to the editor and by the editor to it.
"""

from __future__ import annotations

from typing import Any

import anthropic
import trio

from bridge.service.editor_models import SYSTEM_MARKER

__all__ = ["ForwardingEditorModel"]

_STOP_REASONS = {"end_turn": "end_turn", "tool_use": "tool_calls", "max_tokens": "max_tokens"}


class ForwardingEditorModel:
    """``models`` is what the editor shares (``initialize.editorModels``); ``answer`` serves ``editor/chat``
    (``EditorClient.serve_models``); ``calls`` keeps every ``editor/chat``'s params, ``cancelled`` counts the calls
    lmbridge cancelled."""

    def __init__(self, base_url: str, model_id: str = "fake-editor-model") -> None:
        self.models = [
            {
                "id": model_id,
                "name": "Fake editor model",
                "vendor": "test-vendor",
                "family": "fake",
                "maxInputTokens": 200_000,
                "maxOutputTokens": 32_000,
                "capabilities": {"toolCalling": True, "imageInput": True},
            }
        ]
        self.calls: list[dict[str, Any]] = []
        self.cancelled = 0
        self._client = anthropic.AsyncAnthropic(base_url=base_url, api_key="dummy", max_retries=0)

    async def answer(self, params: dict[str, Any], send_part: Any, cancel: Any) -> dict[str, Any]:
        self.calls.append(params)
        options = params.get("options") or {}
        tools = [
            {"name": t["name"], "description": t.get("description", ""), "input_schema": t["inputSchema"]}
            for t in options.get("tools") or ()
        ]
        messages = list(params["messages"])
        request: dict[str, Any] = {"model": params["modelId"], "max_tokens": options.get("maxTokens") or 32_000}
        system = _system(messages[0]) if messages else None
        if system is not None:  # as a provider with a system role passes lmbridge's instructions on
            request["system"] = system
            messages = messages[1:]
        request["messages"] = [_message(m) for m in messages]
        if tools:
            request["tools"] = tools
        stop_reason = "cancelled"
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                await cancel.wait()
                self.cancelled += 1
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            async with self._client.messages.stream(**request) as stream:
                async for event in stream:
                    if event.type == "text":
                        await send_part({"type": "text", "value": event.text})
                final = await stream.get_final_message()
            for block in final.content:
                if block.type == "tool_use":
                    await send_part({"type": "tool_call", "callId": block.id, "name": block.name, "input": block.input})
            stop_reason = _STOP_REASONS.get(final.stop_reason or "", "end_turn")
            usage = {"inputTokens": final.usage.input_tokens, "outputTokens": final.usage.output_tokens}
            nursery.cancel_scope.cancel()
        if stop_reason == "cancelled":
            return {"stopReason": "cancelled"}
        return {"stopReason": stop_reason, "usage": usage}


def _system(message: dict[str, Any]) -> str | None:
    """The system prompt, when ``message`` is the user message lmbridge writes it as (``SYSTEM_MARKER`` first)."""
    content = message["content"]
    if message["role"] != "user" or len(content) != 1 or content[0]["type"] != "text":
        return None
    text: str = content[0]["value"]
    return text.removeprefix(SYSTEM_MARKER + "\n") if text.startswith(SYSTEM_MARKER + "\n") else None


def _message(message: dict[str, Any]) -> dict[str, Any]:
    return {"role": message["role"], "content": [_block(part) for part in message["content"]]}


def _block(part: dict[str, Any]) -> dict[str, Any]:
    kind = part["type"]
    if kind == "text":
        return {"type": "text", "text": part["value"]}
    if kind == "thinking":
        return {"type": "text", "text": part["value"]}
    if kind == "tool_call":
        return {"type": "tool_use", "id": part["callId"], "name": part["name"], "input": part.get("input") or {}}
    if kind == "tool_result":
        return {
            "type": "tool_result",
            "tool_use_id": part["callId"],
            "content": [_block(inner) for inner in part["content"]],
            **({"is_error": True} if part.get("isError") else {}),
        }
    if kind == "data":
        return {"type": "image", "source": {"type": "base64", "media_type": part["mimeType"], "data": part["data"]}}
    raise ValueError(f"an editor message part lmbridge should not send: {part!r}")
