"""The opening of an MCP session answered before the SDK is imported (mcp_synthetic.early): the same answers as the
SDK's, over real HTTP on 127.0.0.1, and the SDK taking the session over once it is imported."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from mcp_synthetic.early import EARLY_PROTOCOL_VERSIONS, EarlyAnswer, EarlyCall, EarlyCancel, answer_early

TOKEN = "secret-token"
PNG = base64.b64encode(b"\x89PNG....").decode()
TOOLS = [
    {
        "name": "get_weather",
        "description": "The weather — in a city.",
        "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
    {"name": "erase", "description": "", "inputSchema": {"type": "object"}, "annotations": {"destructiveHint": True}},
    {"name": "broken", "description": "b", "inputSchema": {"type": "object", "properties": {"n": {"type": 5}}}},
]


class _Log:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: self if name == "bind" else None


async def _answer(name: str, arguments: Any, cancel: Any) -> Any:
    content = [{"type": "text", "value": f"{name}: {json.dumps(arguments)}"}]
    return {"content": [*content, {"type": "data", "mimeType": "image/png", "data": PNG}]}, ""


@asynccontextmanager
async def _listener(sdk: trio.Event | None, invoke: Callable[..., Any] = _answer) -> AsyncIterator[tuple[str, Any]]:
    """An MCP endpoint on 127.0.0.1 whose HTTP server runs at once; its SDK is "imported" when ``sdk`` is set
    (``None``: at once)."""
    from mcp_synthetic.http import HttpEndpoints
    from mcp_synthetic.server import SessionTools

    async def nothing() -> None:
        pass

    tools = SessionTools(invoke, log=_Log())
    tools.update(TOOLS)
    endpoints = HttpEndpoints(_Log(), sdk.wait if sdk is not None else nothing, nothing)
    async with trio.open_nursery() as nursery:
        await nursery.start(endpoints.run)
        url, _stop = endpoints.add(tools, TOKEN)
        yield url, tools
        nursery.cancel_scope.cancel()


def _post(
    url: str, message: Any, session: str | None = None, method: str = "POST"
) -> tuple[int, dict[str, str], bytes]:
    headers = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "authorization": f"Bearer {TOKEN}",
    }
    if session:
        headers["mcp-session-id"] = session
    data = json.dumps(message).encode() if message is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


async def _request(url: str, message: Any, session: str | None = None, method: str = "POST") -> Any:
    return await trio.to_thread.run_sync(_post, url, message, session, method)


def _events(body: bytes) -> list[Any]:
    return [json.loads(line[5:]) for line in body.split(b"\r\n") if line.startswith(b"data:")]


def _initialize(version: str) -> dict[str, Any]:
    params = {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}
    return {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params}


async def _exchange(url: str, version: str) -> list[tuple[int, str, Any]]:
    """One session's opening and its use, as an agent makes them: status, content type and messages of each."""
    status, headers, body = await _request(url, _initialize(version))
    session = headers["mcp-session-id"]
    answers = [(status, headers["content-type"], _events(body))]
    for message in (
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": "two", "method": "ping"},
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {"name": "get_weather", "arguments": {"city": "Oslo"}},
        },
        {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "get_weather", "arguments": {}}},
        {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "nowhere"}},
        {"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": "broken", "arguments": {}}},
    ):
        status, headers, body = await _request(url, message, session)
        assert headers["mcp-session-id"] == session
        answers.append((status, headers["content-type"], _events(body)))
    return answers


@pytest.mark.parametrize("version", sorted(EARLY_PROTOCOL_VERSIONS))
async def test_a_session_opened_before_the_sdk_is_imported_gets_the_sdks_answers(version: str) -> None:
    never = trio.Event()
    async with _listener(never) as (early_url, _), _listener(None) as (sdk_url, _):
        early = await _exchange(early_url, version)
        by_sdk = await _exchange(sdk_url, version)
    assert early == by_sdk
    assert early[0][2][0]["result"]["protocolVersion"] == version  # the SDK takes this revision: it echoes it
    assert [status for status, _, _ in early] == [200, 202, 200, 200, 200, 200, 200, 200]


