"""MCP over HTTP answered without the SDK (mcp_synthetic.early): the same answers as the SDK's, over real HTTP on
127.0.0.1; the official SDK's client served start to end without the SDK's server; and the SDK taking a session over
when a request needs it."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing
from fakes import MCP_DIALOGUE, MCP_TOOLS, mcp_initialize

from mcp_synthetic.early import (
    EARLY_PROTOCOL_VERSIONS,
    EarlyAnswer,
    EarlyCall,
    EarlyCancel,
    EarlyEnd,
    EarlyRefusal,
    EarlyStream,
    answer_early,
)
from wire.observe.logs import get_logger

TOKEN = "secret-token"
PNG = base64.b64encode(b"\x89PNG....").decode()


async def _answer(name: str, arguments: Any) -> Any:
    content = [{"type": "text", "value": f"{name}: {json.dumps(arguments)}"}]
    return {"content": [*content, {"type": "data", "mimeType": "image/png", "data": PNG}]}, ""


@asynccontextmanager
async def _listener(
    sdk: trio.Event | Callable[[], Awaitable[Any]] | None, invoke: Callable[..., Any] = _answer
) -> AsyncIterator[tuple[str, Any]]:
    """An MCP endpoint on 127.0.0.1 whose HTTP server runs at once; its SDK, when a request needs it, is "imported"
    once ``sdk`` is set or returns (``None``: the SDK serves every request)."""
    from mcp_synthetic.http import HttpEndpoints
    from mcp_synthetic.server import SessionTools

    async def nothing() -> None:
        pass

    tools = SessionTools(invoke, log=get_logger())
    tools.update(MCP_TOOLS)
    ready = nothing if sdk is None else sdk.wait if isinstance(sdk, trio.Event) else sdk
    endpoints = HttpEndpoints(get_logger(), ready, nothing, own_answers=sdk is not None)
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


def _messages(headers: dict[str, str], body: bytes) -> Any:
    """The JSON-RPC messages of an answer: an event stream's, or a JSON body (an error)."""
    if headers.get("content-type", "").startswith("text/event-stream"):
        return _events(body)
    return json.loads(body) if body else None


async def _exchange(url: str, version: str) -> list[tuple[int, str, Any]]:
    """One session's opening, its use and its end, as an agent makes them: status, content type and messages of
    each (the event stream's head included)."""
    status, headers, body = await _request(url, mcp_initialize(version))
    session = headers["mcp-session-id"]
    answers = [(status, headers["content-type"], _events(body))]
    stream = await _open_stream(url, session)
    head = (await _response_head(stream)).decode().lower().replace(session, "(the session)").split("\r\n")
    await stream.aclose()
    wanted = ("content-type", "cache-control", "mcp-session-id")
    answers.append((int(head[0].split()[1]), "", sorted(line for line in head[1:] if line.startswith(wanted))))
    for message in MCP_DIALOGUE:
        status, headers, body = await _request(url, message, session)
        assert headers["mcp-session-id"] == session
        answers.append((status, headers["content-type"], _events(body)))
    for method, message in (("DELETE", None), ("POST", {"jsonrpc": "2.0", "id": 7, "method": "tools/list"})):
        status, headers, body = await _request(url, message, session, method)  # the end, then a request after it
        answers.append((status, headers["content-type"], _messages(headers, body)))
    return answers


@pytest.mark.parametrize("version", sorted(EARLY_PROTOCOL_VERSIONS))
async def test_a_session_opened_before_the_sdk_is_imported_gets_the_sdks_answers(version: str) -> None:
    never = trio.Event()
    async with _listener(never) as (early_url, _), _listener(None) as (sdk_url, _):
        early = await _exchange(early_url, version)
        by_sdk = await _exchange(sdk_url, version)
    assert early == by_sdk
    assert early[0][2][0]["result"]["protocolVersion"] == version  # the SDK takes this revision: it echoes it
    assert [status for status, _, _ in early] == [200, 200, 202, 200, 200, 200, 200, 200, 200, 200, 404]


