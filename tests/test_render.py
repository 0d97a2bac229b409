"""Rendering agent activity: one line when a tool starts and one when it ends, plans as checklists, tolerance for
updates about tools never announced, raw updates only on request."""

from __future__ import annotations

import base64
import json

from session.render import ActivityRenderer, acp_update_part


def tool_call(call_id: str, title: str, status: str = "pending", **extra) -> dict:
    return {"sessionUpdate": "tool_call", "toolCallId": call_id, "title": title, "kind": "execute", "status": status,
            **extra}


def tool_update(call_id: str, **fields) -> dict:
    return {"sessionUpdate": "tool_call_update", "toolCallId": call_id, **fields}


def texts(parts: list[dict]) -> str:
    return "".join(p["value"] for p in parts)


def test_a_tool_is_one_line_at_start_and_one_at_the_end_whatever_the_updates() -> None:
    renderer = ActivityRenderer()
    out = renderer.render(tool_call("t1", "Run tests"))
    out += renderer.render(tool_update("t1", status="in_progress"))
    for _ in range(5):
        out += renderer.render(tool_update("t1", content=[{"type": "content", "content": {"type": "text", "text": "..."}}]))
    out += renderer.render(tool_update("t1", status="completed"))
    out += renderer.render(tool_update("t1", status="completed"))
    assert texts(out) == "▸ Run tests\n✓ Run tests\n"


def test_a_failed_tool_says_why_and_later_titles_win() -> None:
    renderer = ActivityRenderer()
    renderer.render(tool_call("t1", "Terminal"))
    renderer.render(tool_update("t1", title="npm test"))
    out = renderer.render(tool_update("t1", status="failed", content=[
        {"type": "content", "content": {"type": "text", "text": "3 tests failed\nmore detail"}}]))
    assert texts(out) == "✗ npm test failed: 3 tests failed\n"


def test_updates_for_never_announced_tools_are_tolerated() -> None:
    renderer = ActivityRenderer()
    assert texts(renderer.render(tool_update("ghost", status="in_progress", title="Read file"))) == "▸ Read file\n"
    assert texts(renderer.render(tool_update("other", status="completed"))) == "✓ tool other\n"
    assert renderer.render(tool_update("silent")) == []


def test_tool_lines_start_on_a_new_line() -> None:
    renderer = ActivityRenderer()
    renderer.render({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "Let me check"}})
    assert texts(renderer.render(tool_call("t", "ls"))) == "\n▸ ls\n"


def test_plan_is_a_checklist_sent_only_when_it_changes() -> None:
    renderer = ActivityRenderer()
    plan = {"sessionUpdate": "plan", "entries": [
        {"content": "Read", "priority": "high", "status": "completed"},
        {"content": "Write", "priority": "medium", "status": "in_progress"},
        {"content": "Test", "priority": "low", "status": "pending"}]}
    assert texts(renderer.render(plan)) == "Plan:\n- [x] Read\n- [~] Write\n- [ ] Test\n"
    assert renderer.render(plan) == []
    plan["entries"][1]["status"] = "completed"
    assert "- [x] Write" in texts(renderer.render(plan))


def test_thoughts_images_and_quiet_updates() -> None:
    renderer = ActivityRenderer()
    assert renderer.render({"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": "hmm"}}) == [
        {"type": "thinking", "value": "hmm"}]
    assert renderer.render({"sessionUpdate": "agent_message_chunk",
                            "content": {"type": "image", "mimeType": "image/png", "data": "iVBORw=="}}) == [
        {"type": "data", "mimeType": "image/png", "data": "iVBORw=="}]
    for quiet in ({"sessionUpdate": "available_commands_update", "availableCommands": []},
                  {"sessionUpdate": "current_mode_update", "currentModeId": "code"},
                  {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "replayed"}},
                  {"sessionUpdate": "notice", "text": "an update this SDK does not know"},
                  {"sessionUpdate": "agent_message_chunk", "content": {"type": "hologram"}}):
        assert renderer.render(quiet) == []
    renderer.render({"sessionUpdate": "usage_update", "used": 10, "size": 100})
    assert (renderer.usage.used, renderer.usage.size) == (10, 100)


def test_extra_meta_fields_do_not_matter() -> None:
    renderer = ActivityRenderer()
    update = tool_call("t", "ls", _meta={"claudeCode": {"toolName": "Bash"}})
    assert texts(renderer.render(update)) == "▸ ls\n"


def test_raw_updates_as_data_parts_round_trip() -> None:
    update = {"sessionUpdate": "notice", "text": "x"}
    part = acp_update_part(update)
    assert part["mimeType"] == "application/vnd.lmbridge.acp-update+json"
    assert json.loads(base64.b64decode(part["data"])) == update
