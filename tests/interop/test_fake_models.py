"""The fake model server on its own, through raw HTTP/1.1: no agent, no npm, so these run in ``make test`` too."""

from __future__ import annotations

import json
from typing import Any

import trio

from .fake_models import Call, FakeModel, Text, Turn, call, open_fake_model, parallel, say, stall


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
