"""The synthetic MCP server's pure parts: tool names agents accept, argument validation, result content."""

from __future__ import annotations

import base64
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcp_synthetic.names import MAX_NAME, ToolNames, agent_name
from mcp_synthetic.server import agent_annotations
from mcp_synthetic.validation import ToolSchema

_ACCEPTED = re.compile(r"^[A-Za-z0-9_-]{1,48}$")


def test_safe_names_pass_through_unchanged() -> None:
    for name in ("get_weather", "read-file", "copilot_readFile", "x" * MAX_NAME):
        assert agent_name(name) == name


@given(st.lists(st.text(min_size=1, max_size=200), min_size=1, max_size=20, unique=True))
def test_any_names_map_to_accepted_distinct_names_and_back(names: list[str]) -> None:
    mapping = ToolNames(names)
    agent_names = [mapping.agent(name) for name in names]
    assert all(_ACCEPTED.match(n) for n in agent_names)
    assert len(set(agent_names)) == len(names)
    assert [mapping.editor(n) for n in agent_names] == names


def test_rewritten_names_stay_recognisable() -> None:
    assert agent_name("github.copilot.search files").startswith("github_copilot_search_files_")


def test_valid_arguments_pass_and_problems_are_listed_with_their_place() -> None:
    schema = ToolSchema(
        "f",
        {
            "type": "object",
            "properties": {
                "n": {"type": "integer", "minimum": 1},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["n"],
            "additionalProperties": False,
        },
    )
    assert schema.error is None and schema.check({"n": 2, "tags": ["a"]}).ok
    problems = schema.check({"n": 0, "tags": ["a", 3], "extra": True}).problems
    assert problems == [
        "arguments: Additional properties are not allowed ('extra' was unexpected)",
        "n: 0 is less than the minimum of 1",
        "tags/1: 3 is not of type 'string'",
    ]
    assert schema.check(None).problems == ["arguments: 'n' is a required property"]


def test_json_strings_are_parsed_where_the_schema_wants_objects_or_arrays() -> None:
    schema = ToolSchema(
        "f",
        {
            "type": "object",
            "properties": {
                "options": {"type": "object", "properties": {"deep": {"type": "array"}}},
                "text": {"type": "string"},
            },
        },
    )
    check = schema.check({"options": '{"deep": "[1, 2]"}', "text": '{"not": "parsed"}'})
    assert check.ok and check.arguments == {"options": {"deep": [1, 2]}, "text": '{"not": "parsed"}'}
    assert schema.check('{"text": "whole arguments as a string"}').arguments == {"text": "whole arguments as a string"}


def test_an_invalid_schema_is_reported_not_raised() -> None:
    schema = ToolSchema("f", {"type": "object", "properties": {"n": {"type": 5}}})
    assert schema.error is not None and "properties/n/type" in schema.error
    assert schema.check({}).problems[0].startswith("the tool 'f' cannot be called")


class _Warnings:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def bind(self, **_: Any) -> _Warnings:
        return self

    def warning(self, event: str, **fields: Any) -> None:
        self.seen.append((event, fields))

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def _unique_schema(bad: bool = False) -> dict[str, Any]:
    """A schema no other test compiled (the compiled schemas are shared by the whole process)."""
    import uuid

    return {"type": "object", "properties": {uuid.uuid4().hex: {"type": 5 if bad else "string"}}}


def test_a_schema_is_compiled_on_first_use_once_for_the_whole_process() -> None:
    schema = _unique_schema()
    first = ToolSchema("f", schema)
    assert not first.compiled  # taking the editor's tools costs no compile
    assert first.check({}).ok and first.compiled
    assert ToolSchema("g", dict(schema)).compiled  # another tool, another session: the same schema is known
    assert not ToolSchema("h", {**schema, "required": ["x"]}).compiled


async def test_taking_the_tools_compiles_nothing_and_the_background_compile_reports_an_invalid_schema() -> None:
    from mcp_synthetic.server import SessionTools

    async def invoke(name: str, arguments: Any) -> Any:
        raise AssertionError("not called")

    log = _Warnings()
    tools = SessionTools(invoke, log=log)
    tools.update(
        [
            {"name": "good", "description": "d", "inputSchema": _unique_schema()},
            {"name": "bad", "description": "d", "inputSchema": _unique_schema(bad=True)},
        ]
    )
    assert not any(tool.schema.compiled for tool in tools._tools.values())
    await tools.compile_schemas()
    assert all(tool.schema.compiled for tool in tools._tools.values())
    assert [(event, fields["tool"]) for event, fields in log.seen] == [
        ("the editor gave a tool an invalid input schema; the agent will be told", "bad")
    ]
    listed = {tool["name"]: tool["description"] for tool in tools.listing()}
    assert listed["good"] == "d" and listed["bad"].startswith("(Unavailable: the editor gave this tool an invalid")
    assert len(log.seen) == 1  # said once


def test_a_tool_list_asked_before_the_background_compile_compiles_what_it_needs() -> None:
    from mcp_synthetic.server import SessionTools

    async def invoke(name: str, arguments: Any) -> Any:
        raise AssertionError("not called")

    log = _Warnings()
    tools = SessionTools(invoke, log=log)
    tools.update([{"name": "bad", "description": "d", "inputSchema": _unique_schema(bad=True)}])
    [listed] = tools.listing()
    assert listed["description"].startswith("(Unavailable") and len(log.seen) == 1


def test_result_content_maps_text_images_and_data() -> None:
    from mcp_synthetic.server import to_mcp_content

    png = base64.b64encode(b"\x89PNG....").decode()
    content = to_mcp_content(
        [
            {"type": "text", "value": "hello"},
            {"type": "data", "mimeType": "image/png", "data": png},
            {"type": "data", "mimeType": "application/json", "data": base64.b64encode(b'{"a": 1}').decode()},
            {"type": "data", "mimeType": "application/zip", "data": base64.b64encode(b"PK\x03\x04").decode()},
        ]
    )
    assert [c["type"] for c in content] == ["text", "image", "text", "text"]
    assert content[1] == {"type": "image", "data": png, "mimeType": "image/png"}
    assert content[2]["text"] == '{"a": 1}' and content[3]["text"] == "[application/zip data, 4 bytes]"


async def test_a_waiting_call_sends_progress_heartbeats(autojump_clock) -> None:
    """While the editor runs a tool, an agent that gave a progress token hears from us every 15 s (agents time
    tools out). In-process, on a mock clock."""
    import trio

    from mcp_synthetic.server import PROGRESS_INTERVAL, SessionTools
    from wire.observe.logs import get_logger

    release = trio.Event()

    async def invoke(name, arguments):
        await release.wait()
        return {"type": "tool_result", "callId": "x", "content": [{"type": "text", "value": "done"}]}, ""

    beats: list[tuple[int, float]] = []

    async def progress(beat: float, message: str) -> None:
        beats.append((beat, trio.current_time()))

    tools = SessionTools(invoke, log=get_logger())
    tools.update([{"name": "slow", "description": "", "inputSchema": {"type": "object"}}])
    async with trio.open_nursery() as nursery:
        results = []

        async def call() -> None:
            results.append(await tools.call("slow", {}, progress))

        nursery.start_soon(call)
        await trio.sleep(PROGRESS_INTERVAL * 3 + 1)
        release.set()
    assert [(beat, round(at)) for beat, at in beats] == [(1, 15), (2, 30), (3, 45)]
    assert results == [{"content": [{"type": "text", "text": "done"}], "isError": False}]


@pytest.mark.parametrize(
    ("client", "parallel", "seen"),
    [
        (None, True, {"readOnlyHint": True}),
        (None, False, {}),
        ({"destructiveHint": True}, True, {"destructiveHint": True}),
        ({"readOnlyHint": False, "title": "Edit"}, True, {"readOnlyHint": False, "title": "Edit"}),
        (
            {"readOnlyHint": "yes", "bogus": 1, "openWorldHint": True},
            True,
            {"openWorldHint": True, "readOnlyHint": True},
        ),
        ("not an object", True, {"readOnlyHint": True}),
    ],
)
def test_the_agent_sees_the_clients_annotations_and_read_only_unless_told_otherwise(client, parallel, seen) -> None:
    assert agent_annotations(client, parallel=parallel) == seen


# -- the shared HTTP listener: URLs before the HTTP server is imported -------------------------------------------------


def _post_initialize(url: str) -> int:
    import json
    import urllib.request

    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    headers = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "authorization": "Bearer secret-token",
    }
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()
        return int(response.status)


