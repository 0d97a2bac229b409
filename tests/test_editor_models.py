"""The editor's own models, served back (docs/editor-models.md): a test editor shares a scripted model, and the agent
asks it through the ``editor_model`` tool lmbridge adds to the synthetic MCP server — over the real wire."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import trio
from conftest import HANG, open_bridge, processes_with_marker
from fakes import ScriptedEditorModel, tool_result, user
from test_serve import serving

from bridge.editor.client import EditorClient, connect_daemon

pytestmark = pytest.mark.wire


async def test_the_agent_asks_the_editors_model_through_the_tool(tmp_path: Any, agents_toml: Any, marker: str) -> None:
    model = ScriptedEditorModel("scripted-1")
    async with open_bridge(
        tmp_path, agents_toml, initialize={"editorModels": model.models}, serve=model.answer
    ) as live:
        reply = await live.chat('/tool editor_model {"prompt": "what is 6 times 7?"}')
    assert reply.stop_reason == "end_turn", reply
    assert reply.text == "tool editor_model returned: scripted-1 heard: what is 6 times 7?\n"
    (call,) = model.calls
    assert call["modelId"] == "scripted-1"
    assert call["messages"] == [{"role": "user", "content": [{"type": "text", "value": "what is 6 times 7?"}]}]


async def test_the_answer_streams_to_the_agent_as_progress(tmp_path: Any, agents_toml: Any) -> None:
    model = ScriptedEditorModel("scripted-1", "scripted-2")
    async with open_bridge(
        tmp_path, agents_toml, initialize={"editorModels": model.models}, serve=model.answer
    ) as live:
        reply = await live.chat("/ask model=scripted-2 one two three")
    # "scripted-2 heard: one two three": five words, each a part. Parts that reach lmbridge together go on as one
    # progress note (with the text so far): at least one note, at most one per part.
    notes, _, text = reply.text.removeprefix("editor model (").partition(" progress notes): ")
    assert text == "scripted-2 heard: one two three\n", reply
    assert 1 <= int(notes) <= 5, reply
    assert [call["modelId"] for call in model.calls] == ["scripted-2"]


async def test_parallel_calls_errors_and_cancel_through_the_tool(tmp_path: Any, agents_toml: Any) -> None:
    model = ScriptedEditorModel("scripted-1")
    shared = {"editorModels": model.models}
    async with open_bridge(tmp_path, agents_toml, initialize=shared, serve=model.answer) as live:
        both = await live.chat('/tools editor_model {"prompt": "left"} | editor_model {"prompt": "right"}')
        failed = await live.chat('/tool editor_model {"prompt": "/fail your quota is used up"}')
        turn = await live.client.start_chat("scripted", [user('/tool editor_model {"prompt": "/wait"}')])
        with trio.fail_after(HANG):
            await model.waiting.wait()  # the editor's model is answering
        turn.cancel()  # the editor cancels the turn: the agent withdraws its call, lmbridge the editor's
        with trio.fail_after(HANG):
            cancelled = await turn.result()
            while model.cancelled == 0:
                await trio.sleep(0.05)  # polling another process's effect: the editor's handler saw $/cancelRequest
    assert both.text.splitlines() == [
        "tool editor_model returned: scripted-1 heard: left",
        "tool editor_model returned: scripted-1 heard: right",
    ]
    assert failed.text == (
        "tool editor_model failed: the editor's model 'scripted-1' failed: your quota is used up.\n"
    ), failed.text
    assert cancelled.stop_reason == "cancelled"


async def test_no_tool_without_shared_models_and_none_when_turned_off(tmp_path: Any, agents_toml: Any) -> None:
    async with open_bridge(tmp_path, agents_toml) as live:
        plain = await live.chat('/tool editor_model {"prompt": "hi"}')
    assert plain.text.endswith("no MCP server was given in session/new\n"), plain.text
    agents_toml.write_text(agents_toml.read_text() + "\n[tools]\neditor_models = false\n")
    model = ScriptedEditorModel("scripted-1")
    shared = {"editorModels": model.models}
    async with open_bridge(tmp_path, agents_toml, initialize=shared, serve=model.answer) as live:
        off = await live.chat('/tool editor_model {"prompt": "hi"}')
    assert off.text.endswith("no MCP server was given in session/new\n"), off.text
    assert model.calls == []


async def test_models_shared_during_a_turn_reach_the_agent_at_once(tmp_path: Any, agents_toml: Any) -> None:
    # An editor that shares its models only after its first request (VS Code lists them asynchronously): the agent of
    # that conversation is told of the new tool as soon as they are shared, not at its next turn.
    model = ScriptedEditorModel("scripted-1")
    clock = {"name": "get_time", "description": "The time", "inputSchema": {"type": "object"}}
    async with open_bridge(tmp_path, agents_toml, serve=model.answer) as live:
        history = [user('/tool get_time {}\n/tool editor_model {"prompt": "late?"}')]
        first = await live.chat(history, tools=[clock])
        assert first.stop_reason == "tool_calls" and first.tool_calls[0]["name"] == "get_time", first
        await live.client.share_models(model.models)  # while the agent waits for the editor's tool result
        with trio.fail_after(HANG):
            while "the editor's tools changed; telling the agent" not in live.stderr:
                await trio.sleep(0.05)  # polling the other process's log: the change has no event of its own
        history += [first.assistant_message(), tool_result(first.tool_calls[0]["callId"], "noon")]
        second = await live.chat(history, tools=[clock])
    assert "tool editor_model returned: scripted-1 heard: late?" in second.text, second


# -- the HTTP front: editor/<id> for every client -----------------------------------------------------------------


@asynccontextmanager
async def sharing_editor(daemon: Any, model: ScriptedEditorModel) -> AsyncIterator[EditorClient]:
    """A WebSocket editor of ``lmbridge serve`` that shares ``model``'s models and answers for them."""
    async with connect_daemon(daemon.url, daemon.token) as client:
        client.serve_models(model.answer)
        with trio.fail_after(HANG):
            await client.initialize(editorModels=model.models)
        yield client


