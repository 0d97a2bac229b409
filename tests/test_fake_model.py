"""The fake model server on its own, through raw HTTP/1.1 and the official SDKs: no agent, no npm; and
``lmbridge fake-model``, its script files and its record, through a real process."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from bridge.fakemodel.server import Call, FakeModel, Text, Turn, call, open_fake_model, parallel, say, stall


class _Client:
    """Just enough of an HTTP/1.1 client: keep-alive, Content-Length or chunked bodies both ways."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def _until(self, marker: bytes) -> bytes:
        while marker not in self.buffer:
            data = await self.stream.receive_some()
            assert data, "the server closed the connection"
            self.buffer += data
        head, self.buffer = self.buffer.split(marker, 1)
        return head

    async def _exactly(self, size: int) -> bytes:
        while len(self.buffer) < size:
            self.buffer += await self.stream.receive_some()
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    async def send(self, path: str, body: Any, *, chunked: bool = False, method: str = "POST") -> None:
        data = json.dumps(body).encode()
        if chunked:
            framing, payload = "transfer-encoding: chunked", b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data)
        else:
            framing, payload = f"content-length: {len(data)}", data
        await self.stream.send_all(
            f"{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            f"{framing}\r\n\r\n".encode()
            + payload
        )

    async def head(self) -> tuple[int, dict[str, str]]:
        status_line, *lines = (await self._until(b"\r\n\r\n")).decode().split("\r\n")
        headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
        return int(status_line.split()[1]), headers

    async def response(self, path: str, body: Any, **kwargs: Any) -> tuple[int, bytes]:
        await self.send(path, body, **kwargs)
        status, headers = await self.head()
        if "content-length" in headers:
            return status, await self._exactly(int(headers["content-length"]))
        data = b""
        while size := int(await self._until(b"\r\n"), 16):
            data += await self._exactly(size)
            await self._exactly(2)
        await self._exactly(2)
        return status, data


def events(data: bytes) -> list[tuple[str | None, Any]]:
    parsed = []
    for block in data.decode().split("\n\n"):
        if not block.strip():
            continue
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        parsed.append((fields.get("event"), json.loads(fields["data"])))
    return parsed


async def connect(model: FakeModel) -> _Client:
    return _Client(await trio.open_tcp_stream("127.0.0.1", model.port))


async def test_anthropic_turn_streams_text_and_tool_use_then_stops_for_the_tool() -> None:
    tool = {"name": "mcp__editor__get_weather", "input_schema": {"type": "object"}}
    script = [Turn((Text("Let me check.", 2), Call("mcp__editor__get_weather", {"city": "Paris"})))]
    async with open_fake_model(script) as model:
        client = await connect(model)
        status, data = await client.response(
            "/v1/messages?beta=true", {"model": "claude-x", "stream": True, "tools": [tool], "messages": []}
        )
    assert status == 200
    stream = events(data)
    assert [name for name, _ in stream] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert "".join(d["delta"]["text"] for n, d in stream[2:4]) == "Let me check."
    assert stream[5][1]["content_block"]["name"] == "mcp__editor__get_weather"
    assert json.loads("".join(d["delta"]["partial_json"] for n, d in stream[6:8])) == {"city": "Paris"}
    assert stream[9][1]["delta"]["stop_reason"] == "tool_use"
    [request] = model.turns
    assert request.api == "anthropic" and request.query == {"beta": ["true"]}
    assert request.tool_names == ["mcp__editor__get_weather"]


async def test_openai_turns_follow_the_script_on_one_keep_alive_connection() -> None:
    script = [call(Call("get_weather", {"city": "Paris"}, namespace="mcp__editor")), say("Sunny.", 2)]
    tools = [{"type": "namespace", "name": "mcp__editor", "tools": [{"type": "function", "name": "get_weather"}]}]
    async with open_fake_model(script) as model:
        client = await connect(model)
        _, first = await client.response("/v1/responses", {"model": "fake-model", "tools": tools, "input": []})
        history = [{"type": "function_call_output", "call_id": "call_fake_1_0", "output": "Sunny, 22 degrees"}]
        _, second = await client.response(
            "/v1/responses", {"model": "fake-model", "tools": tools, "input": history}, chunked=True
        )
    done = [data["item"] for name, data in events(first) if name == "response.output_item.done"]
    assert done == [
        {
            "type": "function_call",
            "id": "fc_fake_1_0",
            "call_id": "call_fake_1_0",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
            "status": "completed",
            "namespace": "mcp__editor",
        }
    ]
    assert events(first)[-1][1]["response"]["usage"]["total_tokens"] == 19
    deltas = [data["delta"] for name, data in events(second) if name == "response.output_text.delta"]
    assert deltas == ["Sun", "ny."]
    assert model.turns[0].tool_names == ["mcp__editor/get_weather"]
    assert [r.text for r in model.turns[1].tool_results] == ["Sunny, 22 degrees"]


async def test_gemini_turn_sends_parallel_function_calls_and_a_final_chunk() -> None:
    script = [parallel(Call("mcp_editor_a", {"x": 1}), Call("mcp_editor_b", {}))]
    tools = [{"functionDeclarations": [{"name": "mcp_editor_a"}, {"name": "mcp_editor_b"}]}]
    async with open_fake_model(script) as model:
        client = await connect(model)
        _status, data = await client.response(
            "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse", {"contents": [], "tools": tools}
        )
    chunks = [payload["candidates"][0] for _, payload in events(data)]
    calls = [part["functionCall"]["name"] for c in chunks for part in c["content"]["parts"] if "functionCall" in part]
    assert calls == ["mcp_editor_a", "mcp_editor_b"]
    assert chunks[-1]["finishReason"] == "STOP"
    assert model.turns[0].tool_names == ["mcp_editor_a", "mcp_editor_b"]