def _endpoints(ready: Any) -> tuple[Any, Any]:
    from mcp_synthetic.http import HttpEndpoints
    from mcp_synthetic.server import SessionTools

    async def invoke(name: str, arguments: Any) -> Any:
        return {"content": [{"type": "text", "value": "ok"}]}, ""

    tools = SessionTools(invoke, log=_Warnings())
    tools.update([{"name": "t", "description": "d", "inputSchema": {"type": "object"}}])
    return HttpEndpoints(_Warnings(), ready), tools


async def test_a_session_gets_its_url_before_the_http_server_is_imported_and_is_served_once_it_is() -> None:
    import trio

    server_imported = trio.Event()
    endpoints, tools = _endpoints(server_imported.wait)
    async with trio.open_nursery() as nursery:
        await nursery.start(endpoints.run)
        url, _stop = endpoints.add(tools, "secret-token")  # at once: the HTTP server is not "imported" yet
        assert url.startswith("http://127.0.0.1:") and "/mcp/" in url
        statuses: list[int] = []
        answered = trio.Event()

        async def agent_connects() -> None:
            statuses.append(await trio.to_thread.run_sync(_post_initialize, url))
            answered.set()

        nursery.start_soon(agent_connects)
        server_imported.set()  # the agent's request, wherever it is by now, is answered once serving starts
        with trio.fail_after(30):
            await answered.wait()
        assert statuses == [200]
        nursery.cancel_scope.cancel()


