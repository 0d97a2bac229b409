"""Agents that think with the editor's models (docs/editor-models.md#agents-on-the-editors-models): an agent
configured ``model_source = "editor"`` is started pointed at lmbridge's loopback listener with a token of its own; its
model requests are answered by ``editor/chat`` on the conversation's editor — over the real wire: ``lmbridge stdio``,
a test editor sharing a scripted model, the demo agent's ``/llm`` (a streamed Anthropic Messages request)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import trio
from conftest import HANG, PYTHON, open_bridge
from fakes import ScriptedEditorModel, user
from test_editor_models import sharing_editor
from test_serve import serving

from bridge.config import load_config
from bridge.editor.client import connect_daemon

pytestmark = pytest.mark.wire


def _config(tmp_path: Path, source: str = "editor", extra: str = "") -> Path:
    path = tmp_path / "agents.toml"
    path.write_text(f"""
[agents.thinker]
command = "{PYTHON}"
args = ["-m", "bridge.demo"]
model_source = "{source}"
{extra}

[sessions]
stop_grace = 2
""")
    return path


def _sharing(tmp_path: Path, model: ScriptedEditorModel, *extra: str, config: Path | None = None) -> Any:
    """``lmbridge stdio`` with the agent on the editor's models, and an editor sharing ``model``'s models."""
    config = config or _config(tmp_path)
    return open_bridge(tmp_path, config, *extra, initialize={"editorModels": model.models}, serve=model.answer)


async def _route(live: Any) -> tuple[str, str]:
    """The agent process's route and token, as the agent was given them."""
    return await _env(live, "LMBRIDGE_MODEL_BASE_URL"), await _env(live, "LMBRIDGE_MODEL_TOKEN")


async def _env(live: Any, name: str) -> str:
    reply = await live.chat(f"/env {name}", model="thinker")
    return str(reply.text).strip().partition("=")[2]


@pytest.mark.smoke
async def test_the_agents_model_requests_are_answered_by_the_editors_model(tmp_path: Path) -> None:
    model = ScriptedEditorModel("scripted-1", "scripted-2")
    async with _sharing(tmp_path, model) as live:
        reply = await live.chat("/llm what is 6 times 7?", model="thinker")
        assert reply.stop_reason == "end_turn", reply
        assert reply.text == "scripted-1 heard: what is 6 times 7?\n"
        (call,) = model.calls
        assert call["modelId"] == "scripted-1"  # "editor": the first model the editor shares
        assert call["messages"] == [{"role": "user", "content": [{"type": "text", "value": "what is 6 times 7?"}]}]
        url, token = await _route(live)
    assert url.startswith("http://127.0.0.1:") and "/agent-model/" in url
    assert len(token) > 30 and token not in live.stderr_path.read_text()  # never in lmbridge's log (debug level)


async def test_a_named_editor_model_and_what_the_agent_is_told_when_there_is_none(tmp_path: Path) -> None:
    model = ScriptedEditorModel("scripted-1", "scripted-2")
    config = _config(tmp_path, "editor:scripted-2")
    async with _sharing(tmp_path, model, config=config) as live:
        named = await live.chat("/llm hello", model="thinker")
        await live.client.share_models([])
        with trio.fail_after(HANG):
            while not (await live.chat("/llm again", model="thinker")).text.startswith("model error"):
                await trio.sleep(0.05)
        gone = await live.chat("/llm once more", model="thinker")
    assert named.text == "scripted-2 heard: hello\n"
    assert gone.text.startswith("model error: the model refused (400): lmbridge: the conversation's editor shares no")
    assert [c["modelId"] for c in model.calls] == ["scripted-2"]


async def test_a_prompt_over_the_models_input_limit_is_refused_as_too_long(tmp_path: Path) -> None:
    model = ScriptedEditorModel("scripted-1")  # maxInputTokens 8192
    async with _sharing(tmp_path, model) as live:
        reply = await live.chat("/llm " + "word " * 40_000, model="thinker")
    assert "model error: the model refused (400): prompt is too long:" in reply.text, reply.text
    assert "> 8192 maximum" in reply.text
    assert model.calls == []  # never silently cut short, never sent


async def test_cancel_reaches_the_editors_model_and_the_next_turn_works(tmp_path: Path) -> None:
    model = ScriptedEditorModel("scripted-1")
    async with _sharing(tmp_path, model) as live:
        turn = await live.client.start_chat("thinker", [user("/llm /wait")])
        with trio.fail_after(HANG):
            await model.waiting.wait()
            turn.cancel()
            cancelled = await turn.result()
            while model.cancelled == 0:  # the agent closed its request: lmbridge sent $/cancelRequest
                await trio.sleep(0.05)
        after = await live.chat("/llm still there?", model="thinker")
    assert cancelled.stop_reason == "cancelled"
    assert after.text == "scripted-1 heard: still there?\n"