async def test_the_early_answers_are_valid_mcp() -> None:
    import mcp_types

    from mcp_synthetic.early import progress_event

    never = trio.Event()
    async with _listener(never) as (url, _):
        answers = await _exchange(url, "2025-11-25")
    mcp_types.InitializeResult.model_validate(answers[0][2][0]["result"])
    mcp_types.ListToolsResult.model_validate(answers[3][2][0]["result"])
    mcp_types.CallToolResult.model_validate(answers[5][2][0]["result"])
    [beat] = _events(progress_event("tok", 2))
    mcp_types.ProgressNotification.model_validate(beat)


async def test_the_sdk_takes_over_a_session_when_a_request_needs_it() -> None:
    sdk = trio.Event()
    async with _listener(sdk) as (url, tools), trio.open_nursery() as nursery:
        _, headers, _ = await _request(url, mcp_initialize("2025-06-18"))
        session = headers["mcp-session-id"]
        assert (await _request(url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session))[0] == 202
        call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "erase", "arguments": {}}}
        status, _, body = await _request(url, call, session)
        assert status == 200 and _events(body)[0]["result"]["content"][0]["text"] == "erase: {}"
        stream = await _open_stream(url, session)
        assert (await _response_head(stream)).startswith(b"HTTP/1.1 200")
        assert tools._connections == []  # no SDK session yet

        answers: list[Any] = []

        async def unusual() -> None:  # a method lmbridge does not answer itself: the SDK's "method not found"
            answers.append(await _request(url, {"jsonrpc": "2.0", "id": 2, "method": "resources/list"}, session))

        nursery.start_soon(unusual)
        await trio.testing.wait_all_tasks_blocked()  # the request is in, held while the SDK "imports"
        assert answers == []
        sdk.set()
        with trio.fail_after(30):
            while not answers:
                await trio.sleep(0.01)
            rest = b""
            while not rest.endswith(b"0\r\n\r\n"):  # the stream served without the SDK ends at the take-over,
                rest += await stream.receive_some()  # in good order: the last chunk, not a cut connection
        [(status, headers, body)] = answers
        assert status == 200 and headers["mcp-session-id"] == session  # the agent keeps its id
        assert _events(body)[0]["error"]["code"] == -32601
        [sdk_session] = tools._connections  # the replayed notifications/initialized reached the SDK
        assert sdk_session is not None

        call["id"] = 3
        status, headers, body = await _request(url, call, session)
        assert status == 200 and headers["mcp-session-id"] == session
        assert _events(body)[0]["result"]["content"][0]["text"] == "erase: {}"
        assert (await _request(url, None, session, "DELETE"))[0] == 200
        assert (await _request(url, call, session))[0] == 404  # ended at the SDK: MCP clients open a new one


async def test_the_official_client_is_served_start_to_end_without_the_sdks_server() -> None:
    """The MCP SDK's own client, as it connects by default (``server/discover`` first, MCP 2026-07-28): it falls back
    to ``initialize``, opens the event stream, lists and calls tools, hears of a tool list change, and ends the
    session — and lmbridge never needs the SDK's server for any of it."""
    import httpx2
    import mcp_types
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    needed: list[str] = []

    async def sdk() -> None:
        needed.append("the SDK")
        await trio.sleep_forever()

    notified = trio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, mcp_types.ToolListChangedNotification):
            notified.set()

    async with _listener(sdk) as (url, tools):
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with trio.fail_after(30):
            async with (
                httpx2.AsyncClient(headers=headers, timeout=None) as http,
                Client(streamable_http_client(url, http_client=http), message_handler=on_message) as client,
            ):
                assert client.protocol_version == "2025-11-25"
                listed = await client.list_tools()
                assert [tool.name for tool in listed.tools] == ["get_weather", "erase", "broken"]
                result = await client.call_tool("get_weather", {"city": "Oslo"})
                assert result.content[0].text == 'get_weather: {"city": "Oslo"}'  # type: ignore[union-attr]
                await trio.testing.wait_all_tasks_blocked()  # the client's event stream is open
                assert tools.update([*MCP_TOOLS, {"name": "get_time", "inputSchema": {"type": "object"}}])
                await tools.notify_changed()
                await notified.wait()
                assert "get_time" in [tool.name for tool in (await client.list_tools()).tools]
    assert needed == []