async def test_when_the_http_server_cannot_be_imported_connections_are_refused_not_held() -> None:
    import urllib.error

    import trio

    import_ends = trio.Event()

    async def broken() -> None:
        await import_ends.wait()
        raise RuntimeError("the HTTP server failed to load: No module named 'hypercorn'")

    endpoints, tools = _endpoints(broken)
    gave_up = trio.Event()

    async def listen(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        await endpoints.run(task_status=task_status)
        gave_up.set()  # it logged why and closed its socket

    async with trio.open_nursery() as nursery:
        await nursery.start(listen)
        url, _stop = endpoints.add(tools, "secret-token")
        import_ends.set()
        with trio.fail_after(30):
            await gave_up.wait()
        with pytest.raises(urllib.error.URLError):
            await trio.to_thread.run_sync(_post_initialize, url)
        with pytest.raises(RuntimeError, match="not running"):
            endpoints.add(tools, "secret-token")  # lmbridge then uses the stdio relay


def test_the_same_tool_list_again_is_no_change_whether_the_same_objects_or_equal_ones() -> None:
    from mcp_synthetic.server import SessionTools

    async def invoke(name: str, arguments: Any) -> Any:
        raise AssertionError("not called")

    tools = SessionTools(invoke, log=_Warnings())
    listed = [{"name": f"t{n}", "description": "d", "inputSchema": {"type": "object"}} for n in range(3)]
    assert tools.update(listed)
    before = tools.listing()
    assert not tools.update(list(listed))  # the very objects (the editor connection hands them back)
    assert not tools.update([dict(tool) for tool in listed])  # equal ones, parsed anew
    assert tools.listing() == before
    assert tools.update([*listed[:2], {"name": "t2", "description": "changed", "inputSchema": {"type": "object"}}])
    assert tools.update(listed[:2])  # one fewer
    assert not tools.update(listed[:2])