async def test_a_stalled_turn_stays_open_until_the_client_disconnects() -> None:
    async with open_fake_model([stall("Thinking")]) as model:
        client = await connect(model)
        await client.send("/v1/messages", {"model": "claude-x", "stream": True, "messages": []})
        assert (await client.head())[0] == 200
        request = await model.wait_for_turn(1)
        await client._until(b"Thinking")
        assert not request.disconnected.is_set()
        await client.stream.aclose()
        with trio.fail_after(60):  # only a fake model that misses the disconnect reaches it
            await request.disconnected.wait()


async def test_side_requests_are_recorded_but_do_not_consume_the_script_and_extra_turns_are_errors() -> None:
    async with open_fake_model([say("only turn", chunks=1)]) as model:
        client = await connect(model)
        status, _ = await client.response("/v1/messages/count_tokens", {"messages": []})
        assert status == 200
        await client.send("/", {}, method="HEAD")
        assert (await client.head())[0] == 404  # and no body: the next response starts right after
        _, first = await client.response("/v1/messages", {"stream": True, "messages": []})
        _, extra = await client.response("/v1/messages", {"stream": True, "messages": []})
    assert "only turn" in first.decode() and "script has no more turns" in extra.decode()
    assert [r.path for r in model.requests] == ["/v1/messages/count_tokens", "/", "/v1/messages", "/v1/messages"]
    assert len(model.turns) == 2 and model.errors == ["unscripted model request #2: POST /v1/messages"]


async def test_chat_completions_through_the_official_openai_sdk_text_tool_call_and_a_picked_tool() -> None:
    import openai

    tools = [
        {"type": "function", "function": {"name": "list_files", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "mcp_conform_echo", "parameters": {"type": "object"}}},
    ]
    script = [say("Hello there", 4), call(Call("", {"text": "hi"}, offered="*echo"))]
    async with open_fake_model(script, default=say("and again", 1)) as model:
        client = openai.AsyncOpenAI(base_url=f"{model.base_url}/v1", api_key="dummy", max_retries=0)
        stream = await client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
        assert text == "Hello there"
        answer = await client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "echo"}], tools=tools
        )
        calls = answer.choices[0].message.tool_calls
        assert answer.choices[0].finish_reason == "tool_calls" and calls is not None
        assert (calls[0].function.name, json.loads(calls[0].function.arguments)) == ("mcp_conform_echo", {"text": "hi"})
        result = {"role": "tool", "tool_call_id": calls[0].id, "content": "echoed"}
        assistant = {"role": "assistant", "tool_calls": [calls[0].model_dump()]}
        again = await client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "echo"}, assistant, result], tools=tools
        )
        assert again.choices[0].message.content == "and again"  # the default, once the script is used up
        assert [m.id async for m in client.models.list()] == ["fake-model"]
        assert model.errors == []
        assert model.turns[2].tool_results[0].text == "echoed"
        assert model.turns[1].tool_names == ["list_files", "mcp_conform_echo"]


def test_script_files_are_read_and_their_mistakes_named(tmp_path: Path) -> None:
    from bridge.fakemodel.script import ScriptError, load_script, parse_script

    turns, then = parse_script(
        {
            "turns": [
                {"say": "a", "chunks": 1},
                {"call": {"offered": "*echo", "arguments": {"x": 1}}},
                {"parallel": [{"name": "a"}, {"name": "b", "namespace": "ns"}]},
                {"say": "b", "stall": True},
            ],
            "then": {"say": "z"},
        }
    )
    assert turns[0] == say("a", 1) and turns[3].stall and then == say("z")
    assert turns[1].calls[0].offered == "*echo" and [c.name for c in turns[2].calls] == ["a", "b"]
    for bad, message in [
        ([], "expected an object"),
        ({"turns": [{"sing": "a"}]}, "turns[0]: unknown key(s) sing"),
        ({"turns": [{}]}, "turns[0]: say something"),
        ({"turns": [{"call": {"name": "a", "offered": "b"}}]}, "turns[0].call: give exactly one"),
        ({"turns": [{"say": "a", "chunks": 0}]}, "turns[0].chunks"),
    ]:
        with pytest.raises(ScriptError, match=re.escape(message)):
            parse_script(bad)
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(ScriptError, match=re.escape("broken.json: not JSON")):
        load_script(broken)


def test_the_command_serves_a_script_prints_its_url_and_records_every_request(tmp_path: Path) -> None:
    import anthropic

    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [{"say": "first"}], "then": {"say": "after"}}))
    record = tmp_path / "record.ndjson"
    command = [sys.executable, "-m", "bridge", "fake-model", "--script", str(script), "--record", str(record)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        try:
            assert process.stdout is not None
            url = process.stdout.readline().strip()
            assert url.startswith("http://127.0.0.1:")
            client = anthropic.Anthropic(base_url=url, api_key="dummy", max_retries=0)
            texts = [
                client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}])
                .content[0]
                .text  # type: ignore[union-attr]
                for _ in range(2)
            ]
            assert texts == ["first", "after"]
        finally:
            process.terminate()
            process.wait(timeout=30)
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert [(line["api"], line["path"], line.get("turn")) for line in lines] == [
        ("anthropic", "/v1/messages", 1),
        ("anthropic", "/v1/messages", 2),
    ]


def test_the_command_refuses_a_bad_script_with_status_2(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [{"say": 3}]}))
    done = subprocess.run(
        [sys.executable, "-m", "bridge", "fake-model", "--script", str(script)], capture_output=True, text=True
    )
    assert done.returncode == 2 and "turns[0].say: expected a string" in done.stderr