async def test_when_the_sdk_cannot_be_imported_only_what_needs_it_fails() -> None:
    async def broken() -> None:
        raise RuntimeError("the MCP SDK failed to load: No module named 'mcp'")

    from mcp_synthetic.http import HttpEndpoints
    from mcp_synthetic.server import SessionTools

    async def nothing() -> None:
        pass

    tools = SessionTools(_answer, log=get_logger())
    tools.update(MCP_TOOLS)
    endpoints = HttpEndpoints(get_logger(), broken, nothing)
    async with trio.open_nursery() as nursery:
        await nursery.start(endpoints.run)
        url, _stop = endpoints.add(tools, TOKEN)
        _, headers, _ = await _request(url, mcp_initialize("2025-11-25"))
        session = headers["mcp-session-id"]
        status, _, body = await _request(url, {"jsonrpc": "2.0", "id": 1, "method": "resources/list"}, session)
        assert status == 500 and b"could not be imported" in body
        status, _, body = await _request(url, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, session)
        assert status == 200 and len(_events(body)[0]["result"]["tools"]) == 3
        nursery.cancel_scope.cancel()


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

    async def held(name: str, arguments: Any) -> Any:
        started.set()
        try:
            await trio.sleep_forever()
        finally:
            withdrawn.set()

    never = trio.Event()
    async with _listener(never, held) as (url, _), trio.open_nursery() as nursery:
        _, headers, _ = await _request(url, mcp_initialize("2025-03-26"))
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


async def test_each_early_answer_goes_out_in_one_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """The head, the body and the chunked stream's end of each answer reach the socket together: a client is woken
    once per answer, not three times (an editor's tool answering at once included)."""
    import mcp_synthetic.http

    monkeypatch.setattr(mcp_synthetic.http, "_HEAD_DELAY", 3600.0)  # the tools here answer at once
    writes: list[bytes] = []
    send_all = trio.SocketStream.send_all

    async def counted(self: trio.SocketStream, data: Any) -> None:
        writes.append(bytes(data))
        await send_all(self, data)

    monkeypatch.setattr(trio.SocketStream, "send_all", counted)
    async with _listener(trio.Event()) as (url, _):
        _, headers, _ = await _request(url, mcp_initialize("2025-06-18"))
        session = headers["mcp-session-id"]
        assert len(writes) == 1 and writes[0].startswith(b"HTTP/1.1 200") and writes[0].endswith(b"0\r\n\r\n")
        for message in MCP_DIALOGUE:
            writes.clear()
            status, _, body = await _request(url, message, session)
            assert len(writes) == 1, (message, writes)
            assert writes[0].startswith(f"HTTP/1.1 {status}".encode()) and body in writes[0], writes


