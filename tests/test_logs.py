"""The log line lmbridge writes on stderr: its own console renderer writes structlog's console line exactly, and
secret-named fields are masked."""

from __future__ import annotations

import io
from typing import Any

import structlog
from hypothesis import given, settings
from hypothesis import strategies as st

from wire.observe import logs

_structlogs = structlog.dev.ConsoleRenderer(colors=False, exception_formatter=structlog.dev.plain_traceback)

_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(),
    st.sampled_from(["claude", "a b", "k=v", "it's", 'say "hi"', "tab\there", "line\nbreak", "", "/tmp/x y"]),
    st.lists(st.text(max_size=5), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)
_fields = st.dictionaries(st.from_regex(r"[a-z_]{1,12}", fullmatch=True), _values, max_size=6)


@settings(max_examples=400, deadline=None)
@given(
    fields=_fields,
    event=st.one_of(st.text(max_size=40), st.integers()),
    level=st.sampled_from(["debug", "info", "warning", "error", "critical", "exception"]),
    timestamp=st.sampled_from(["2026-11-27T04:50:18.127330Z", "", None]),
)
def test_each_line_is_structlogs_console_line(fields: dict[str, Any], event: Any, level: str, timestamp: Any) -> None:
    entry = {**fields, "event": event, "level": level}
    if timestamp is not None:
        entry["timestamp"] = timestamp
    assert logs._ConsoleLines()(None, level, dict(entry)) == _structlogs(None, level, dict(entry))


def test_events_without_the_usual_columns_and_with_exceptions_are_structlogs_lines() -> None:
    try:
        raise ValueError("boom")
    except ValueError as error:
        failed = error
    for entry in (
        {"a": 1},
        {"event": "only an event"},
        {"event": "x" * 40, "level": "info"},
        {"event": "with a logger", "logger": "lmbridge", "level": "info"},
        {"event": "failed", "level": "error", "exc_info": failed},
        {"event": "stack", "level": "info", "stack": "Stack (most recent call last):\n  here"},
    ):
        assert logs._ConsoleLines()(None, "info", dict(entry)) == _structlogs(None, "info", dict(entry))


def test_a_configured_line_masks_secret_fields_and_keeps_the_rest() -> None:
    stream = io.StringIO()
    saved = structlog.get_config()
    logs.configure("info", "console", stream)
    try:
        logs.get_logger(conn="editor").info(
            "agent started", api_key="sk-live", env={"HOME": "/root"}, github_token=None, agent="claude"
        )
        logs.get_logger().debug("not at this level")
    finally:
        structlog.configure(**saved)
    line = stream.getvalue()
    assert line.endswith("\n") and line.count("\n") == 1
    assert "[info     ] agent started                  agent=claude api_key=*** conn=editor" in line
    assert "env={'HOME': '***'} github_token=None" in line
    assert "sk-live" not in line and "/root" not in line
