"""The HTTP API front over real sockets, driven by the official ``openai`` and ``anthropic`` SDKs (and raw HTTP for
what an SDK cannot send): every endpoint streaming and not, client tools, the permission conversation, edited
history, concurrent conversations, disconnects, every error row of docs/http.md, and the token on every endpoint."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anthropic
import openai
import pytest
from conftest import processes_with_marker
from http_daemon import HttpDaemon, http_daemon, write_config

pytestmark = pytest.mark.wire  # lmbridge and its agents as processes: make test, not make check

NESTED_SCHEMA = {
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "range": {
            "type": "object",
            "properties": {"start": {"type": "integer"}, "end": {"type": "integer"}},
            "required": ["start"],
        },
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["path"],
}
CHAT_TOOL = {
    "type": "function",
    "function": {"name": "read_file", "description": "Read a file", "parameters": NESTED_SCHEMA},
}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpDaemon]:
    directory = tmp_path_factory.mktemp("http")
    marker = uuid.uuid4().hex
    with http_daemon(directory, write_config(directory / "config.toml", marker)) as live:
        yield live
    assert live.process.returncode == 0, live.stderr[-3000:]
    assert processes_with_marker(marker) == [], "an agent process outlived the daemon"


@pytest.fixture
def oai(daemon: HttpDaemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key=daemon.token, max_retries=0, timeout=30)


@pytest.fixture
def claude(daemon: HttpDaemon) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=daemon.url, api_key=daemon.token, max_retries=0, timeout=30)


def raw(daemon: HttpDaemon, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None):
    """One request with http.client: status, headers, parsed body (or text for an event stream)."""
    parts = urlsplit(daemon.url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    sent = {"content-type": "application/json", **(headers or {})}
    connection.request(method, path, body=data, headers=sent)
    response = connection.getresponse()
    text = response.read().decode()
    connection.close()
    kind = response.getheader("content-type") or ""
    return response.status, dict(response.getheaders()), json.loads(text) if "json" in kind else text


def bearer(daemon: HttpDaemon) -> dict[str, str]:
    return {"authorization": f"Bearer {daemon.token}"}


def conversation() -> dict[str, str]:
    return {"x-lmbridge-conversation": uuid.uuid4().hex}


# -- models and the token ------------------------------------------------------------------------------------------


def test_models_lists_the_agents(oai: openai.OpenAI) -> None:
    ids = [model.id for model in oai.models.list() if "/" not in model.id]
    assert ids == ["demo", "scripted", "missing"]
    assert oai.models.retrieve("scripted").id == "scripted"
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("nobody")


def test_an_agents_own_models_are_listed_once_a_session_showed_them_and_choose_the_model(oai: openai.OpenAI) -> None:
    ask = {"messages": [{"role": "user", "content": "/options"}], "extra_headers": conversation()}
    answer = oai.chat.completions.create(model="scripted", **ask)  # type: ignore[call-overload]
    assert 'model="demo-small"' in answer.choices[0].message.content
    listed = {model.id: model for model in oai.models.list()}
    assert listed["scripted/demo-large"].model_dump()["display_name"] == "Scripted test agent: Demo Large"
    assert oai.models.retrieve("scripted/demo-large").id == "scripted/demo-large"
    answer = oai.chat.completions.create(model="scripted/demo-large", **ask)  # type: ignore[call-overload]
    assert 'model="demo-large"' in answer.choices[0].message.content
    with pytest.raises(openai.NotFoundError) as error:
        oai.chat.completions.create(model="scripted/demo-huge", **ask)  # type: ignore[call-overload]
    assert "scripted/demo-large" in str(error.value)


def test_a_request_chooses_the_agents_options_and_effort_in_each_api(
    oai: openai.OpenAI, claude: anthropic.Anthropic
) -> None:
    def options_said(text: str) -> str:
        assert text.startswith("options: "), text
        return text.strip()

    ask = [{"role": "user", "content": "/options"}]
    chat = oai.chat.completions.create(
        model="scripted", messages=ask, reasoning_effort="high", extra_headers=conversation(),  # type: ignore[arg-type]
        extra_body={"model_options": {"verbose": True}},
    )  # fmt: skip
    assert 'effort="high"' in options_said(chat.choices[0].message.content or "")
    assert "verbose=true" in chat.choices[0].message.content  # type: ignore[operator]
    response = oai.responses.create(
        model="scripted/demo-large", input="/options", reasoning={"effort": "low"}, extra_headers=conversation()
    )
    assert 'effort="low" mode="code" model="demo-large"' in options_said(response.output_text)
    extra = {"output_config": {"effort": "high"}, "model_options": {"mode": "plan"}}
    message = claude.messages.create(
        model="scripted", max_tokens=100, messages=[{"role": "user", "content": "/options"}],
        extra_headers=conversation(), extra_body=extra,
    )  # fmt: skip
    said = options_said(message.content[0].text)  # type: ignore[union-attr]
    assert 'effort="high"' in said and 'mode="plan"' in said
    # An effort the agent does not offer is what clients send by habit: the agent's own stays.
    habit = oai.chat.completions.create(
        model="scripted",
        messages=ask,
        reasoning_effort="minimal",
        extra_headers=conversation(),  # type: ignore[arg-type]
    )
    assert 'effort="medium"' in options_said(habit.choices[0].message.content or "")
    # model_options are checked: the wrong kind at once, an option the agent lacks when the session starts.
    for wrong, param in (({"mode": 3}, "model_options.mode"), ([], "model_options")):
        with pytest.raises(openai.BadRequestError) as error:
            oai.chat.completions.create(model="scripted", messages=ask, extra_body={"model_options": wrong})  # type: ignore[arg-type]
        assert error.value.body["param"] == param  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as error:
        oai.chat.completions.create(
            model="scripted",
            messages=ask,
            extra_body={"model_options": {"mode": "yolo"}},
            extra_headers=conversation(),  # type: ignore[arg-type]
        )
    assert "must be one of ask, code, plan" in str(error.value)


ENDPOINTS = [
    ("GET", "/v1/models"),
    ("GET", "/v1/models/demo"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/responses"),
    ("GET", "/v1/responses/resp_x"),
    ("POST", "/v1/messages"),
    ("POST", "/v1/messages/count_tokens"),
]


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
@pytest.mark.parametrize("credential", [None, "Bearer wrong-token-0123456789", "Basic abc"])
def test_every_endpoint_wants_the_token(daemon: HttpDaemon, method: str, path: str, credential: str | None) -> None:
    headers = {"authorization": credential} if credential else {}
    status, response_headers, body = raw(daemon, method, path, {"model": "demo"}, headers)
    assert status == 401
    assert response_headers.get("www-authenticate") == "Bearer"
    if path.startswith("/v1/messages"):
        assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
    else:
        assert body["error"]["type"] == "authentication_error"
    assert daemon.token not in json.dumps(body)


def test_x_api_key_is_accepted_and_the_sdks_send_it(daemon: HttpDaemon, claude: anthropic.Anthropic) -> None:
    status, _, body = raw(daemon, "GET", "/v1/models", headers={"x-api-key": daemon.token})
    assert status == 200 and body["object"] == "list"
    bad = anthropic.Anthropic(base_url=daemon.url, api_key="wrong-token-0123456789", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.create(model="demo", max_tokens=100, messages=[{"role": "user", "content": "hi"}])


def test_browser_origins_are_refused_unless_allowed(daemon: HttpDaemon) -> None:
    headers = {**bearer(daemon), "origin": "https://evil.example"}
    status, response_headers, body = raw(daemon, "GET", "/v1/models", headers=headers)
    assert status == 403 and "origin" in body["error"]["message"]
    assert "access-control-allow-origin" not in {k.lower() for k in response_headers}


# -- Chat Completions ----------------------------------------------------------------------------------------------


def test_chat_completion_and_its_stream(oai: openai.OpenAI) -> None:
    done = oai.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hello there"}])
    assert done.choices[0].message.content == "echo: hello there\n"
    assert done.choices[0].finish_reason == "stop"
    assert done.usage is None  # the demo agent reports no token counts: said, not invented

    chunks = list(
        oai.chat.completions.create(
            model="demo",
            messages=[{"role": "user", "content": "/stream 5"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.split() == ["1", "2", "3", "4", "5"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is None


@pytest.mark.smoke
def test_chat_tool_round_trip_with_a_nested_schema(oai: openai.OpenAI) -> None:
    messages: list[Any] = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": '/tool read_file {"path": "a.txt", "range": {"start": 2}, "tags": ["x"]}'},
    ]
    first = oai.chat.completions.create(model="demo", messages=messages, tools=[CHAT_TOOL])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "read_file"
    assert json.loads(call.function.arguments) == {"path": "a.txt", "range": {"start": 2}, "tags": ["x"]}
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "the contents"},
    ]
    second = oai.chat.completions.create(model="demo", messages=messages, tools=[CHAT_TOOL])
    assert "the contents" in (second.choices[0].message.content or "")
    assert second.choices[0].finish_reason == "stop"


def test_parallel_calls_come_in_one_response_and_results_may_come_back_in_any_order(oai: openai.OpenAI) -> None:
    prompt = '/tools read_file {"path": "a"} | read_file {"path": "b"} | read_file {"path": "c"}'
    messages: list[Any] = [{"role": "user", "content": prompt}]
    stream = oai.chat.completions.create(model="demo", messages=messages, tools=[CHAT_TOOL], stream=True)
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in stream:
        for delta in chunk.choices[0].delta.tool_calls or []:
            entry = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            entry["id"] += delta.id or ""
            entry["name"] += (delta.function.name or "") if delta.function else ""
            entry["arguments"] += (delta.function.arguments or "") if delta.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert sorted(json.loads(c["arguments"])["path"] for c in calls.values()) == ["a", "b", "c"]
    tool_calls = [
        {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
        for c in calls.values()
    ]
    messages.append({"role": "assistant", "content": None, "tool_calls": tool_calls})
    for c in reversed(list(calls.values())):
        path = json.loads(c["arguments"])["path"]
        messages.append({"role": "tool", "tool_call_id": c["id"], "content": f"contents of {path}"})
    done = oai.chat.completions.create(model="demo", messages=messages, tools=[CHAT_TOOL])
    text = done.choices[0].message.content or ""
    assert all(f"contents of {p}" in text for p in "abc"), text


def test_an_edited_message_is_answered_in_the_same_session(daemon: HttpDaemon, oai: openai.OpenAI) -> None:
    headers = conversation()
    first = [{"role": "user", "content": "/say first"}]
    offset = len(daemon.stderr)
    r1 = oai.chat.completions.create(model="demo", messages=first, extra_headers=headers)
    history: list[Any] = [*first, {"role": "assistant", "content": r1.choices[0].message.content}]
    second = oai.chat.completions.create(
        model="demo", messages=[*history, {"role": "user", "content": "/say second"}], extra_headers=headers
    )
    assert second.choices[0].message.content == "second\n"
    edited = oai.chat.completions.create(
        model="demo", messages=[*history, {"role": "user", "content": "/say edited"}], extra_headers=headers
    )
    assert edited.choices[0].message.content == "edited\n"
    # One session served all three: the edit was sent to it as the new input (as for the editor front).
    assert daemon.stderr[offset:].count("session opened") == 1


# -- Responses -----------------------------------------------------------------------------------------------------


RESPONSES_TOOL = {"type": "function", "name": "read_file", "description": "Read a file", "parameters": NESTED_SCHEMA}


def test_responses_text_reasoning_and_the_store(oai: openai.OpenAI) -> None:
    response = oai.responses.create(model="demo", input="/think pondering\n/say done", instructions="Be brief.")
    assert response.status == "completed"
    assert response.output_text == "done\n"
    kinds = [item.type for item in response.output]
    assert kinds == ["reasoning", "message"]
    assert "pondering" in response.output[0].summary[0].text
    again = oai.responses.retrieve(response.id)
    assert again.id == response.id and again.output_text == "done\n"
    unstored = oai.responses.create(model="demo", input="hi", store=False)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(unstored.id)


def test_responses_stream_with_the_sdk_helper(oai: openai.OpenAI) -> None:
    with oai.responses.stream(
        model="demo", input="/think a thought\n/plan one; two\n/say streamed words", instructions="Be brief."
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert events[0].response.instructions == final.instructions == "Be brief."  # as OpenAI's objects repeat it
    assert events[0].response.tools == final.tools == []
    assert "response.output_text.delta" in kinds and "response.reasoning_summary_text.delta" in kinds
    assert final.output_text == "streamed words\n"
    reasoning = "".join(s.text for item in final.output if item.type == "reasoning" for s in item.summary)
    assert "a thought" in reasoning and "Plan:" in reasoning  # the plan is activity: reasoning, not text


def test_responses_function_calls_continue_with_previous_response_id(oai: openai.OpenAI) -> None:
    first = oai.responses.create(
        model="demo",
        input='/tools read_file {"path": "x"} | read_file {"path": "y"}',
        tools=[RESPONSES_TOOL],
        stream=True,
    )
    events = list(first)
    assert [e.type for e in events].count("response.function_call_arguments.done") == 2
    completed = events[-1].response
    calls = [item for item in completed.output if item.type == "function_call"]
    assert len(calls) == 2
    outputs = [
        {"type": "function_call_output", "call_id": c.call_id, "output": f"body of {json.loads(c.arguments)['path']}"}
        for c in calls
    ]
    second = oai.responses.create(
        model="demo", previous_response_id=completed.id, input=outputs, tools=[RESPONSES_TOOL]
    )
    assert "body of x" in second.output_text and "body of y" in second.output_text


def test_an_unknown_previous_response_is_a_400(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        oai.responses.create(model="demo", previous_response_id="resp_nothing", input="hi")
    assert caught.value.body["param"] == "previous_response_id"


# -- Anthropic Messages ---------------------------------------------------------------------------------------------


ANTHROPIC_TOOL = {"name": "read_file", "description": "Read a file", "input_schema": NESTED_SCHEMA}


def test_messages_text_thinking_and_stream(claude: anthropic.Anthropic) -> None:
    message = claude.messages.create(
        model="demo", max_tokens=1000, system="Be brief.", messages=[{"role": "user", "content": "/think hmm\n/say ok"}]
    )
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert message.content[1].text == "ok\n" and message.stop_reason == "end_turn"
    assert message.usage.input_tokens == 0  # nothing reported by the agent: zeros, as documented

    with claude.messages.stream(
        model="demo", max_tokens=1000, messages=[{"role": "user", "content": "/run Listing files\n/stream 3"}]
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert final.content[-1].type == "text" and final.content[-1].text.split() == ["1", "2", "3"]
    assert any(b.type == "thinking" and "Listing files" in b.thinking for b in final.content)


def test_messages_tool_use_round_trip_with_list_results(claude: anthropic.Anthropic) -> None:
    messages: list[Any] = [{"role": "user", "content": '/tools read_file {"path": "p"} | read_file {"path": "q"}'}]
    first = claude.messages.create(model="demo", max_tokens=1000, messages=messages, tools=[ANTHROPIC_TOOL])
    assert first.stop_reason == "tool_use"
    uses = [block for block in first.content if block.type == "tool_use"]
    assert sorted(u.input["path"] for u in uses) == ["p", "q"]
    messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]})
    results = [
        {
            "type": "tool_result",
            "tool_use_id": u.id,
            "content": [{"type": "text", "text": f"text of {u.input['path']}"}],
        }
        for u in reversed(uses)
    ]
    messages.append({"role": "user", "content": results})
    with claude.messages.stream(model="demo", max_tokens=1000, messages=messages, tools=[ANTHROPIC_TOOL]) as stream:
        final = stream.get_final_message()
    text = "".join(b.text for b in final.content if b.type == "text")
    assert "text of p" in text and "text of q" in text and final.stop_reason == "end_turn"


def test_count_tokens_is_an_estimate(claude: anthropic.Anthropic) -> None:
    short = claude.messages.count_tokens(model="demo", messages=[{"role": "user", "content": "hi"}])
    long = claude.messages.count_tokens(model="demo", messages=[{"role": "user", "content": "word " * 400}])
    assert 0 < short.input_tokens < long.input_tokens
    assert 400 <= long.input_tokens <= 800


# -- permission ----------------------------------------------------------------------------------------------------


def test_a_permission_request_is_a_question_and_the_next_message_answers_it(oai: openai.OpenAI) -> None:
    headers = conversation()
    messages: list[Any] = [{"role": "user", "content": "/say first I ask\n/permission rm -rf build"}]
    asked = oai.chat.completions.create(model="demo", messages=messages, extra_headers=headers)
    question = asked.choices[0].message.content or ""
    assert asked.choices[0].finish_reason == "stop"
    assert question.startswith("first I ask\n")
    assert "The agent asks for permission: rm -rf build" in question
    assert "1. Allow once (allow)" in question and "3. Reject (reject)" in question
    messages += [{"role": "assistant", "content": question}, {"role": "user", "content": "2"}]
    answered = oai.chat.completions.create(model="demo", messages=messages, extra_headers=headers)
    assert "permission outcome: allow-always" in (answered.choices[0].message.content or "")


@pytest.mark.parametrize(("reply", "outcome"), [("allow", "allow-once"), ("Reject.", "reject-once")])
def test_permission_answers_in_words_over_messages(claude: anthropic.Anthropic, reply: str, outcome: str) -> None:
    messages: list[Any] = [{"role": "user", "content": f"/permission deploy {uuid.uuid4().hex[:6]}"}]
    asked = claude.messages.create(model="demo", max_tokens=100, messages=messages)
    assert asked.stop_reason == "end_turn"
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in asked.content]},
        {"role": "user", "content": reply},
    ]
    answered = claude.messages.create(model="demo", max_tokens=100, messages=messages)
    assert f"permission outcome: {outcome}" in "".join(b.text for b in answered.content if b.type == "text")


def test_an_agents_question_is_asked_in_words_and_a_json_reply_fills_the_form(oai: openai.OpenAI) -> None:
    headers = conversation()
    messages: list[Any] = [{"role": "user", "content": "/elicit name:string age:integer | Who are you?"}]
    asked = oai.chat.completions.create(model="demo", messages=messages, extra_headers=headers)
    question = asked.choices[0].message.content or ""
    assert question.startswith(
        "The agent asks: Who are you?\n  name (string, required)\n  age (integer, required)\n"
    ), question
    messages += [{"role": "assistant", "content": question}, {"role": "user", "content": '{"name": "Ada", "age": 36}'}]
    answered = oai.chat.completions.create(model="demo", messages=messages, extra_headers=headers)
    text = answered.choices[0].message.content or ""
    assert text == 'elicitation: {"action": "accept", "content": {"age": 36, "name": "Ada"}}\n'


def test_a_client_that_offers_the_permission_tool_gets_a_call(oai: openai.OpenAI) -> None:
    tool = {"type": "function", "function": {"name": "acp_agent_action", "parameters": {"type": "object"}}}
    asked = oai.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "/permission touch x"}], tools=[tool]
    )
    (call,) = asked.choices[0].message.tool_calls or []
    assert call.function.name == "acp_agent_action"
    assert json.loads(call.function.arguments)["title"] == "touch x"


# -- concurrency, disconnects ---------------------------------------------------------------------------------------


def test_ten_concurrent_conversations_across_the_three_apis(oai: openai.OpenAI, claude: anthropic.Anthropic) -> None:
    def chat(n: int) -> str:
        prompt = f"/sleep 50\n/say chat {n}"
        done = oai.chat.completions.create(model="demo", messages=[{"role": "user", "content": prompt}])
        return done.choices[0].message.content or ""

    def responses(n: int) -> str:
        return oai.responses.create(model="demo", input=f"/sleep 50\n/say responses {n}").output_text

    def messages(n: int) -> str:
        prompt = f"/sleep 50\n/say messages {n}"
        done = claude.messages.create(model="demo", max_tokens=100, messages=[{"role": "user", "content": prompt}])
        return "".join(b.text for b in done.content if b.type == "text")

    jobs = [(kind, n) for n in range(4) for kind in (chat, responses, messages)][:10]
    with ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(lambda job: job[0](job[1]), jobs))
    assert answers == [f"{kind.__name__} {n}\n" for kind, n in jobs]


def test_same_opening_conversations_at_once_do_not_share_a_session(oai: openai.OpenAI) -> None:
    opening = [{"role": "user", "content": "/sleep 300\n/say same opening"}]

    def converse(n: int) -> str:
        first = oai.chat.completions.create(model="demo", messages=opening)
        history = [*opening, {"role": "assistant", "content": first.choices[0].message.content}]
        follow = oai.chat.completions.create(
            model="demo", messages=[*history, {"role": "user", "content": f"/say only {n}\n/recall"}]
        )
        return follow.choices[0].message.content or ""

    with ThreadPoolExecutor(2) as pool:
        first, second = pool.map(converse, [1, 2])
    assert "only 1" in first and "only 2" not in first
    assert "only 2" in second and "only 1" not in second


def test_a_client_that_disconnects_cancels_its_turn(daemon: HttpDaemon, oai: openai.OpenAI) -> None:
    headers = conversation()
    prompt = {"role": "user", "content": "/say early words\n/sleep 60000\n/say never said"}
    body = json.dumps({"model": "demo", "stream": True, "messages": [prompt]}).encode()
    parts = urlsplit(daemon.url)
    offset = len(daemon.stderr)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        request = (
            f"POST /v1/chat/completions HTTP/1.1\r\nhost: {parts.netloc}\r\nauthorization: Bearer {daemon.token}\r\n"
            f"x-lmbridge-conversation: {headers['x-lmbridge-conversation']}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        )
        sock.sendall(request.encode() + body)
        received = b""
        while b"early" not in received:
            chunk = sock.recv(65536)
            assert chunk, received
            received += chunk
    log = daemon.wait_for_log("the client went away; its turn was cancelled", after=offset)
    assert "session/cancel" in log or "cancel" in log
    follow = oai.chat.completions.create(
        model="demo", messages=[prompt, {"role": "user", "content": "/say fresh"}], extra_headers=headers
    )
    assert follow.choices[0].message.content == "fresh\n"


# -- errors --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_an_unknown_model_is_a_404_in_each_apis_shape(
    oai: openai.OpenAI, claude: anthropic.Anthropic, stream: bool
) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        oai.chat.completions.create(model="nobody", messages=[{"role": "user", "content": "hi"}], stream=stream)
    assert caught.value.body["param"] == "model" and "demo" in caught.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        oai.responses.create(model="nobody", input="hi", stream=stream)
    with pytest.raises(anthropic.NotFoundError) as anthropic_caught:
        claude.messages.create(
            model="nobody", max_tokens=10, messages=[{"role": "user", "content": "hi"}], stream=stream
        )
    assert anthropic_caught.value.body["error"]["type"] == "not_found_error"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", b"{not json", None),
        ("/v1/chat/completions", b"[1, 2]", None),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, "model"),
        (
            "/v1/chat/completions",
            {"model": "demo", "messages": [{"role": "robot", "content": "hi"}]},
            "messages.0.role",
        ),
        ("/v1/chat/completions", {"model": "demo", "messages": []}, "messages"),
        ("/v1/responses", {"model": "demo"}, "input"),
        ("/v1/responses", {"model": "demo", "input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ("/v1/messages", {"model": "demo", "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
        (
            "/v1/messages",
            {"model": "demo", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
            "messages[0].content[0].tool_use_id",
        ),
    ],
)
def test_malformed_requests_are_400_naming_the_field(daemon: HttpDaemon, path: str, body: Any, param: str) -> None:
    status, _, answer = raw(daemon, "POST", path, body, bearer(daemon))
    assert status == 400, answer
    error = answer["error"]
    assert error["type"] == "invalid_request_error"
    if path.startswith("/v1/messages"):
        assert answer["type"] == "error" and param in error["message"]
    else:
        assert error["param"] == param


def test_a_malformed_tool_result_history_is_a_400(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(
            model="demo",
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}],
        )
    assert "data: URL" in caught.value.body["message"]


def test_an_image_over_the_limit_is_a_400_naming_it(oai: openai.OpenAI, claude: anthropic.Anthropic) -> None:
    from session.messages import MAX_IMAGE_BYTES

    huge = "A" * (MAX_IMAGE_BYTES * 4 // 3 + 8)  # a little over 20 MB decoded
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(
            model="demo",
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{huge}"}}],
                }
            ],
        )
    assert "over lmbridge's limit of 20 MB" in caught.value.body["message"]
    assert caught.value.body["param"] == "messages[0].content[0].image_url"
    with pytest.raises(anthropic.BadRequestError) as anthropic_caught:
        claude.messages.create(
            model="demo",
            max_tokens=10,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": huge}}
                    ],
                }
            ],
        )
    assert "over lmbridge's limit of 20 MB" in str(anthropic_caught.value)


def test_an_agent_that_fails_before_output_is_a_502(oai: openai.OpenAI, claude: anthropic.Anthropic) -> None:
    for stream in (False, True):
        with pytest.raises(openai.APIStatusError) as caught:
            oai.chat.completions.create(model="missing", messages=[{"role": "user", "content": "hi"}], stream=stream)
        assert caught.value.status_code == 502 and "failed to start" in caught.value.body["message"]
    with pytest.raises(anthropic.APIStatusError) as anthropic_caught:
        claude.messages.create(model="missing", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    assert anthropic_caught.value.status_code == 502
    assert anthropic_caught.value.body["error"]["type"] == "api_error"


def test_the_same_opening_twice_is_two_conversations(oai: openai.OpenAI) -> None:
    # On the HTTP front the second request must not continue the first one's session nor see its prompt.
    messages = [{"role": "user", "content": "/say same opening\n/recall"}]
    for _ in range(2):
        reply = oai.chat.completions.create(model="demo", messages=messages)  # type: ignore[arg-type]
        assert reply.choices[0].message.content == "same opening\nearlier prompts: []\n"


def test_an_agent_that_exits_before_output_is_a_503_to_retry(daemon: HttpDaemon, oai: openai.OpenAI) -> None:
    # The agent is started again at once (the official SDKs retry a 503 after its retry-after).
    body = {"model": "demo", "messages": [{"role": "user", "content": "/crash"}]}
    status, headers, reply = raw(daemon, "POST", "/v1/chat/completions", body, bearer(daemon))
    assert status == 503 and headers["retry-after"] == "1", (status, reply)
    assert "send the request again" in reply["error"]["message"]
    answer = oai.chat.completions.create(model="demo", messages=[{"role": "user", "content": "/say fine again"}])
    assert answer.choices[0].message.content == "fine again\n"


def test_an_error_after_the_stream_started_is_an_error_event(oai: openai.OpenAI, claude: anthropic.Anthropic) -> None:
    with pytest.raises(openai.APIError) as caught:
        for _chunk in oai.chat.completions.create(
            model="demo", messages=[{"role": "user", "content": f"/say before {uuid.uuid4().hex}\n/crash"}], stream=True
        ):
            pass
    assert "exited" in str(caught.value)
    with (
        pytest.raises(anthropic.APIStatusError) as anthropic_caught,
        claude.messages.stream(
            model="demo", max_tokens=10, messages=[{"role": "user", "content": f"/say b {uuid.uuid4().hex}\n/crash"}]
        ) as stream,
    ):
        for _event in stream:
            pass
    assert "exited" in str(anthropic_caught.value)
    events = list(oai.responses.create(model="demo", input=f"/say c {uuid.uuid4().hex}\n/crash", stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.failed"
    assert "exited" in events[-1].response.error.message


def test_limits_body_size_and_turns_at_once(tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    config = write_config(tmp_path / "config.toml", marker, "[serve]\nmax_turns = 1\n")
    with http_daemon(tmp_path, config, "--max-message-bytes", "20000") as daemon:
        status, _, body = raw(
            daemon,
            "POST",
            "/v1/chat/completions",
            {"model": "demo", "messages": [{"role": "user", "content": "x" * 30000}]},
            bearer(daemon),
        )
        assert status == 413 and body["error"]["type"] == "request_too_large"
        status, _, body = raw(
            daemon,
            "POST",
            "/v1/messages",
            {"model": "demo", "max_tokens": 5, "messages": [{"role": "user", "content": "x" * 30000}]},
            bearer(daemon),
        )
        assert status == 413 and body["error"]["type"] == "request_too_large"

        client = openai.OpenAI(base_url=daemon.url + "/v1", api_key=daemon.token, max_retries=0, timeout=30)
        prompt = {"role": "user", "content": "/say holding\n/sleep 60000"}
        with client.chat.completions.create(model="demo", messages=[prompt], stream=True) as held:
            next(iter(held))  # the turn is running
            with pytest.raises(openai.RateLimitError) as caught:
                client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}])
            assert caught.value.response.headers["retry-after"] == "1"
    assert daemon.process.returncode == 0
    assert processes_with_marker(marker) == []


# -- the rest of the contract ----------------------------------------------------------------------------------------


def test_accept_event_stream_chooses_streaming(daemon: HttpDaemon) -> None:
    body = {"model": "demo", "messages": [{"role": "user", "content": "/say via accept"}]}
    status, headers, text = raw(
        daemon, "POST", "/v1/chat/completions", body, {**bearer(daemon), "accept": "text/event-stream"}
    )
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = [line[6:] for line in text.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    content = "".join(json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events[:-1])
    assert content == "via accept\n"
    status, headers, _ = raw(
        daemon,
        "POST",
        "/v1/chat/completions",
        {**body, "stream": False},
        {**bearer(daemon), "accept": "text/event-stream"},
    )
    assert status == 200 and headers["content-type"] == "application/json"  # the body said otherwise


@pytest.mark.parametrize("reason", ["max_tokens", "refusal"])
def test_length_and_refusal_stops_in_each_api(oai: openai.OpenAI, claude: anthropic.Anthropic, reason: str) -> None:
    prompt = f"/say partial\n/stop {reason}"
    chat = oai.chat.completions.create(model="demo", messages=[{"role": "user", "content": prompt}])
    assert chat.choices[0].finish_reason == {"max_tokens": "length", "refusal": "content_filter"}[reason]
    response = oai.responses.create(model="demo", input=prompt)
    assert response.status == "incomplete"
    assert (
        response.incomplete_details.reason == {"max_tokens": "max_output_tokens", "refusal": "content_filter"}[reason]
    )
    message = claude.messages.create(model="demo", max_tokens=10, messages=[{"role": "user", "content": prompt}])
    assert message.stop_reason == reason


def test_the_working_directory_header(daemon: HttpDaemon, oai: openai.OpenAI, tmp_path: Path) -> None:
    offset = len(daemon.stderr)
    oai.chat.completions.create(
        model="demo",
        messages=[{"role": "user", "content": f"in {tmp_path}"}],
        extra_headers={"x-lmbridge-cwd": str(tmp_path)},
    )
    assert f"cwd={tmp_path}" in daemon.stderr[offset:]
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(
            model="demo", messages=[{"role": "user", "content": "hi"}], extra_headers={"x-lmbridge-cwd": "relative/dir"}
        )
    assert "x-lmbridge-cwd" in caught.value.body["message"]


def test_images_reach_the_agent_as_data(oai: openai.OpenAI) -> None:
    pixel = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg=="
    content = [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{pixel}"}},
    ]
    done = oai.chat.completions.create(model="demo", messages=[{"role": "user", "content": content}])
    assert done.choices[0].message.content.startswith("echo: look")


@pytest.fixture(scope="module")
def browser_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpDaemon]:
    directory = tmp_path_factory.mktemp("http-browser")
    marker = uuid.uuid4().hex
    extra = '[serve]\nallowed_origins = ["https://app.example"]\nactivity = "text"\n'
    with http_daemon(
        directory, write_config(directory / "config.toml", marker, extra), "--listen", "127.0.0.1:0"
    ) as live:
        yield live
    assert processes_with_marker(marker) == []


def test_both_listeners_in_the_ready_line(browser_daemon: HttpDaemon) -> None:
    assert browser_daemon.ready["listening"].startswith("ws://127.0.0.1:")
    assert browser_daemon.ready["http"].startswith("http://127.0.0.1:")


def test_an_allowed_origin_gets_cors_for_itself_only(browser_daemon: HttpDaemon) -> None:
    origin = {"origin": "https://app.example"}
    status, headers, _ = raw(
        browser_daemon, "OPTIONS", "/v1/chat/completions", headers={**origin, "access-control-request-method": "POST"}
    )
    assert status == 204 and headers["access-control-allow-origin"] == "https://app.example"
    assert "authorization" in headers["access-control-allow-headers"]
    status, headers, _ = raw(browser_daemon, "GET", "/v1/models", headers={**bearer(browser_daemon), **origin})
    assert status == 200 and headers["access-control-allow-origin"] == "https://app.example"
    status, _, _ = raw(browser_daemon, "GET", "/v1/models", headers=origin)
    assert status == 401  # an allowed origin still needs the token


def test_activity_as_text_when_configured(browser_daemon: HttpDaemon) -> None:
    client = anthropic.Anthropic(base_url=browser_daemon.url, api_key=browser_daemon.token, max_retries=0)
    message = client.messages.create(
        model="demo", max_tokens=100, messages=[{"role": "user", "content": "/run Listing files\n/say done"}]
    )
    assert [block.type for block in message.content] == ["text"]
    assert "Listing files" in message.content[0].text and message.content[0].text.endswith("done\n")


def test_sigterm_finishes_running_streams_as_cancelled(tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    with http_daemon(tmp_path, write_config(tmp_path / "config.toml", marker)) as daemon:
        client = openai.OpenAI(base_url=daemon.url + "/v1", api_key=daemon.token, max_retries=0, timeout=30)
        prompt = {"role": "user", "content": "/say working\n/sleep 60000"}
        with client.chat.completions.create(model="demo", messages=[prompt], stream=True) as stream:
            chunks = iter(stream)
            next(chunks)
            daemon.process.send_signal(signal.SIGTERM)
            rest = list(chunks)
        assert rest[-1].choices[0].finish_reason == "stop"
        assert daemon.process.wait(20) == 0
    assert processes_with_marker(marker) == []
