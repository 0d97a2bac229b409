"""The history-reusing parser: always exactly what json.loads returns, and the repeated history parsed once."""

from __future__ import annotations

import json

import pytest
from fakes import assistant, user
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.editor.history_parse import HistoryReusingParser
from wire.errors import PARSE_ERROR
from wire.rpc.protocol import InvalidMessage, JsonRpcProtocol, Request


def chat(messages: list, request_id: int = 1, **params) -> bytes:
    return json.dumps(
        {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "lm/chat",
            "params": {"modelId": "demo", "messages": messages, **params},
        }
    ).encode()


def test_a_continued_history_reuses_the_parsed_messages() -> None:
    parser = HistoryReusingParser(min_chars=0)
    history = [user("hello " * 100), assistant("hi"), user("list the files")]
    first = parser(chat(history, 1))
    assert first == json.loads(chat(history, 1)) and parser.reused_messages == 0
    longer = [*history, assistant("two files"), user("and now?")]
    second = parser(chat(longer, 2))
    assert second == json.loads(chat(longer, 2))
    assert parser.reused_messages == 3 and parser.parsed_messages == 5
    # The repeated messages are the very objects of the first parse: history matching compares them by identity.
    assert all(a is b for a, b in zip(second["params"]["messages"], first["params"]["messages"], strict=False))
    # The same history once more (a retry): all reused, nothing parsed.
    third = parser(chat(longer, 3))
    assert third["params"]["messages"] == longer and parser.reused_messages == 8 and parser.parsed_messages == 5


def test_an_edit_inside_the_history_is_parsed_afresh() -> None:
    parser = HistoryReusingParser(min_chars=0)
    history = [user("one"), assistant("two"), user("three")]
    parser(chat(history))
    edited = [user("one"), assistant("TWO"), user("three"), assistant("four")]
    assert parser(chat(edited))["params"]["messages"] == edited
    assert parser.reused_messages == 0


def test_an_element_that_continues_past_the_old_end_is_not_mistaken_for_a_repeat() -> None:
    parser = HistoryReusingParser(min_chars=0)
    for messages in ([1, 2, 3], [1, 2, 34], [1, 2, 34.5e1], [1, 2, 34.5e1, "x"], [1, 2, 34.5e1, "x", {"a": []}]):
        assert parser(chat(messages))["params"]["messages"] == messages


def test_short_histories_are_not_remembered() -> None:
    parser = HistoryReusingParser()  # the default threshold: 4 KiB
    history = [user("short")]
    parser(chat(history))
    parser(chat([*history, assistant("ok")]))
    assert parser.reused_messages == 0 and parser.remembered_chars == 0


def test_a_tool_conversation_of_a_few_kilobytes_is_reused_by_default() -> None:
    # Tool calls and results are small messages: a plain parse costs ~7 µs per KB of them, the reused path ~20 µs
    # whatever the length, so histories from 4 KiB on are remembered.
    history = [user("fix the tests")]
    for n in range(30):
        history.append({"role": "assistant", "content": [{"type": "tool_call", "callId": f"c{n}", "name": "read"}]})
        history.append({"role": "user", "content": [{"type": "tool_result", "callId": f"c{n}", "content": []}]})
    assert 4 * 1024 < len(chat(history)) < 16 * 1024
    parser = HistoryReusingParser()
    first = parser(chat(history))["params"]["messages"]
    again = parser(chat([*history, assistant("done")]))["params"]["messages"]
    assert parser.reused_messages == len(history) and all(a is b for a, b in zip(first, again, strict=False))


