"""Agents on the editor's models, the pieces without a wire: how each known agent is pointed at lmbridge, Codex's
namespace tools through the Responses API, what a route's response objects leave out, and the editor model's input
limit."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bridge.config import AgentConfig
from bridge.http.agent_models import BASE_URL_VARIABLE, TOKEN_VARIABLE, pointed, recipe_for
from bridge.http.anthropic_messages import Messages
from bridge.http.api import ApiError, EditorTarget, HttpTurnResult, ParsedRequest
from bridge.http.openai_chat import ChatCompletions
from bridge.http.openai_responses import Responses, ResponsesBody, ResponseStore
from bridge.http.turns import _check_context
from bridge.service.shared_models import SharedModel


def _agent(command: str, *args: str, **fields: Any) -> AgentConfig:
    return AgentConfig("a", "A", command, tuple(args), model_source="editor", **fields)


@pytest.mark.parametrize(
    ("command", "args", "recipe"),
    [
        ("/opt/bin/claude-agent-acp", (), "claude"),
        ("npx", ("-y", "@agentclientprotocol/claude-agent-acp@0.101.0"), "claude"),
        ("codex-acp", (), "codex"),
        ("npx", ("@zed-industries/codex-acp",), "codex"),
        ("/usr/local/bin/opencode", ("acp",), "opencode"),
        ("gemini", ("--acp",), "env"),
        ("python", ("-m", "bridge.demo"), "env"),
    ],
)
def test_a_known_agent_is_recognised_by_its_command(command: str, args: tuple[str, ...], recipe: str) -> None:
    assert recipe_for(_agent(command, *args)) == recipe
    assert recipe_for(_agent(command, *args, model_recipe="env")) == "env"  # the config's word wins


def test_each_recipe_points_its_agent_at_the_route_and_keeps_what_the_user_set() -> None:
    url, token = "http://127.0.0.1:9/agent-model/r1", "t0k"
    claude = pointed(_agent("claude-agent-acp", env={"ANTHROPIC_API_KEY": "users-own", "KEEP": "1"}), url, token)
    assert claude.env["ANTHROPIC_BASE_URL"] == url
    assert claude.env["ANTHROPIC_API_KEY"] == claude.env["ANTHROPIC_AUTH_TOKEN"] == token
    assert claude.env["KEEP"] == "1" and "CLAUDE_CODE_USE_*" in claude.unset_env
    codex = pointed(_agent("codex-acp", "--flag"), url, token)
    assert codex.args[0] == "--flag" and 'model_provider="lmbridge"' in codex.args
    assert f"model_providers.lmbridge.base_url={json.dumps(url + '/v1')}" in codex.args
    assert f'model_providers.lmbridge.env_key="{TOKEN_VARIABLE}"' in codex.args
    opencode = json.loads(pointed(_agent("opencode", "acp"), url, token).env["OPENCODE_CONFIG_CONTENT"])
    assert opencode["provider"]["anthropic"]["options"] == {"baseURL": url + "/v1", "apiKey": token}
    for config in (claude, codex, pointed(_agent("my-agent"), url, token)):
        assert config.env[BASE_URL_VARIABLE] == url and config.env[TOKEN_VARIABLE] == token


def test_namespace_tools_are_offered_joined_and_their_calls_go_back_in_their_namespace() -> None:
    weather = {"type": "object", "properties": {"city": {"type": "string"}}}
    body = ResponsesBody.model_validate(
        {
            "model": "m",
            "input": [
                {"type": "message", "role": "user", "content": "weather?"},
                {"type": "function_call", "call_id": "c1", "name": "get_weather", "namespace": "mcp__editor",
                 "arguments": '{"city": "Oslo"}'},
                {"type": "function_call_output", "call_id": "c1", "output": "snow"},
            ],
            "tools": [
                {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
                {"type": "namespace", "name": "mcp__editor", "description": "the editor's tools",
                 "tools": [{"type": "function", "name": "get_weather", "parameters": weather}]},
            ],
        }
    )  # fmt: skip
    api = Responses(ResponseStore())
    request = api.parse(body)
    assert [tool["name"] for tool in request.tools] == ["exec_command", "mcp__editor__get_weather"]
    assert request.tools[1]["inputSchema"] == weather
    (call,) = request.messages[1]["content"]
    assert call["type"] == "tool_call" and call["name"] == "mcp__editor__get_weather"
    parts = [{"type": "tool_call", "callId": "c2", "name": "mcp__editor__get_weather", "input": {"city": "Rome"}}]
    response = api.body(request, HttpTurnResult("tool_calls", None, None, parts))
    (item,) = response["output"]
    assert (item["type"], item["namespace"], item["name"]) == ("function_call", "mcp__editor", "get_weather")
    stream = api.stream(request)
    events = b"".join(stream.start() + stream.part(parts[0]))
    assert b'"namespace":"mcp__editor"' in events.replace(b" ", b"")


def test_hosted_tools_are_refused_naming_the_tool() -> None:
    body = ResponsesBody.model_validate({"model": "m", "input": "hi", "tools": [{"type": "web_search"}]})
    with pytest.raises(ApiError, match="not 'web_search'") as refused:
        Responses(ResponseStore()).parse(body)
    assert refused.value.param == "tools[0].type"


def _events(chunks: list[bytes]) -> list[dict[str, Any]]:
    """The JSON of each server-sent event."""
    text = b"".join(chunks).decode()
    return [json.loads(line[len("data: ") :]) for line in text.splitlines() if line.startswith("data: ")]


@pytest.mark.parametrize("echo", [True, False])
def test_response_objects_repeat_the_requests_instructions_and_tools_except_on_an_agents_route(echo: bool) -> None:
    body = ResponsesBody.model_validate(
        {"model": "m", "input": "hi", "instructions": "Be \"brief\" — é", "metadata": {"k": "v"},
         "tools": [{"type": "function", "name": "read", "parameters": {"type": "object"}}]}
    )  # fmt: skip
    api = Responses(ResponseStore(), echo=echo)
    request = api.parse(body)
    stream = api.stream(request)
    done = HttpTurnResult("end_turn", None, None, [{"type": "text", "value": "ok"}])
    events = _events(stream.start() + stream.part({"type": "text", "value": "ok"}) + stream.finish(done))
    carrying = [event for event in events if "response" in event]
    assert [event["type"] for event in carrying] == ["response.created", "response.in_progress", "response.completed"]
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    whole = api.body(request, done)
    for event in carrying:
        response = event["response"]
        assert response["metadata"] == {"k": "v"} and response["model"] == "m"
        if echo:
            assert response["instructions"] == 'Be "brief" — é'
            assert response["tools"] == [{"type": "function", "name": "read", "parameters": {"type": "object"}}]
        else:
            assert "instructions" not in response and "tools" not in response
    assert carrying[-1]["response"]["output"][0]["content"][0]["text"] == "ok"
    assert ("tools" in whole) is echo and ("instructions" in whole) is echo


def test_a_prompt_over_the_editor_models_input_limit_is_refused_as_too_long() -> None:
    model = SharedModel("small", "Small", max_input_tokens=100)
    target = EditorTarget("small", model, link=object())  # type: ignore[arg-type]
    fits = ParsedRequest("small", [{"role": "user", "content": [{"type": "text", "value": "word " * 50}]}], [])
    _check_context(fits, target)
    long = ParsedRequest("small", [{"role": "user", "content": [{"type": "text", "value": "word " * 500}]}], [])
    with pytest.raises(ApiError, match=r"prompt is too long: \d+ tokens > 100 maximum") as refused:
        _check_context(long, target)
    assert refused.value.status == 400 and refused.value.kind == "invalid_request_error"
    unlimited = EditorTarget("big", SharedModel("big", "Big"), link=object())  # type: ignore[arg-type]
    _check_context(long, unlimited)


def test_the_input_limit_is_not_estimated_for_a_body_far_below_it() -> None:
    """Twice the body's bytes bounds the estimate: a request whose body is that small is not counted part by part
    (~0.1 ms per 10 KB); one whose body may be near the limit, or whose history is not all in its body, still is."""
    target = EditorTarget("m", SharedModel("m", "M", max_input_tokens=300), link=object())  # type: ignore[arg-type]
    long = ParsedRequest("m", [{"role": "user", "content": [{"type": "text", "value": "word " * 500}]}], [])
    long.body_bytes = 150  # (not this prompt's body: it shows the prompt is not counted)
    _check_context(long, target)
    for body_bytes in (0, 5_000):  # unknown (a stored history), or large
        long.body_bytes = body_bytes
        with pytest.raises(ApiError, match="prompt is too long"):
            _check_context(long, target)


@pytest.mark.parametrize("api", [Messages(), ChatCompletions()], ids=["messages", "chat"])
def test_the_estimate_is_at_most_twice_the_bodys_bytes(api: Any) -> None:
    """What the shortcut rests on, for bodies dense in what the estimate counts: short texts, tool calls, images,
    many messages, non-ASCII."""
    image = "iVBORw0KGgo="
    if isinstance(api, Messages):
        body = {
            "model": "m", "max_tokens": 5, "system": "é",
            "tools": [{"name": "t", "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}],
            "messages": [
                {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                          "data": image}}]},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "1", "name": "t", "input": {"a": 1}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "1", "content": "x"}]},
                *({"role": "user", "content": "日本"} for _ in range(20)),
            ],
        }  # fmt: skip
    else:
        body = {
            "model": "m",
            "tools": [{"type": "function", "function": {"name": "t", "parameters": {"type": "object"}}}],
            "messages": [
                {"role": "user", "content": [{"type": "image_url",
                                              "image_url": {"url": f"data:image/png;base64,{image}"}}]},
                {"role": "assistant", "tool_calls": [{"id": "1", "type": "function",
                                                      "function": {"name": "t", "arguments": '{"a":1,"b":[1,2]}'}}]},
                {"role": "tool", "tool_call_id": "1", "content": "x"},
                *({"role": "user", "content": "日本"} for _ in range(20)),
            ],
        }  # fmt: skip
    raw = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    request = api.parse(api.body_model.model_validate(json.loads(raw)))
    assert _estimate(request) <= 2 * len(raw)


def _estimate(request: ParsedRequest) -> int:
    """What ``_check_context`` counts, without a limit."""
    huge = EditorTarget("huge", SharedModel("huge", "Huge", max_input_tokens=1), link=object())  # type: ignore[arg-type]
    with pytest.raises(ApiError, match=r"prompt is too long: (\d+)") as refused:
        _check_context(ParsedRequest(request.model, request.messages, request.tools), huge)
    return int(refused.value.message.split(": ")[1].split(" ")[0])
