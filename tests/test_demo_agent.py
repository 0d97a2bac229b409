"""The demo agent's directive language (the agent itself is exercised through the wire in test_stdio.py)."""

from __future__ import annotations

import pytest

from bridge.demo.agent import chunk_text
from bridge.demo.directives import ScriptError, Step, parse_script


def test_directives_and_echo_paragraphs_in_order() -> None:
    steps = parse_script("hello\nworld\n/say hi there\n/stream 3\nbye")
    assert steps == [
        Step("echo", "hello\nworld"),
        Step("say", "hi there"),
        Step("stream", number=3),
        Step("echo", "bye"),
    ]


def test_tool_calls_parse_their_json_arguments() -> None:
    (single,) = parse_script('/tool read_file {"path": "/a"}')
    assert single.calls == (("read_file", {"path": "/a"}),)
    (parallel,) = parse_script('/tools a {"x": 1} | b {}')
    assert parallel.calls == (("a", {"x": 1}), ("b", {}))


def test_later_plan_and_stop() -> None:
    later, plan, stop = parse_script("/later 50 after\n/plan one; two ;three\n/stop max_tokens")
    assert (later.number, later.arg) == (50, "after")
    assert [name for name, _ in plan.calls] == ["one", "two", "three"]
    assert stop.arg == "max_tokens"


@pytest.mark.parametrize(
    "text",
    [
        "/stream many",
        "/tool x {not json",
        "/later soon hi",
        "/frobnicate",
        "/say",
        "/stop sometime",
        "/barrier pair",
        "/barrier pair 0",
    ],
)
def test_malformed_directives_are_script_errors(text: str) -> None:
    with pytest.raises(ScriptError):
        parse_script(text)


def test_chunking_keeps_every_character_and_gives_several_chunks() -> None:
    for text in ("the quick brown fox\n", "x y", "single", "日本語のテキスト"):
        chunks = chunk_text(text)
        assert "".join(chunks) == text
        assert len(chunks) >= 2


def test_every_directive_in_the_table_has_a_handler_and_every_handler_a_row() -> None:
    from bridge.demo.agent import DemoAgent
    from bridge.demo.directives import DIRECTIVES

    handlers = {name.removeprefix("_do_") for name in dir(DemoAgent) if name.startswith("_do_")}
    assert handlers - {"echo"} == set(DIRECTIVES)


def test_the_reference_lists_every_directive_once_with_what_it_does() -> None:
    from bridge.demo.directives import DIRECTIVES, reference

    text = reference()
    for directive in DIRECTIVES.values():
        (line,) = [
            line for line in text.splitlines() if line.startswith(f"/{directive.name} ") or line == f"/{directive.name}"
        ]
        assert directive.does in line
    assert text.index("/badstop") > text.index("misbehaviours") > text.index("/say")