def test_a_history_with_any_text_is_reused_whatever_comes_before_it() -> None:
    # Found and compared as bytes: text beyond ASCII (an editor sends UTF-8 as is), the history after the options,
    # and a "messages" key inside a tool's schema before the real one.
    parser = HistoryReusingParser(min_chars=0)
    tools = [{"name": "send", "inputSchema": {"type": "object", "properties": {"messages": {"type": "array"}}}}]
    history = [user("grüße, 世界 " * 50), assistant("ok ✓")]
    for turn in range(1, 6):
        history = [*history, user(f"weiter {turn} …"), assistant(f"fertig {turn}")]
        raw = json.dumps(
            {
                "jsonrpc": "2.0",
                "id": turn,
                "method": "lm/chat",
                "params": {"options": {"tools": tools, "x": [{"messages": [1]}]}, "messages": history},
            },
            ensure_ascii=False,
            separators=(",", ":"),
        ).encode()
        parsed = parser(raw)
        assert parsed == json.loads(raw)
    assert parser.reused_messages == 4 + 6 + 8 + 10 and parser.parsed_messages == 4 + 4 * 2


def test_a_long_lived_history_is_kept_in_a_bounded_number_of_pieces() -> None:
    parser = HistoryReusingParser(min_chars=0)
    history = [user("start")]
    for turn in range(100):
        history = [*history, assistant(f"a{turn}"), user(f"u{turn}")]
        assert parser(chat(history))["params"]["messages"] == history
    assert parser.reused_messages == sum(1 + 2 * turn for turn in range(1, 100))  # each turn, the last history
    (entry,) = parser._remembered
    assert (
        len(entry.pieces) <= 16 and b"".join(entry.pieces) == chat(history)[chat(history).index(b"[") :][: entry.size]
    )


def test_memory_is_bounded_by_entries_and_characters() -> None:
    parser = HistoryReusingParser(min_chars=0, max_entries=3, max_chars=10_000)
    for n in range(10):
        parser(chat([user(f"conversation {n} " + "x" * 100)]))
    assert len(parser._remembered) == 3
    parser(chat([user("y" * 20_000)]))  # the newest is kept even alone over the budget; the others go
    assert len(parser._remembered) == 1
    parser(chat([user("z" * 100)]))
    assert len(parser._remembered) == 1 and parser.remembered_chars < 200


def _tool(n: int) -> dict:
    return {"name": f"tool_{n}", "description": "d" * 300, "inputSchema": {"type": "object", "properties": {"x": {}}}}


def test_a_repeated_tool_list_is_the_same_object_and_a_changed_one_is_parsed_afresh() -> None:
    tools = [_tool(n) for n in range(20)]
    parser = HistoryReusingParser()
    first = parser(chat([user("hi")], options={"tools": tools}))["params"]["options"]["tools"]
    again = parser(chat([user("hi"), assistant("ok"), user("more")], options={"tools": tools}))
    assert again["params"]["options"]["tools"] is first and parser.reused_tool_lists == 1
    changed = parser(chat([user("hi")], options={"tools": [*tools, _tool(20)]}))["params"]["options"]["tools"]
    assert changed is not first and changed == [*tools, _tool(20)]
    # Both are remembered: an editor switching between two tool sets gets each back.
    assert parser(chat([user("x")], options={"tools": tools}))["params"]["options"]["tools"] is first
    # Something after the list in the same object is read as usual.
    tail = parser(chat([user("x")], options={"tools": tools, "toolMode": "required"}))["params"]["options"]
    assert tail["tools"] is first and tail["toolMode"] == "required"


def test_small_and_huge_tool_lists_are_not_remembered() -> None:
    parser = HistoryReusingParser()
    small = [_tool(0)]
    parser(chat([user("hi")], options={"tools": small}))
    assert parser(chat([user("hi")], options={"tools": small}))["params"]["options"]["tools"] == small
    huge = [_tool(n) | {"description": "d" * 20_000} for n in range(60)]  # over 1 M characters
    parser(chat([user("hi")], options={"tools": huge}))
    parser(chat([user("hi")], options={"tools": huge}))
    assert parser.reused_tool_lists == 0


def test_concurrent_conversations_each_continue_their_own_history() -> None:
    parser = HistoryReusingParser(min_chars=0)
    a = [user("a" * 50)]
    b = [user("b" * 50)]
    for turn in range(5):
        a = [*a, assistant(f"a{turn}"), user(f"more a {turn}")]
        b = [*b, assistant(f"b{turn}"), user(f"more b {turn}")]
        assert parser(chat(a))["params"]["messages"] == a
        assert parser(chat(b))["params"]["messages"] == b
    assert parser.reused_messages == 2 * (3 + 5 + 7 + 9)  # from the second turn on, the previous history repeats