async def test_a_slow_tool_calls_answer_head_goes_out_before_its_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A call still running after ``_HEAD_DELAY`` has its head sent then (clients give up on a head that never
    comes), and its answer follows on the same stream."""
    import mcp_synthetic.http

    monkeypatch.setattr(mcp_synthetic.http, "_HEAD_DELAY", 0.01)
    release = trio.Event()

    async def slow(name: str, arguments: Any) -> Any:
        await release.wait()
        return await _answer(name, arguments)

    async with _listener(trio.Event(), slow) as (url, _):
        _, headers, _ = await _request(url, mcp_initialize("2025-06-18"))
        session = headers["mcp-session-id"]
        address, path = url.removeprefix("http://").split("/", 1)
        host, port = address.split(":")
        call = {
            "jsonrpc": "2.0",
            "id": 9,
            "method": "tools/call",
            "params": {"name": "get_weather", "arguments": {"city": "Oslo"}},
        }
        data = json.dumps(call).encode()
        stream = await trio.open_tcp_stream(host, int(port))
        await stream.send_all(
            f"POST /{path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n"
            f"Accept: application/json, text/event-stream\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Mcp-Session-Id: {session}\r\nContent-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        with trio.fail_after(30):
            head = await _response_head(stream)  # the call is still waiting for ``release``
        assert head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head.lower()
        release.set()
        received = b""
        with trio.fail_after(30):
            while not received.endswith(b"0\r\n\r\n"):
                received += await stream.receive_some()
        await stream.aclose()
    [answer] = [json.loads(line[5:]) for line in received.split(b"\n") if line.startswith(b"data:")]
    assert answer["id"] == 9 and "result" in answer


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
        ("another revision", mcp_initialize("2026-07-28"), None, "POST"),
        ("an unknown revision", mcp_initialize("1999-01-01"), None, "POST"),
        ("a GET stream", mcp_initialize("2025-06-18"), None, "GET"),
        ("a batch", [mcp_initialize("2025-06-18")], None, "POST"),
        ("not JSON", b"{", None, "POST"),
        ("no id", {**mcp_initialize("2025-06-18"), "id": None}, None, "POST"),
        ("a boolean id", {**mcp_initialize("2025-06-18"), "id": True}, None, "POST"),
        ("another host", mcp_initialize("2025-06-18"), {**GOOD, b"host": b"evil.example:4000"}, "POST"),
        ("a web page's origin", mcp_initialize("2025-06-18"), {**GOOD, b"origin": b"https://evil.example"}, "POST"),
        ("no event stream accepted", mcp_initialize("2025-06-18"), {**GOOD, b"accept": b"application/json"}, "POST"),
        ("not JSON content", mcp_initialize("2025-06-18"), {**GOOD, b"content-type": b"text/plain"}, "POST"),
        (
            "a resumed event stream",
            b"",
            {**GOOD, b"mcp-session-id": b"s1", b"last-event-id": b"e1"},
            "GET",
        ),
        ("an event stream not accepted", b"", {b"host": HOST.encode(), b"mcp-session-id": b"s1"}, "GET"),
        ("a stream without a session", b"", GOOD, "GET"),
        ("an end without a session", b"", GOOD, "DELETE"),
        ("another HTTP method", b"", {**GOOD, b"mcp-session-id": b"s1"}, "PUT"),
        ("an end from another host", b"", {b"host": b"evil.example:4000", b"mcp-session-id": b"s1"}, "DELETE"),
        ("a discovery that is a notification", {"jsonrpc": "2.0", "method": "server/discover"}, None, "POST"),
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
    opened = _decide(mcp_initialize("2025-06-18"))
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
    assert _decide(b"", in_session, "GET") == EarlyStream("s1")
    assert _decide(b"", in_session, "DELETE") == EarlyEnd("s1")


@pytest.mark.parametrize("method", ["POST", "GET", "DELETE"])
def test_a_session_not_known_is_not_found(method: str) -> None:
    """All of a route's sessions are opened here until the SDK serves it: another id is an ended session's, or a
    stranger's. The SDK's answer, which tells MCP clients to open a new session."""
    refusal = _decide({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, {**GOOD, b"mcp-session-id": b"s9"}, method)
    assert isinstance(refusal, EarlyRefusal) and refusal.status == 404
    error = {"code": -32600, "message": "Session not found"}
    assert json.loads(refusal.body) == {"jsonrpc": "2.0", "id": None, "error": error}


def test_discovery_is_refused_as_a_server_of_the_initialize_revisions_refuses_it() -> None:
    refusal = _decide({"jsonrpc": "2.0", "id": "d1", "method": "server/discover", "params": {}})
    assert isinstance(refusal, EarlyRefusal) and refusal.status == 400 and refusal.session_id == ""
    answer = json.loads(refusal.body)
    assert answer["id"] == "d1" and answer["error"]["code"] == -32601
    assert "initialize" in answer["error"]["message"]  # what the client should do instead
