"""Rendering agent activity: one line when a tool starts and one when it ends, plans as checklists, tolerance for
updates about tools never announced, raw updates only on request."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from session.render import ActivityRenderer, acp_update_part


def tool_call(call_id: str, title: str, status: str = "pending", **extra) -> dict:
    return {
        "sessionUpdate": "tool_call",
        "toolCallId": call_id,
        "title": title,
        "kind": "execute",
        "status": status,
        **extra,
    }


def tool_update(call_id: str, **fields) -> dict:
    return {"sessionUpdate": "tool_call_update", "toolCallId": call_id, **fields}


def texts(parts: list[dict]) -> str:
    return "".join(p["value"] for p in parts)


def test_a_tool_is_one_line_when_it_runs_and_one_at_the_end_whatever_the_updates() -> None:
    renderer = ActivityRenderer()
    out = renderer.render(tool_call("t1", "Run tests"))
    out += renderer.render(tool_update("t1", status="in_progress"))
    for _ in range(5):
        out += renderer.render(
            tool_update("t1", content=[{"type": "content", "content": {"type": "text", "text": "..."}}])
        )
    out += renderer.render(tool_update("t1", status="completed"))
    out += renderer.render(tool_update("t1", status="completed"))
    assert texts(out) == "▸ Run tests\n✓ Run tests\n"


def test_a_failed_tool_says_why_and_later_titles_win() -> None:
    renderer = ActivityRenderer()
    assert renderer.render(tool_call("t1", "Terminal")) == []  # pending: the title is still provisional
    renderer.render(tool_update("t1", title="npm test"))
    assert texts(renderer.render(tool_update("t1", status="in_progress"))) == "▸ npm test\n"
    out = renderer.render(
        tool_update(
            "t1",
            status="failed",
            content=[
                {"type": "content", "content": {"type": "text", "text": "```\n\n3 tests failed\nmore detail\n```"}}
            ],
        )
    )
    assert texts(out) == "✗ npm test failed: 3 tests failed\n"


def test_a_command_completed_with_a_nonzero_exit_is_a_failure() -> None:
    """OpenCode reports a failed command as completed; its exit code says otherwise."""
    renderer = ActivityRenderer()
    renderer.render(tool_call("t", "ls nowhere", status="in_progress"))
    failed = tool_update(
        "t",
        status="completed",
        content=[{"type": "content", "content": {"type": "text", "text": "ls: cannot access 'nowhere'\n"}}],
        rawOutput={"output": "ls: cannot access 'nowhere'\n", "metadata": {"exit": 2, "truncated": False}},
    )
    assert texts(renderer.render(failed)) == "✗ ls nowhere failed: ls: cannot access 'nowhere'\n"
    renderer.render(tool_call("u", "true", status="in_progress"))
    fine = tool_update("u", status="completed", rawOutput={"output": "", "metadata": {"exit": 0}})
    assert texts(renderer.render(fine)) == "✓ true\n"


def test_a_failure_reported_only_in_raw_output_still_says_why() -> None:
    renderer = ActivityRenderer()
    renderer.render(tool_call("t", "List files", status="in_progress"))
    out = renderer.render(
        tool_update(
            "t",
            status="failed",
            rawOutput={
                "stdout": "",
                "stderr": "",
                "aggregated_output": "ls: cannot access 'x': No such file\n",
                "exit_code": 2,
            },
        )
    )
    assert texts(out) == "✗ List files failed: ls: cannot access 'x': No such file\n"
    renderer.render(tool_call("u", "Build", status="in_progress"))
    assert texts(renderer.render(tool_update("u", status="failed", rawOutput={"exit_code": 1}))) == (
        "✗ Build failed: exit code 1\n"
    )


def test_calls_to_the_editors_own_tools_are_not_rendered() -> None:
    renderer = ActivityRenderer()
    for update in (
        tool_call(
            "toolu_1", "mcp__editor__get_weather", _meta={"claudeCode": {"toolName": "mcp__editor__get_weather"}}
        ),
        tool_call(
            "call_1",
            "Tool: editor/get_weather",
            status="in_progress",
            rawInput={"server": "editor", "tool": "get_weather"},
        ),
        tool_update("mcp_editor_get_weather__1", status="completed", title="get_weather (editor MCP Server)"),
    ):
        assert renderer.render(update) == []
    assert renderer.render(tool_update("toolu_1", status="completed")) == []
    assert renderer.render(tool_update("call_1", status="completed")) == []
    assert texts(renderer.render(tool_call("x", "Tool: other/thing", status="in_progress"))) == "▸ Tool: other/thing\n"


def test_updates_for_never_announced_tools_are_tolerated() -> None:
    renderer = ActivityRenderer()
    assert texts(renderer.render(tool_update("ghost", status="in_progress", title="Read file"))) == "▸ Read file\n"
    assert texts(renderer.render(tool_update("other", status="completed"))) == "✓ tool other\n"
    assert renderer.render(tool_update("silent")) == []


def test_tool_lines_start_on_a_new_line() -> None:
    renderer = ActivityRenderer()
    renderer.render({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "Let me check"}})
    assert texts(renderer.render(tool_call("t", "ls", status="in_progress"))) == "\n▸ ls\n"


def test_plan_is_a_checklist_sent_only_when_it_changes() -> None:
    renderer = ActivityRenderer()
    plan = {
        "sessionUpdate": "plan",
        "entries": [
            {"content": "Read", "priority": "high", "status": "completed"},
            {"content": "Write", "priority": "medium", "status": "in_progress"},
            {"content": "Test", "priority": "low", "status": "pending"},
        ],
    }
    assert texts(renderer.render(plan)) == "Plan:\n- [x] Read\n- [~] Write\n- [ ] Test\n"
    assert renderer.render(plan) == []
    plan["entries"][1]["status"] = "completed"
    assert "- [x] Write" in texts(renderer.render(plan))


def test_thoughts_images_and_quiet_updates() -> None:
    renderer = ActivityRenderer()
    assert renderer.render({"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": "hmm"}}) == [
        {"type": "thinking", "value": "hmm"}
    ]
    assert renderer.render(
        {
            "sessionUpdate": "agent_message_chunk",
            "content": {"type": "image", "mimeType": "image/png", "data": "iVBORw=="},
        }
    ) == [{"type": "data", "mimeType": "image/png", "data": "iVBORw=="}]
    for quiet in (
        {"sessionUpdate": "available_commands_update", "availableCommands": []},
        {"sessionUpdate": "current_mode_update", "currentModeId": "code"},
        {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "replayed"}},
        {"sessionUpdate": "notice", "text": "an update this SDK does not know"},
        {"sessionUpdate": "agent_message_chunk", "content": {"type": "hologram"}},
    ):
        assert renderer.render(quiet) == []
    renderer.render({"sessionUpdate": "usage_update", "used": 10, "size": 100})
    assert (renderer.usage.used, renderer.usage.size, renderer.usage.cost) == (10, 100, None)


@pytest.mark.parametrize(
    ("cost", "kept"),
    [
        ({"amount": 0.0525, "currency": "USD"}, {"amount": 0.0525, "currency": "USD"}),
        ({"amount": 3, "currency": "EUR", "_meta": {}}, {"amount": 3, "currency": "EUR"}),
        ({"amount": "0.05", "currency": "USD"}, None),
        ({"amount": True, "currency": "USD"}, None),
        ({"amount": float("nan"), "currency": "USD"}, None),
        ({"amount": 1.0}, None),
        ("1 USD", None),
    ],
)
def test_usage_keeps_the_session_cost_when_it_is_well_formed(cost: Any, kept: Any) -> None:
    renderer = ActivityRenderer()
    assert renderer.render({"sessionUpdate": "usage_update", "used": 5, "size": 50, "cost": cost}) == []
    assert renderer.usage is not None and renderer.usage.cost == kept


def test_prompt_usage_takes_both_shapes() -> None:
    from session.render import prompt_usage

    assert prompt_usage(
        {"stopReason": "end_turn", "usage": {"inputTokens": 24, "outputTokens": 14, "totalTokens": 38, "odd": "x"}}
    ) == {"inputTokens": 24, "outputTokens": 14, "totalTokens": 38}
    assert prompt_usage(
        {"stopReason": "end_turn", "_meta": {"quota": {"token_count": {"input_tokens": 24, "output_tokens": 14}}}}
    ) == {"inputTokens": 24, "outputTokens": 14}
    assert prompt_usage({"stopReason": "end_turn"}) is None


def test_extra_meta_fields_do_not_matter() -> None:
    renderer = ActivityRenderer()
    update = tool_call("t", "ls", status="in_progress", _meta={"claudeCode": {"toolName": "Bash"}})
    assert texts(renderer.render(update)) == "▸ ls\n"


def test_raw_updates_as_data_parts_round_trip() -> None:
    update = {"sessionUpdate": "notice", "text": "x"}
    part = acp_update_part(update)
    assert part["mimeType"] == "application/vnd.lmbridge.acp-update+json"
    assert json.loads(base64.b64decode(part["data"])) == update


_SCHEMA_CASES = [
    # (update, rendered text or "" when nothing is rendered)
    ({"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": "hmm"}}, "hmm"),
    ({"sessionUpdate": "agent_thought_chunk", "content": {"type": "text"}}, ""),
    (
        {"sessionUpdate": "agent_message_chunk", "content": {"type": "resource_link", "name": "a", "uri": "f:/a"}},
        "[a](f:/a)",
    ),
    ({"sessionUpdate": "agent_message_chunk", "content": {"type": "resource_link", "name": "a"}}, ""),
    (
        {
            "sessionUpdate": "agent_message_chunk",
            "content": {"type": "resource", "resource": {"uri": "f:/a", "text": "x"}},
        },
        "x",
    ),
    ({"sessionUpdate": "agent_message_chunk", "content": {"type": "resource", "resource": {"text": "x"}}}, ""),
    ({"sessionUpdate": "agent_message_chunk", "content": {"type": "image", "mimeType": "image/png"}}, ""),
    (tool_call("t", "Build", "in_progress"), "▸ Build\n"),
    ({"sessionUpdate": "tool_call", "toolCallId": "t", "status": "in_progress"}, ""),  # no title
    (tool_call("t", "Build", "running"), ""),  # not a status: read as none, so no line yet
    ({"sessionUpdate": "tool_call", "toolCallId": 7, "title": "Build", "status": "in_progress"}, ""),
    (tool_call("t", "Build", "in_progress", content="not a list"), ""),
    (
        {"sessionUpdate": "plan", "entries": [{"content": "a", "status": "pending", "priority": "high"}]},
        "Plan:\n- [ ] a\n",
    ),
    (
        {
            "sessionUpdate": "plan",
            "entries": [
                {"content": "no priority", "status": "pending"},
                {"content": "no such status", "status": "done", "priority": "high"},
                {"content": "b", "status": "completed", "priority": "low"},
            ],
        },
        "Plan:\n- [x] b\n",  # entries the schema cannot read are left out, as its models leave them out
    ),
    ({"sessionUpdate": "plan", "entries": "a; b"}, ""),
]


@pytest.mark.parametrize(("update", "expected"), _SCHEMA_CASES)
def test_the_renderer_reads_updates_as_the_acp_schema_does(update: dict, expected: str) -> None:
    # The renderer reads dicts (building the schema models cost the first tool turn most of a second): it must still
    # render nothing for an update the official schema rejects.
    from acp.schema import SessionNotification
    from pydantic import TypeAdapter, ValidationError

    adapter = TypeAdapter(SessionNotification.model_fields["update"].annotation)
    try:
        adapter.validate_python(update)
        accepted = True
    except ValidationError:
        accepted = False
    rendered = "".join(p.get("value", "") for p in ActivityRenderer().render(update))
    assert accepted or not expected, "the schema rejects it: nothing may be rendered"
    assert rendered == expected


def test_rendering_never_builds_the_acp_schema_models() -> None:
    # Building them took ~0.4 s on the first update that needed them: the first tool turn of every lmbridge waited.
    import subprocess
    import sys

    code = (
        "import sys; from session.render import ActivityRenderer; r = ActivityRenderer()\n"
        "r.render({'sessionUpdate': 'tool_call', 'toolCallId': 't', 'title': 'x', 'status': 'in_progress'})\n"
        "r.render({'sessionUpdate': 'plan', 'entries': [{'content': 'a', 'status': 'pending', 'priority': 'low'}]})\n"
        "r.render({'sessionUpdate': 'agent_thought_chunk', 'content': {'type': 'text', 'text': 'hm'}})\n"
        "assert 'acp.schema' not in sys.modules and 'pydantic' not in sys.modules, sorted(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