@pytest.mark.parametrize(
    "raw",
    [
        b'{"jsonrpc":"2.0","id":1,"method":"lm/chat","params":{"messages":[{"role":"user"}',
        b'{"jsonrpc":"2.0","id":1,"method":"lm/chat","params":{"messages":[{"role":"user"}]}} trailing',
        b'{"jsonrpc":"2.0","id":1,"method":"lm/chat","params":{"messages":[{"role":"user"},]}}',
        b'{"jsonrpc":"2.0","id":1,"method":"lm/chat","params":{"messages" [1]}}',
        b"\xff\xfe{}",
        b"",
    ],
)
def test_invalid_input_fails_as_the_plain_parse_does(raw: bytes) -> None:
    parser = HistoryReusingParser(min_chars=0)
    parser(b'{"jsonrpc":"2.0","id":1,"method":"lm/chat","params":{"messages":[{"role":"user"}]}}')
    with pytest.raises(ValueError):
        parser(raw)


def test_deep_nesting_is_a_parse_error_not_a_crash() -> None:
    protocol = JsonRpcProtocol(parse=HistoryReusingParser(min_chars=0))
    for raw in (
        b"[" * 100_000 + b"]" * 100_000,
        b'{"jsonrpc":"2.0","id":1,"method":"lm/chat","params":{"messages":[' + b"[" * 5000 + b"]" * 5000 + b"]}}",
    ):
        event = protocol.receive_message(raw)
        assert isinstance(event, InvalidMessage) and event.error.code == PARSE_ERROR
        assert "nested too deeply" in event.error.message
    event = protocol.receive_message(chat([user("still serving")]))
    assert isinstance(event, Request) and event.params["messages"] == [user("still serving")]


# -- property: whatever the sequence of messages, the result is json.loads' ---------------------------------------

scalars = st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.floats(allow_nan=False) | st.text(max_size=8)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["role", "content", "messages", "params", "x"]), inner, max_size=3)
    ),
    max_leaves=8,
)
message_values = st.one_of(values, st.builds(user, st.text(max_size=20)), st.builds(assistant, st.text(max_size=20)))


TOOL_LISTS = [
    [],
    [{"name": "read"}],
    [{"name": "read"}, {"name": "write", "inputSchema": {"type": "object", "properties": {"path": {}}}}],
    [{"name": "read"}, {"name": "write"}],
    [[1], 2.5, "three"],
]


@st.composite
def conversations(draw: st.DrawFn) -> list[bytes]:
    """Requests as an editor (or a hostile peer) might send them: histories that grow, get edited or replaced,
    in varied layouts — indentation, key order, repeated keys, a ``messages`` key nested inside a message."""
    history = draw(st.lists(message_values, max_size=4))
    out = []
    for _ in range(draw(st.integers(1, 6))):
        action = draw(st.sampled_from(["extend", "extend", "edit", "replace", "same"]))
        if action == "extend":
            history = history + draw(st.lists(message_values, min_size=1, max_size=3))
        elif action == "edit" and history:
            index = draw(st.integers(0, len(history) - 1))
            history = [*history[:index], draw(message_values), *history[index + 1 :]]
        elif action == "replace":
            history = draw(st.lists(message_values, max_size=4))
        params = {"modelId": "demo", "messages": history}
        options = {}
        if draw(st.booleans()):
            options["messages"] = draw(values)
        if draw(st.booleans()):  # often one of a few lists, so that requests repeat them; sometimes anything
            options["tools"] = draw(st.one_of(st.sampled_from(TOOL_LISTS), values))
        if options:
            params = {"options": options, **params}
        envelope = {"jsonrpc": "2.0", "id": len(out), "method": "lm/chat", "params": params}
        if draw(st.booleans()):
            envelope = {"params": params, **envelope}  # params first
        text = json.dumps(
            envelope,
            indent=draw(st.sampled_from([None, None, 1, "\t"])),
            separators=draw(st.sampled_from([None, (",", ":"), (" ,", " : ")])),
            ensure_ascii=draw(st.booleans()),
        )
        if draw(st.booleans()):  # a repeated key: the last one wins
            text = text.replace('"params"', '"params": {"messages": [1, 2]}, "params"', 1)
        out.append(("  " if draw(st.booleans()) else "") + text + draw(st.sampled_from(["", " ", "\r\n"])))
    return [line.encode() for line in out]