async def test_the_early_answers_are_valid_mcp() -> None:
    import mcp_types

    from mcp_synthetic.early import progress_event

    never = trio.Event()
    async with _listener(never) as (url, _):
        answers = await _exchange(url, "2025-11-25")
    mcp_types.InitializeResult.model_validate(answers[0][2][0]["result"])
    mcp_types.ListToolsResult.model_validate(answers[2][2][0]["result"])
    mcp_types.CallToolResult.model_validate(answers[4][2][0]["result"])
    [beat] = _events(progress_event("tok", 2))
    mcp_types.ProgressNotification.model_validate(beat)


async def test_the_sdk_takes_over_a_session_opened_before_it_was_imported() -> None:
    sdk = trio.Event()
    async with _listener(sdk) as (url, tools):
        _, headers, _ = await _request(url, _initialize("2025-06-18"))
        session = headers["mcp-session-id"]
        assert (await _request(url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session))[0] == 202
        call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "erase", "arguments": {}}}
        status, _, body = await _request(url, call, session)
        assert status == 200 and _events(body)[0]["result"]["content"][0]["text"] == "erase: {}"
        assert tools._connections == []  # no SDK session yet

        stream = await _open_stream(url, session)
        await trio.testing.wait_all_tasks_blocked()  # the GET is in, held: the early path never answers a GET
        sdk.set()
        with trio.fail_after(30):
            head = await _response_head(stream)
        assert head.startswith(b"HTTP/1.1 200") and b"content-type: text/event-stream" in head.lower(), head
        await stream.aclose()
        [sdk_session] = tools._connections  # the replayed notifications/initialized reached the SDK
        assert sdk_session is not None

        call["id"] = 2
        status, headers, body = await _request(url, call, session)
        assert status == 200 and headers["mcp-session-id"] == session  # the agent keeps its id
        assert _events(body)[0]["result"]["content"][0]["text"] == "erase: {}"
        assert (await _request(url, None, session, "DELETE"))[0] == 200
        assert (await _request(url, call, session))[0] == 404  # ended at the SDK: MCP clients open a new one


async def _open_stream(url: str, session: str) -> trio.SocketStream:
    """A GET for the session's event stream, sent; the answer is read by ``_response_head``."""
    address, path = url.removeprefix("http://").split("/", 1)
    host, port = address.split(":")
    stream = await trio.open_tcp_stream(host, int(port))
    request = (
        f"GET /{path} HTTP/1.1\r\nHost: {address}\r\nAccept: text/event-stream\r\n"
        f"Authorization: Bearer {TOKEN}\r\nMcp-Session-Id: {session}\r\n\r\n"
    )
    await stream.send_all(request.encode())
    return stream


async def _response_head(stream: trio.SocketStream) -> bytes:
    head = b""
    while b"\r\n\r\n" not in head:
        data = await stream.receive_some()
        assert data, head
        head += data
    return head.split(b"\r\n\r\n")[0]


async def test_a_tool_call_made_before_the_sdk_is_imported_can_be_withdrawn() -> None:
    started, withdrawn = trio.Event(), trio.Event()

    async def held(name: str, arguments: Any, cancel: Any) -> Any:
        started.set()
        try:
            await trio.sleep_forever()
        finally:
            withdrawn.set()

    never = trio.Event()
    async with _listener(never, held) as (url, _), trio.open_nursery() as nursery:
        _, headers, _ = await _request(url, _initialize("2025-03-26"))
        session = headers["mcp-session-id"]
        answers: list[Any] = []
        answered = trio.Event()

        async def call() -> None:
            message = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "erase", "arguments": {}}}
            answers.append(await _request(url, message, session))
            answered.set()

        nursery.start_soon(call)
        with trio.fail_after(30):
            await started.wait()
        cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}}
        assert (await _request(url, cancel, session))[0] == 202
        with trio.fail_after(30):
            await withdrawn.wait()
            await answered.wait()
    [(status, _, body)] = answers
    assert status == 200 and _events(body) == []  # MCP: a cancelled request gets no answer


