"""Real agents through the HTTP API front (``lmbridge serve --http``), offline: Claude Code, Codex and Gemini CLI,
each behind a scripted fake model on 127.0.0.1, driven by the official ``openai`` and ``anthropic`` SDKs over the
three APIs — a text turn and a client-tool round trip on each, the permission conversation in words, and the
agent's models listed and chosen (an agent/model entry, reasoning_effort).

The SDKs block, so they run in worker threads while this test's Trio loop serves the fake model.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import trio
from conftest import processes_with_marker

from bridge.fakemodel.server import FakeModel, call, say

from .conftest import FIRST_TURN_TIMEOUT, TURN_TIMEOUT
from .installs import Installed
from .kits import AgentKit, model_name, requested_model, write_config

pytestmark = pytest.mark.interop

WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@dataclass
class HttpFront:
    kit: AgentKit
    model: FakeModel
    url: str
    token: str
    project: Path
    stderr_path: Path

    @property
    def headers(self) -> dict[str, str]:
        return {"x-lmbridge-cwd": str(self.project)}

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.url + "/v1",
            api_key=self.token,
            max_retries=0,
            timeout=FIRST_TURN_TIMEOUT,
            default_headers=self.headers,
        )

    def anthropic(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(
            base_url=self.url,
            api_key=self.token,
            max_retries=0,
            timeout=FIRST_TURN_TIMEOUT,
            default_headers=self.headers,
        )

    async def run(self, work: Callable[[], Any]) -> Any:
        with trio.fail_after(FIRST_TURN_TIMEOUT + TURN_TIMEOUT):
            return await trio.to_thread.run_sync(work)

    def evidence(self) -> str:
        return f"\n--- lmbridge stderr (tail) ---\n{self.stderr_path.read_text(errors='replace')[-6000:]}"


@pytest.fixture
async def front(
    installed: dict[str, Installed], kit: AgentKit, model: FakeModel, tmp_path: Path, marker: str
) -> AsyncIterator[HttpFront]:
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    table = kit.agent_table(model_url=model.base_url, home=home, project=project, marker=marker)
    config = write_config(tmp_path / "lmbridge.toml", {kit.id: table})
    stderr_path = tmp_path / "lmbridge.stderr"
    command = [sys.executable, "-m", "bridge", "serve", "--config", str(config), "--http", "127.0.0.1:0"]
    command += ["--token-file", str(tmp_path / "token"), "--log-level", "debug"]
    with open(stderr_path, "wb") as stderr:
        process = await trio.lowlevel.open_process(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr
        )
    try:
        ready = b""
        with trio.fail_after(30):
            while b"\n" not in ready:
                chunk = await process.stdout.receive_some()
                assert chunk, stderr_path.read_text()
                ready += chunk
        line = json.loads(ready)
        token = Path(line["tokenFile"]).read_text().strip()
        yield HttpFront(kit, model, line["http"], token, project, stderr_path)
    finally:
        process.send_signal(signal.SIGTERM)
        with trio.move_on_after(30):
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, stderr_path.read_text()[-3000:]
    assert processes_with_marker(marker) == [], "an agent process outlived lmbridge"


async def test_chat_completions(front: HttpFront) -> None:
    kit, model = front.kit, front.model
    client = front.openai()
    model.add(say("Hello over Chat Completions."))
    messages: list[Any] = [{"role": "user", "content": "Say hello."}]
    text = await front.run(partial(client.chat.completions.create, model=kit.id, messages=messages))
    assert text.choices[0].message.content.endswith("Hello over Chat Completions."), front.evidence()
    assert text.choices[0].finish_reason == "stop"

    tool = {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER_SCHEMA},
    }
    model.add(call(kit.editor_tool("get_weather", {"city": "Paris"})), say("It is sunny in Paris."))
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = await front.run(partial(client.chat.completions.create, model=kit.id, messages=messages, tools=[tool]))
    assert first.choices[0].finish_reason == "tool_calls", front.evidence()
    (weather,) = first.choices[0].message.tool_calls
    assert weather.function.name == "get_weather" and json.loads(weather.function.arguments) == {"city": "Paris"}
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": weather.id, "content": "Sunny, 22 degrees"},
    ]
    stream = await front.run(
        lambda: list(client.chat.completions.create(model=kit.id, messages=messages, tools=[tool], stream=True))
    )
    final = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert final.endswith("It is sunny in Paris."), front.evidence()
    assert any("Sunny, 22 degrees" in result.text for result in model.turns[-1].tool_results)


async def test_responses(front: HttpFront) -> None:
    kit, model = front.kit, front.model
    client = front.openai()
    # Clients send their tools with every request (an agent learns its MCP tools when the session starts).
    tool = {"type": "function", "name": "get_weather", "description": "Weather", "parameters": WEATHER_SCHEMA}
    model.add(say("Hello over Responses."))
    text = await front.run(partial(client.responses.create, model=kit.id, input="Say hello.", tools=[tool]))
    assert text.output_text.endswith("Hello over Responses."), front.evidence()

    model.add(call(kit.editor_tool("get_weather", {"city": "Oslo"})), say("It snows in Oslo."))
    first = await front.run(
        partial(
            client.responses.create, model=kit.id, input="Weather in Oslo?", tools=[tool], previous_response_id=text.id
        )
    )
    (weather,) = [item for item in first.output if item.type == "function_call"]
    assert weather.name == "get_weather" and json.loads(weather.arguments) == {"city": "Oslo"}, front.evidence()
    output = [{"type": "function_call_output", "call_id": weather.call_id, "output": "Snow, -3 degrees"}]

    def finish() -> Any:
        with client.responses.stream(model=kit.id, input=output, tools=[tool], previous_response_id=first.id) as s:
            for _event in s:
                pass
            return s.get_final_response()

    final = await front.run(finish)
    assert final.output_text.endswith("It snows in Oslo."), front.evidence()
    assert any("Snow, -3 degrees" in result.text for result in model.turns[-1].tool_results)


async def test_messages(front: HttpFront) -> None:
    kit, model = front.kit, front.model
    client = front.anthropic()
    model.add(say("Hello over Messages."))
    messages: list[Any] = [{"role": "user", "content": "Say hello."}]
    text = await front.run(partial(client.messages.create, model=kit.id, max_tokens=1000, messages=messages))
    assert "".join(b.text for b in text.content if b.type == "text").endswith("Hello over Messages."), front.evidence()

    tool = {"name": "get_weather", "description": "Weather", "input_schema": WEATHER_SCHEMA}
    model.add(call(kit.editor_tool("get_weather", {"city": "Rome"})), say("It is warm in Rome."))
    messages = [{"role": "user", "content": "Weather in Rome?"}]
    first = await front.run(
        partial(client.messages.create, model=kit.id, max_tokens=1000, messages=messages, tools=[tool])
    )
    assert first.stop_reason == "tool_use", front.evidence()
    (weather,) = [b for b in first.content if b.type == "tool_use"]
    assert weather.name == "get_weather" and weather.input == {"city": "Rome"}
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": weather.id,
                    "content": [{"type": "text", "text": "Warm, 28 degrees"}],
                }
            ],
        },
    ]

    def finish() -> Any:
        with client.messages.stream(model=kit.id, max_tokens=1000, messages=messages, tools=[tool]) as stream:
            return stream.get_final_message()

    final = await front.run(finish)
    assert "".join(b.text for b in final.content if b.type == "text").endswith("It is warm in Rome."), front.evidence()
    assert any("Warm, 28 degrees" in result.text for result in model.turns[-1].tool_results)


async def test_permission_in_words(front: HttpFront) -> None:
    kit, model = front.kit, front.model
    client = front.openai()
    model.add(call(kit.shell("touch approved.txt")), say("Created approved.txt."))
    messages: list[Any] = [{"role": "user", "content": "Please create approved.txt."}]
    asked = await front.run(partial(client.chat.completions.create, model=kit.id, messages=messages))
    question = asked.choices[0].message.content or ""
    assert "The agent asks for permission" in question and "(allow)" in question, question + front.evidence()
    assert asked.choices[0].finish_reason == "stop"
    assert not (front.project / "approved.txt").exists(), "ran before the user answered"
    messages += [{"role": "assistant", "content": question}, {"role": "user", "content": "allow"}]
    final = await front.run(partial(client.chat.completions.create, model=kit.id, messages=messages))
    assert (final.choices[0].message.content or "").endswith("Created approved.txt."), front.evidence()
    assert (front.project / "approved.txt").exists()


async def test_models_listed_and_chosen_over_http(front: HttpFront) -> None:
    """/v1/models lists what the agent offers once a session showed it; a request chooses its model with an
    ``agent/model`` entry and its effort with the API's own ``reasoning_effort``."""
    kit, model = front.kit, front.model
    client = front.openai()
    model.add(say("Hello."))
    messages: list[Any] = [{"role": "user", "content": "Say hello."}]
    await front.run(partial(client.chat.completions.create, model=kit.id, messages=messages))
    listed = [entry.id for entry in await front.run(client.models.list)]
    entry = f"{kit.id}/{kit.model_entry}"
    assert entry in listed, listed
    model.add(say("Chosen."))
    ask = [{"role": "user", "content": "Which model?"}]
    answer = await front.run(
        partial(client.chat.completions.create, model=entry, messages=ask, reasoning_effort="high")
    )
    assert answer.choices[0].message.content.endswith("Chosen."), front.evidence()
    assert model_name(kit.model_entry) in requested_model(model.turns[-1]), requested_model(model.turns[-1])
    if kit.thought_level_option:  # Claude Code's effort: the Messages API's output_config.effort
        body = model.turns[-1].body
        assert body.get("output_config") == {"effort": "high"}, body.get("output_config")