@settings(max_examples=300, deadline=None)
@given(conversations())
def test_the_result_is_always_what_json_loads_returns(requests: list[bytes]) -> None:
    parser = HistoryReusingParser(min_chars=0)
    for raw in requests:
        try:
            expected = json.loads(raw)
        except ValueError:  # the repeated key landed inside a string list: not JSON any more
            with pytest.raises(ValueError):
                parser(raw)
        else:
            assert parser(raw) == expected


def test_the_editor_connection_checks_a_repeated_tool_list_once() -> None:
    from types import SimpleNamespace

    from bridge.editor.connection import EditorConnection
    from wire.errors import InvalidParams

    connection = SimpleNamespace(_checked_tools=(None, []))
    raw = [_tool(n) for n in range(3)]
    checked = EditorConnection._tools(connection, raw)  # type: ignore[arg-type]
    assert checked == raw and checked is not raw
    assert EditorConnection._tools(connection, raw) is checked  # the parser's very list again: not checked again
    assert EditorConnection._tools(connection, [dict(t) for t in raw]) == checked  # equal, parsed anew: checked
    bad = [{"name": ""}]
    for _ in range(2):
        with pytest.raises(InvalidParams):
            EditorConnection._tools(connection, bad)  # type: ignore[arg-type]
    assert EditorConnection._tools(connection, None) == []  # type: ignore[arg-type]


# -- through the JSON-RPC protocol ---------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(conversations(), st.lists(st.integers(1, 300), min_size=1, max_size=20))
def test_requests_read_in_pieces_of_any_size_parse_as_when_whole(requests: list[bytes], reads: list[int]) -> None:
    """Through the JSON-RPC protocol, read into its framer in pieces of any size (as the editor connection reads a
    pipe): every request as json.loads reads it, the same histories reused as when each comes whole — with an
    over-long line among them, dropped as it comes."""
    lines = [raw.replace(b"\n", b" ").replace(b"\r", b" ") for raw in requests]  # JSON space: the same values
    parser, whole = HistoryReusingParser(min_chars=0), HistoryReusingParser(min_chars=0)
    longest = max(len(line) for line in lines)
    protocol = JsonRpcProtocol(parse=parser, max_message_bytes=longest)
    over_long = b'{"x": "' + b"y" * longest + b'"}'
    sent = [*lines[:1], over_long, *lines[1:]]
    stream = b"".join(line + b"\n" for line in sent)
    position, turn, events = 0, 0, []

    def read(view: memoryview) -> int:
        nonlocal position, turn
        turn += 1
        chunk = stream[position : position + len(view)]
        view[: len(chunk)] = chunk
        position += len(chunk)
        return len(chunk)

    while position < len(stream):
        events += protocol.receive_into(read, reads[turn % len(reads)]) or []
    assert len(events) == len(sent)
    for line, event in zip(sent, events, strict=True):
        try:
            expected = None if line is over_long else json.loads(line)
        except ValueError:  # the repeated key landed inside a string list: not JSON any more
            expected = None
            with pytest.raises(ValueError):
                whole(line)
        if expected is None:
            assert isinstance(event, InvalidMessage)
        else:
            assert whole(line) == expected  # the same parser, each request whole: the reuse to compare with
            assert isinstance(event, Request) and event.params == expected["params"]
    assert (parser.reused_messages, parser.parsed_messages) == (whole.reused_messages, whole.parsed_messages)
