"""The editor's own models in-process (``bridge.service.editor_models``): what an editor may share, the names clients
use, the loop guard, the limits, and one call's messages, parts, usage and errors — against a fake editor link, on a
mock clock."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from bridge.config import EditorModelSettings, ToolSettings
from bridge.service.editor_models import SYSTEM_MARKER, EditorGone, EditorModels
from bridge.service.shared_models import SharedModel, parse_shared_models
from wire.cancel import CancelRequest
from wire.errors import EditorModelError, InvalidParams, RpcError, TooManyRequests, UnknownModel
from wire.observe.logs import get_logger


class FakeLink:
    """An editor that answers ``editor/chat`` with ``script(params, on_part, cancel)``."""

    def __init__(self, label: str = "editor", script: Any = None) -> None:
        self.label = label
        self.params: list[dict[str, Any]] = []
        self.script = script or _say("hello there")

    async def editor_chat(self, params: dict[str, Any], on_part: Any, cancel: CancelRequest) -> Any:
        self.params.append(params)
        return await self.script(params, on_part, cancel)


def _say(text: str, usage: dict[str, Any] | None = None) -> Any:
    async def script(params: dict[str, Any], on_part: Any, cancel: CancelRequest) -> Any:
        for word in text.split(" "):
            await on_part({"type": "text", "value": word + " "})
        await on_part({"type": "mystery", "value": "ignored"})
        return {"stopReason": "end_turn", **({"usage": usage} if usage else {})}

    return script


def _models(*ids: str, tool_calling: bool = True, vendor: str = "copilot") -> tuple[SharedModel, ...]:
    raw = [{"id": i, "name": i.upper(), "vendor": vendor, "capabilities": {"toolCalling": tool_calling}} for i in ids]
    return parse_shared_models(raw, "editorModels")


def _service(**settings: Any) -> EditorModels:
    return EditorModels(
        EditorModelSettings(**settings),
        ToolSettings(),
        own_models=lambda: ["demo", "demo/demo-large"],
        log=get_logger(),
    )


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "value": text}]}


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ("gpt", "editorModels"),
        ([{"name": "no id"}], "editorModels[0].id"),
        ([{"id": "a", "name": "A"}, {"id": "a", "name": "again"}], "editorModels[1].id"),
        ([{"id": "a", "name": "A", "maxInputTokens": -1}], "editorModels[0].maxInputTokens"),
        (
            [{"id": "a", "name": "A", "capabilities": {"toolCalling": "yes"}}],
            "editorModels[0].capabilities.toolCalling",
        ),
    ],
)
def test_a_malformed_shared_model_is_refused_naming_the_field(raw: Any, field: str) -> None:
    with pytest.raises(InvalidParams) as refused:
        parse_shared_models(raw, "editorModels")
    assert refused.value.data["field"] == field


def test_models_of_lmbridges_own_are_never_taken_back() -> None:
    own_ids = ["demo", "demo/demo-large"]
    service = EditorModels(EditorModelSettings(), ToolSettings(), own_models=lambda: own_ids, log=get_logger())
    link = FakeLink()
    own = parse_shared_models(
        [
            {"id": "demo", "name": "lmbridge's demo agent"},
            {"id": "x", "name": "X", "vendor": "lmbridge"},
            {"id": "editor/y", "name": "Y"},
            {"id": "gpt", "name": "GPT"},
        ],
        "editorModels",
    )
    kept = service.share(link, own)
    assert [m.id for m in kept] == ["gpt"]
    assert [name for name, _, _ in service.listed()] == ["editor/gpt"]
    # An agent of lmbridge's lists a model of that name later: it is no longer taken back either.
    own_ids.append("gpt")
    service.own_models_changed()
    assert service.listed() == []


def test_two_editors_sharing_one_id_are_told_apart_and_an_editor_that_leaves_takes_its_models() -> None:
    service = _service()
    first, second = FakeLink("first"), FakeLink("second")
    changes: list[int] = []
    service.watch(lambda: changes.append(1))
    service.share(first, _models("gpt", "claude"))
    service.share(second, _models("gpt"))
    assert [name for name, _, _ in service.listed()] == ["editor/gpt", "editor/claude", "editor/gpt@2"]
    assert service.resolve("editor/gpt@2")[1] is second
    assert service.resolve("editor/gpt@1")[1] is first  # every editor's own numbered name answers too
    service.withdraw(first)
    assert [name for name, _, _ in service.listed()] == ["editor/gpt"]  # the plain name: whoever shares it now
    assert service.resolve("editor/gpt@2")[1] is second  # the numbered name stays with its editor
    with pytest.raises(UnknownModel):
        service.resolve("editor/gpt@1")  # editor 1 has gone
    with pytest.raises(UnknownModel) as unknown:
        service.resolve("editor/claude")
    assert unknown.value.known == ["editor/gpt"]
    assert len(changes) == 3


async def test_a_call_sends_the_system_prompt_as_the_first_user_message_and_streams_the_parts() -> None:
    service = _service()
    link = FakeLink(script=_say("fine thanks"))
    (model,) = service.share(link, _models("gpt"))
    parts: list[dict[str, Any]] = []

    async def sink(part: dict[str, Any]) -> None:
        parts.append(part)

    system = {"role": "system", "content": [{"type": "text", "value": "Be brief."}]}
    answer = await service.call(link, model, [system, _user("how are you?")], sink, CancelRequest(), max_tokens=50)
    assert link.params[0]["messages"] == [_user(f"{SYSTEM_MARKER}\nBe brief."), _user("how are you?")]
    assert link.params[0]["options"] == {"maxTokens": 50}
    assert answer.text == "fine thanks " and parts == list(answer.parts)  # the unknown part type was dropped
    assert answer.stop_reason == "end_turn"
    assert answer.usage is not None and answer.usage["estimated"] is True and answer.usage["outputTokens"] > 0


async def test_tools_for_a_model_that_cannot_call_tools_are_refused_before_the_editor_is_asked() -> None:
    service = _service()
    link = FakeLink()
    (model,) = service.share(link, _models("small", tool_calling=False))
    tool = {"name": "get_weather", "description": "", "inputSchema": {"type": "object"}}
    with pytest.raises(InvalidParams) as refused:
        await service.call(link, model, [_user("hi")], _nothing, CancelRequest(), tools=[tool])
    assert refused.value.data["field"] == "tools" and link.params == []


async def test_the_editors_limit_of_calls_at_once_and_its_errors(autojump_clock: trio.testing.MockClock) -> None:
    service = _service(max_concurrent=1, timeout=30.0)
    started = trio.Event()

    async def forever(params: dict[str, Any], on_part: Any, cancel: CancelRequest) -> Any:
        started.set()
        await trio.sleep_forever()

    link = FakeLink(script=forever)
    (model,) = service.share(link, _models("gpt"))
    errors: list[Exception] = []

    async def slow_call() -> None:
        try:
            await service.call(link, model, [_user("hi")], _nothing, CancelRequest())
        except EditorModelError as error:
            errors.append(error)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(slow_call)
        await started.wait()
        with pytest.raises(TooManyRequests):
            await service.call(link, model, [_user("me too")], _nothing, CancelRequest())
    assert "did not answer within 30 s" in str(errors[0])  # the timeout, on the mock clock

    async def refuses(params: dict[str, Any], on_part: Any, cancel: CancelRequest) -> Any:
        raise RpcError(-32000, "the user did not give consent")

    async def leaves(params: dict[str, Any], on_part: Any, cancel: CancelRequest) -> Any:
        raise EditorGone

    for script, words in ((refuses, "did not give consent"), (leaves, "went away")):
        link.script = script
        with pytest.raises(EditorModelError) as failed:
            await service.call(link, model, [_user("hi")], _nothing, CancelRequest())
        assert words in str(failed.value)


async def test_the_tool_lists_the_models_streams_progress_and_gives_structured_content() -> None:
    service = _service()
    link = FakeLink(script=_say("forty two", usage={"inputTokens": 9, "outputTokens": 2}))
    service.share(link, _models("gpt", "claude"))
    (tool,) = service.tools_for(link)
    assert tool.name == "editor_model" and tool.annotations == {"readOnlyHint": True}
    assert "- gpt: GPT" in tool.description and "- claude: CLAUDE" in tool.description
    assert tool.input_schema["properties"]["model"]["enum"] == ["gpt", "claude"]
    notes: list[tuple[float, str]] = []

    async def progress(value: float, message: str) -> None:
        notes.append((value, message))

    result = await tool.run({"prompt": "6 * 7?", "model": "claude"}, progress)
    assert result["content"] == [{"type": "text", "text": "forty two "}] and result["isError"] is False
    assert result["structuredContent"] == {
        "model": "claude",
        "text": "forty two ",
        "stopReason": "end_turn",
        "usage": {"inputTokens": 9, "outputTokens": 2},
    }
    assert notes == [(1.0, "forty "), (2.0, "forty two ")]
    assert service.tools_for(FakeLink("shares nothing")) == []
    unknown = await tool.run({"prompt": "hi", "model": "gone"}, None)
    assert unknown["isError"] and "no model 'gone'" in unknown["content"][0]["text"]


async def _nothing(part: dict[str, Any]) -> None:
    return None


async def test_a_call_of_the_tool_is_withdrawn_when_the_prompt_is_cancelled_and_the_editor_is_told() -> None:
    # The agent may never cancel its MCP call when its prompt is cancelled: the session's signal withdraws it.
    from mcp_synthetic.server import SessionTools

    asked, told = trio.Event(), trio.Event()

    async def waits(params: dict[str, Any], on_part: Any, cancel: CancelRequest) -> Any:
        asked.set()
        try:
            await trio.sleep_forever()
        finally:
            told.set()  # the editor's call is cancelled with its caller ($/cancelRequest, in the real link)

    service, link, prompt_cancelled = _service(), FakeLink(script=waits), CancelRequest()
    service.share(link, _models("gpt"))

    async def invoke(name: str, arguments: Any) -> Any:
        raise AssertionError("not an editor tool")

    tools = SessionTools(invoke, log=get_logger(), prompt_cancelled=lambda: prompt_cancelled)
    tools.set_local(service.tools_for(link))
    results: list[dict[str, Any]] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _append(results, tools.call("editor_model", {"prompt": "hi"})))
        await asked.wait()
        prompt_cancelled.set()
    assert told.is_set()
    (result,) = results
    assert result["isError"] and "cancelled the request" in result["content"][0]["text"]


async def test_what_the_editor_reports_badly_is_estimated_or_dropped_not_passed_on() -> None:
    service, link = _service(), FakeLink()
    service.share(link, _models("gpt"))
    (model,) = service.shared_by(link)
    for usage in ({"inputTokens": None, "outputTokens": 2}, {"inputTokens": "12x"}, {"outputTokens": -1}):
        link.script = _say("hi", usage=usage)
        answer = await service.call(link, model, [_user("hi")], _nothing, CancelRequest())
        assert answer.usage is not None and answer.usage["estimated"] is True, usage

    async def calls(params: dict[str, Any], on_part: Any, cancel: CancelRequest) -> Any:
        await on_part({"type": "tool_call", "callId": "a", "name": "f", "input": '{"x": 1}'})  # arguments as text
        await on_part({"type": "tool_call", "callId": "b", "name": "f", "input": [1, 2]})  # not an object: dropped
        return {"stopReason": "tool_calls"}

    link.script = calls
    answer = await service.call(link, model, [_user("hi")], _nothing, CancelRequest())
    assert [p["input"] for p in answer.parts] == [{"x": 1}]


async def test_a_progress_note_the_agent_cannot_take_costs_the_note_not_the_answer() -> None:
    service, link = _service(), FakeLink(script=_say("forty two"))
    service.share(link, _models("gpt"))
    (tool,) = service.tools_for(link)

    async def broken(value: float, message: str) -> None:
        raise trio.BrokenResourceError("the agent's connection is gone")

    result = await tool.run({"prompt": "6 * 7?"}, broken)
    assert result["isError"] is False and result["content"] == [{"type": "text", "text": "forty two "}]


async def _append(results: list[Any], call: Any) -> None:
    results.append(await call)