async def test_the_token_opens_model_requests_only_and_dies_with_the_process(tmp_path: Path) -> None:
    model = ScriptedEditorModel("scripted-1")
    async with _sharing(tmp_path, model) as live:
        url, token = await _route(live)
        listed = await trio.to_thread.run_sync(_get, f"{url}/v1/models", token)
        assert listed[0] == 200 and [m["id"] for m in listed[1]["data"]] == ["scripted-1"], listed
        root = url.split("/agent-model/")[0]
        for wrong_url, wrong_token in ((url, "wrong"), (f"{root}/agent-model/0000", token), (url, "")):
            assert (await trio.to_thread.run_sync(_get, f"{wrong_url}/v1/models", wrong_token))[0] == 401
        assert (await trio.to_thread.run_sync(_get, f"{root}/mcp/x", token))[0] in (401, 404)  # no MCP route's
        await live.chat("/crash", model="thinker")  # the agent process exits: its token with it
        with trio.fail_after(HANG):
            while (await trio.to_thread.run_sync(_get, f"{url}/v1/models", token))[0] != 401:
                await trio.sleep(0.05)
        again = await live.chat("/llm back", model="thinker")  # a new process, with a route and token of its own
        new_url = await _env(live, "LMBRIDGE_MODEL_BASE_URL")
    assert again.text == "scripted-1 heard: back\n"
    assert new_url != url


def _get(url: str, token: str) -> tuple[int, Any]:
    request = urllib.request.Request(url, headers={"x-api-key": token})
    try:
        with urllib.request.urlopen(request, timeout=HANG) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, None


def test_model_source_is_checked_in_the_config(tmp_path: Path) -> None:
    from bridge.config import ConfigError

    with pytest.raises(ConfigError, match="model_source"):
        load_config(_config(tmp_path, "openai"))
    config = load_config(_config(tmp_path, "editor:gpt-4o"))
    assert config.agents["thinker"].model_source == "editor:gpt-4o"


async def test_an_http_client_beside_the_editor_gets_the_agent_on_the_editors_model(tmp_path: Path) -> None:
    # lmbridge stdio --http: a terminal tool of the same person chats with the agent; no editor sent that
    # conversation, so the editor that shares models answers its agent's model requests.
    model = ScriptedEditorModel("scripted-1")
    token_file = tmp_path / "token"
    async with _sharing(tmp_path, model, "--http", "127.0.0.1:0", "--token-file", str(token_file)) as live:
        with trio.fail_after(HANG):
            status = await live.client.request("daemon/status", {})
        client = openai.OpenAI(
            base_url=status["http"] + "/v1", api_key=token_file.read_text().strip(), max_retries=0, timeout=HANG
        )
        answer = await trio.to_thread.run_sync(
            lambda: client.chat.completions.create(
                model="thinker", messages=[{"role": "user", "content": "/llm from the terminal"}]
            )
        )
    assert answer.choices[0].message.content == "scripted-1 heard: from the terminal\n"


async def test_on_a_daemon_each_editors_conversation_thinks_with_that_editors_model(tmp_path: Path) -> None:
    # lmbridge serve, two editors sharing a model each; one agent process per conversation (isolation = "session"):
    # each agent's model requests go to the editor whose conversation it serves, never to the other.
    alpha, beta = ScriptedEditorModel("alpha"), ScriptedEditorModel("beta")
    config = _config(tmp_path, extra='isolation = "session"')
    answers: dict[str, Any] = {}

    async def ask(name: str, client: Any) -> None:
        answers[name] = await client.chat("thinker", [user(f"/llm I am {name}")])

    async with (
        serving(tmp_path, config, "--listen", "127.0.0.1:0") as daemon,
        sharing_editor(daemon, alpha) as first,
        sharing_editor(daemon, beta) as second,
    ):
        with trio.fail_after(HANG):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ask, "first", first)
                nursery.start_soon(ask, "second", second)
            listed = {name: {m["id"] for m in await c.models()} for name, c in (("first", first), ("second", second))}
    # Each editor is offered the agent on its own models only.
    assert "thinker@alpha" in listed["first"] and "thinker@beta" not in listed["first"]
    assert "thinker@beta" in listed["second"] and "thinker@alpha" not in listed["second"]
    assert answers["first"].text == "alpha heard: I am first\n"
    assert answers["second"].text == "beta heard: I am second\n"
    assert [c["modelId"] for c in alpha.calls] == ["alpha"] and [c["modelId"] for c in beta.calls] == ["beta"]


async def test_the_model_picker_offers_the_agent_on_each_shared_model_and_a_conversation_chooses(
    tmp_path: Path,
) -> None:
    model = ScriptedEditorModel("scripted-1", "scripted-2")
    async with _sharing(tmp_path, model) as live:
        listed = {entry["id"]: entry for entry in await live.client.models()}
        chosen = await live.chat("/llm which one?", model="thinker@scripted-2")
        default = await live.chat("/llm and now?", model="thinker")
        seen = live.client.models_changes
        await live.client.share_models([*model.models, {**model.models[0], "id": "scripted-3", "name": "Third"}])
        with trio.fail_after(HANG):
            await live.client.wait_models_changed(seen)
        relisted = [entry["id"] for entry in await live.client.models()]
    assert listed["thinker@scripted-2"]["name"] == "thinker on Scripted scripted-2"
    assert listed["thinker@scripted-2"]["editorModel"] == "scripted-2"
    assert {"thinker", "thinker@scripted-1", "thinker@scripted-2"} <= set(listed)
    assert chosen.text == "scripted-2 heard: which one?\n"
    assert default.text == "scripted-1 heard: and now?\n"  # model_source = "editor": the first shared
    assert "thinker@scripted-3" in relisted