@pytest.fixture
async def http_daemon(tmp_path: Path, agents_toml: Path, marker: str) -> AsyncIterator[Any]:
    config = agents_toml.read_text() + "\n[editor_models]\nmax_concurrent = 1\n"
    agents_toml.write_text(config)
    async with serving(tmp_path, agents_toml, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0") as live:
        yield live
    assert live.process.returncode == 0, live.stderr[-2000:]
    assert processes_with_marker(marker) == []


def _openai(daemon: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.http_url + "/v1", api_key=daemon.token, max_retries=0, timeout=HANG)


async def test_the_sdks_list_and_ask_an_editors_model_with_text_stream_and_tools(http_daemon: Any) -> None:
    model = ScriptedEditorModel("scripted-1")
    async with sharing_editor(http_daemon, model):
        client = _openai(http_daemon)
        claude = anthropic.Anthropic(base_url=http_daemon.http_url, api_key=http_daemon.token, max_retries=0)

        def use_them() -> dict[str, Any]:
            listed = {m.id: m for m in client.models.list().data}
            text = client.chat.completions.create(
                model="editor/scripted-1", messages=[{"role": "user", "content": "hello"}]
            )
            chunks = client.chat.completions.create(
                model="editor/scripted-1", messages=[{"role": "user", "content": "stream me"}], stream=True
            )
            streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
            called = client.chat.completions.create(
                model="editor/scripted-1",
                messages=[{"role": "user", "content": '/call get_weather {"city": "Oslo"}'}],
                tools=[weather],
            )
            with claude.messages.stream(
                model="editor/scripted-1", max_tokens=100, messages=[{"role": "user", "content": "from claude"}]
            ) as stream:
                said = "".join(stream.text_stream)
            return {"listed": listed, "text": text, "streamed": streamed, "called": called, "said": said}

        seen = await trio.to_thread.run_sync(use_them)
    entry = seen["listed"]["editor/scripted-1"]
    assert entry.owned_by == "editor" and "demo" in seen["listed"]
    text = seen["text"]
    assert text.choices[0].message.content == "scripted-1 heard: hello" and text.choices[0].finish_reason == "stop"
    assert text.usage is not None and text.usage.prompt_tokens == 11
    assert seen["streamed"] == "scripted-1 heard: stream me"
    called = seen["called"].choices[0]
    assert called.finish_reason == "tool_calls"
    (call,) = called.message.tool_calls or []
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Oslo"}
    assert seen["said"] == "scripted-1 heard: from claude"
    # What reached the editor: the messages as sent, the tools when there were some, the Anthropic max_tokens.
    assert model.calls[2]["options"]["tools"][0]["name"] == "get_weather"
    assert model.calls[3]["options"] == {"maxTokens": 100}


async def test_an_editors_models_leave_with_it_and_errors_keep_their_shape(http_daemon: Any) -> None:
    model = ScriptedEditorModel("scripted-1")
    client = _openai(http_daemon)

    def ask(text: str) -> Any:
        return client.chat.completions.create(model="editor/scripted-1", messages=[{"role": "user", "content": text}])

    async with sharing_editor(http_daemon, model):
        with pytest.raises(openai.APIStatusError) as failed:
            await trio.to_thread.run_sync(ask, "/fail consent refused")
    assert failed.value.status_code == 502 and "consent refused" in str(failed.value)
    # The editor has gone: so have its models, once the daemon has seen its connection close (a request before that
    # is a 502 "went away", as for an editor that leaves mid-call).
    with trio.fail_after(HANG):
        while any(m.id == "editor/scripted-1" for m in await trio.to_thread.run_sync(client.models.list)):
            await trio.sleep(0.05)  # polling the daemon's view of another connection: there is no event for it
    with pytest.raises(openai.NotFoundError) as gone:
        await trio.to_thread.run_sync(ask, "hello")
    assert "editor/scripted-1" in str(gone.value)


async def test_over_the_limit_is_429_and_a_client_that_leaves_cancels_the_editors_call(http_daemon: Any) -> None:
    model = ScriptedEditorModel("scripted-1")
    client = _openai(http_daemon)
    async with sharing_editor(http_daemon, model):
        stream = await trio.to_thread.run_sync(
            lambda: client.chat.completions.create(
                model="editor/scripted-1", messages=[{"role": "user", "content": "/wait"}], stream=True
            )
        )
        with trio.fail_after(HANG):
            await model.waiting.wait()
        with pytest.raises(openai.RateLimitError) as limited:  # [editor_models] max_concurrent = 1
            await trio.to_thread.run_sync(
                lambda: client.chat.completions.create(
                    model="editor/scripted-1", messages=[{"role": "user", "content": "me too"}]
                )
            )
        assert limited.value.response.headers["retry-after"] == "1"
        stream.close()  # the client goes away: the editor is told
        with trio.fail_after(HANG):
            while model.cancelled == 0:
                await trio.sleep(0.05)  # polling another process's effect: the editor's handler saw the cancel


async def test_stdio_serves_the_http_api_beside_the_editor_with_its_models(tmp_path: Path, agents_toml: Path) -> None:
    # An editor's lmbridge opens the HTTP API for the terminal tools of the same person (loopback, the token file).
    model = ScriptedEditorModel("scripted-1")
    token_file = tmp_path / "token"
    extra = ("--http", "127.0.0.1:0", "--token-file", str(token_file))
    shared = {"editorModels": model.models}
    async with open_bridge(tmp_path, agents_toml, *extra, initialize=shared, serve=model.answer) as live:
        with trio.fail_after(HANG):
            status = await live.client.request("daemon/status", {})
        # Where the API listens (the port the system chose), as the editor learns it; the token is not in it.
        url = re.fullmatch(r"(http://127\.0\.0\.1:\d+)", status.get("http", ""))
        assert url is not None, status
        assert token_file.read_text().strip() not in json.dumps(status)
        client = openai.OpenAI(
            base_url=url.group(1) + "/v1", api_key=token_file.read_text().strip(), max_retries=0, timeout=HANG
        )
        answer = await trio.to_thread.run_sync(
            lambda: client.chat.completions.create(
                model="editor/scripted-1", messages=[{"role": "user", "content": "from the terminal"}]
            )
        )
        refused = openai.OpenAI(base_url=url.group(1) + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            await trio.to_thread.run_sync(lambda: refused.models.list())
    assert answer.choices[0].message.content == "scripted-1 heard: from the terminal"
    assert oct(token_file.stat().st_mode & 0o777) == "0o600"


async def test_malformed_and_late_parts_from_the_editor_cost_only_themselves(tmp_path: Any, agents_toml: Any) -> None:
    model = ScriptedEditorModel("scripted-1")
    connection: list[Any] = []

    async def answer(params: dict[str, Any], send_part: Any, cancel: Any) -> dict[str, Any]:
        wire = connection[0]
        await wire.notify("editor/part", {"requestId": [1], "part": {"type": "text", "value": "not mine"}})
        await wire.notify("editor/part", ["not", "an", "object"])
        return await model.answer(params, send_part, cancel)

    async with open_bridge(tmp_path, agents_toml, initialize={"editorModels": model.models}, serve=answer) as live:
        connection.append(live.client.connection)
        reply = await live.chat('/tool editor_model {"prompt": "still whole?"}')
        assert reply.text == "tool editor_model returned: scripted-1 heard: still whole?\n", reply
        assert "editor/part notifications ignored" in live.stderr
