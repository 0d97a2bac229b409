"""``lmbridge chat``: the terminal client, driven through its stdin like a person at the keyboard."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trio

from bridge.cli.chat import Completions, run_example_tool, status_line

pytestmark = pytest.mark.wire  # lmbridge and its agents as processes: make test, not make check


async def chat(tmp_path: Path, config: Path, typed: str, *args: str) -> str:
    done = await trio.run_process(
        [sys.executable, "-m", "bridge", "chat", "--config", str(config), *args],
        stdin=typed.encode(),
        capture_stdout=True,
        capture_stderr=True,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


async def test_text_tools_and_permissions_from_the_keyboard(tmp_path: Path, agents_toml: Path) -> None:
    (tmp_path / "notes.txt").write_text("remember the milk")
    with trio.fail_after(60):
        out = await chat(
            tmp_path,
            agents_toml,
            "/say hello\n"
            '/tool read_file {"path": "notes.txt"}\n'
            "/permission rm -rf build\nn\n"
            "/permission kind=edit notes.txt\na\n"
            ":quit\n",
            "--agent",
            "scripted",
        )
    assert "agent › hello\n" in out
    assert "tool read_file returned: remember the milk" in out
    assert "⚠ the agent asks: rm -rf build  (execute)" in out and "permission outcome: reject-once" in out
    assert "permission outcome: allow-always" in out


async def test_each_answer_ends_with_a_status_line(tmp_path: Path, agents_toml: Path) -> None:
    with trio.fail_after(60):
        out = await chat(
            tmp_path, agents_toml, "/usage 1200 200000 0.0525 USD\n/say hi\n:quit\n", "--agent", "scripted"
        )
    assert "⏎ end_turn · 1,200 in / 1 out · context 1,200 of 200,000 (0%) · 0.0525 USD" in out


def test_the_status_line_shows_only_what_was_reported() -> None:
    assert status_line("end_turn", None) == "end_turn"
    assert status_line("max_tokens", {"contextUsed": 150000, "contextSize": 200000}) == (
        "max_tokens · context 150,000 of 200,000 (75%)"
    )
    assert status_line("end_turn", {"inputTokens": 3, "outputTokens": 4, "contextSize": 0}) == "end_turn · 3 in / 4 out"


def test_example_tools_stay_inside_the_workspace(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("A")
    assert run_example_tool("read_file", {"path": "a.txt"}, tmp_path) == ("A", False)
    assert run_example_tool("list_files", {}, tmp_path) == ("a.txt", False)
    text, error = run_example_tool("read_file", {"path": "../../etc/passwd"}, tmp_path)
    assert error and "outside the workspace" in text


async def test_the_agents_models_and_slash_commands_once_it_showed_them(tmp_path: Path, agents_toml: Path) -> None:
    typed = ":commands\n/say hi\n:commands\n:models\n:agent scripted/demo-large\n/options\n:quit\n"
    with trio.fail_after(60):
        out = await chat(tmp_path, agents_toml, typed, "--agent", "scripted")
    before, _, after = out.partition("agent › hi")
    assert "the agent has announced no slash commands" in before
    assert "/say TEXT — stream TEXT (and a newline) in several chunks" in after
    assert "scripted/demo-large" in after and "now talking to 'scripted/demo-large'" in after
    assert 'model="demo-large"' in after


def test_tab_completes_chat_commands_models_and_slash_commands() -> None:
    completions = Completions()
    completions.models = ["claude", "claude/sonnet", "codex"]
    completions.commands = ["review", "compact", "init"]
    assert completions.candidates(":a") == [":agent"]
    assert completions.candidates(":agent cl") == ["claude", "claude/sonnet"]
    assert completions.candidates("/") == ["/compact", "/init", "/review"]
    assert completions.candidates("/re") == ["/review"]
    assert completions.candidates("/review the diff") == []
    assert completions.candidates("hello") == []