async def test_the_editor_leaving_mid_answer_ends_the_turn_and_a_reconnected_editor_continues(tmp_path: Path) -> None:
    # lmbridge serve; an editor defines the agent itself (initialize.agents, modelSource) and goes away while its
    # model is answering the agent: the agent's model request fails saying so, and the turn ends with that; the
    # editor, back, sends the conversation again and it goes on.
    model = ScriptedEditorModel("scripted-1")
    defined = {"mine": {"command": PYTHON, "args": ["-m", "bridge.demo"], "modelSource": "editor"}}
    history = [user("/llm /wait")]
    async with serving(tmp_path, _config(tmp_path), "--listen", "127.0.0.1:0") as daemon:
        async with connect_daemon(daemon.url, daemon.token) as editor:
            editor.serve_models(model.answer)
            with trio.fail_after(HANG):
                await editor.initialize(editorModels=model.models, agents=defined)
                await editor.start_chat("mine", history)
                await model.waiting.wait()
        # The editor is gone: its turn runs on for detached_grace, its model call fails at once.
        with trio.fail_after(HANG):
            while "editor model call" not in daemon.stderr:
                await trio.sleep(0.05)
        async with connect_daemon(daemon.url, daemon.token) as back:
            back.serve_models(model.answer)
            with trio.fail_after(HANG):
                await back.initialize(editorModels=model.models, agents=defined)
                again = await back.chat("mine", [*history, user("/llm are you back?")])
    assert "went away" in daemon.stderr
    assert again.error is None and again.text.endswith("scripted-1 heard: are you back?\n"), again


async def test_with_one_process_per_agent_each_editor_gets_a_process_of_its_own(tmp_path: Path) -> None:
    # isolation = "agent" (the default) on a daemon: an agent on the editor's models has one process per editor (a
    # model request names no conversation, so a process must serve one editor's): each editor's conversations think
    # with its own model, and its later conversations share its process.
    alpha, beta = ScriptedEditorModel("alpha"), ScriptedEditorModel("beta")
    async with (
        serving(tmp_path, _config(tmp_path), "--listen", "127.0.0.1:0") as daemon,
        sharing_editor(daemon, alpha) as first,
        sharing_editor(daemon, beta) as second,
    ):
        with trio.fail_after(HANG):
            one = await first.chat("thinker", [user("/llm one")])
            two = await second.chat("thinker", [user("/llm two")])
            three = await first.chat("thinker", [user("/llm three")])
            status = await first.request("daemon/status", {})
    assert (one.text, two.text, three.text) == ("alpha heard: one\n", "beta heard: two\n", "alpha heard: three\n")
    assert sorted(a["sessions"] for a in status["agents"] if a["id"] == "thinker") == [1, 2]
    assert [c["modelId"] for c in beta.calls] == ["beta"]


async def test_a_route_serves_the_model_endpoints_only(tmp_path: Path) -> None:
    model = ScriptedEditorModel("scripted-1")
    async with _sharing(tmp_path, model) as live:
        url, token = await _route(live)
        one = await trio.to_thread.run_sync(_get, f"{url}/v1/models/anything", token)
        stored = await trio.to_thread.run_sync(_get, f"{url}/v1/responses/resp_0", token)
        other = await trio.to_thread.run_sync(_get, f"{url}/v2/secrets", token)
    assert one[0] == 200 and one[1]["editor_model"]["id"] == "scripted-1"
    assert stored[0] == 404 and other[0] == 404


async def test_claude_codes_system_messages_between_turns_reach_the_editors_model(tmp_path: Path) -> None:
    """Claude Code sends its environment as a ``system`` message inside ``messages`` for newer models; the route
    takes it (with the official SDK, streamed) and the editor's model gets it with the other instructions."""
    model = ScriptedEditorModel("scripted-1")
    async with _sharing(tmp_path, model) as live:
        url, token = await _route(live)

        def ask() -> str:
            client = anthropic.Anthropic(base_url=url, api_key=token, max_retries=0)
            messages: Any = [
                {"role": "user", "content": "hello"},
                {"role": "system", "content": [{"type": "text", "text": "# Environment: linux"}]},
                {"role": "assistant", "content": "hi"},
                {"role": "user", "content": "what now?"},
            ]
            with client.messages.stream(
                model="claude-opus", max_tokens=100, system="Be brief.", messages=messages
            ) as s:
                return s.get_final_text()

        text = await trio.to_thread.run_sync(ask)
    assert text == "scripted-1 heard: what now?"
    (call,) = model.calls
    first = call["messages"][0]["content"][0]["value"]
    assert "Be brief." in first and "# Environment: linux" in first
    assert [m["role"] for m in call["messages"]] == ["user", "user", "assistant", "user"]
