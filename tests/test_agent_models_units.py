"""Agents on the editor's models, the pieces without a wire: how each known agent is pointed at lmbridge, Codex's
namespace tools through the Responses API, and the editor model's input limit."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bridge.config import AgentConfig
from bridge.http.agent_models import BASE_URL_VARIABLE, TOKEN_VARIABLE, pointed, recipe_for
from bridge.http.api import ApiError, EditorTarget, HttpTurnResult, ParsedRequest
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