# -- the decision alone ---------------------------------------------------------------------------------------------

HOST = "127.0.0.1:4000"
GOOD = {
    b"host": HOST.encode(),
    b"content-type": b"application/json",
    b"accept": b"application/json, text/event-stream",
}


def _decide(message: Any, headers: dict[bytes, bytes] | None = None, method: str = "POST") -> Any:
    body = message if isinstance(message, bytes) else json.dumps(message).encode()
    sessions = {"s1": "2025-06-18"}
    return answer_early(method, headers or GOOD, body, host=HOST, sessions=sessions, listing=list)


@pytest.mark.parametrize(
    ("why", "message", "headers", "method"),
    [
        ("another revision", _initialize("2026-07-28"), None, "POST"),
        ("an unknown revision", _initialize("1999-01-01"), None, "POST"),
        ("a GET stream", _initialize("2025-06-18"), None, "GET"),
        ("a batch", [_initialize("2025-06-18")], None, "POST"),
        ("not JSON", b"{", None, "POST"),
        ("no id", {**_initialize("2025-06-18"), "id": None}, None, "POST"),
        ("a boolean id", {**_initialize("2025-06-18"), "id": True}, None, "POST"),
        ("another host", _initialize("2025-06-18"), {**GOOD, b"host": b"evil.example:4000"}, "POST"),
        ("a web page's origin", _initialize("2025-06-18"), {**GOOD, b"origin": b"https://evil.example"}, "POST"),
        ("no event stream accepted", _initialize("2025-06-18"), {**GOOD, b"accept": b"application/json"}, "POST"),
        ("not JSON content", _initialize("2025-06-18"), {**GOOD, b"content-type": b"text/plain"}, "POST"),
        (
            "an unknown session",
            {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            {**GOOD, b"mcp-session-id": b"s9"},
            "POST",
        ),
        (
            "another revision's header",
            {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            {**GOOD, b"mcp-session-id": b"s1", b"mcp-protocol-version": b"2025-03-26"},
            "POST",
        ),
        (
            "a method not answered here",
            {"jsonrpc": "2.0", "id": 1, "method": "resources/list"},
            {**GOOD, b"mcp-session-id": b"s1"},
            "POST",
        ),
        (
            "arguments that are not an object",
            {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "t", "arguments": [1]}},
            {**GOOD, b"mcp-session-id": b"s1"},
            "POST",
        ),
    ],
)
def test_anything_unusual_is_left_to_the_sdk(why: str, message: Any, headers: Any, method: str) -> None:
    assert _decide(message, headers, method) is None, why


def test_the_decisions_for_a_session_opened_early() -> None:
    in_session = {**GOOD, b"mcp-session-id": b"s1", b"mcp-protocol-version": b"2025-06-18"}
    opened = _decide(_initialize("2025-06-18"))
    assert isinstance(opened, EarlyAnswer) and opened.opens_session and len(opened.session_id) == 32
    assert _decide({"jsonrpc": "2.0", "method": "notifications/initialized"}, in_session) == EarlyAnswer(
        202, b"", "s1", "2025-06-18"
    )
    call = {"name": "t", "arguments": {"a": 1}, "_meta": {"progressToken": 9}}
    assert _decide({"jsonrpc": "2.0", "id": "c", "method": "tools/call", "params": call}, in_session) == EarlyCall(
        "s1", "c", "t", {"a": 1}, 9
    )
    cancelled = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "c"}}
    assert _decide(cancelled, in_session) == EarlyCancel("s1", "c")
