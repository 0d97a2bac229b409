"""The agents file: where it is found, what it may say, and errors that name the file, the line and the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bridge.config import (
    ConfigError,
    agent_from_mapping,
    find_config_file,
    known_agent,
    load_config,
    mcp_transport,
    parse_config,
    tool_batch_idle,
)


def test_without_a_file_only_the_demo_agent_exists(tmp_path: Path) -> None:
    config = load_config(None, {"XDG_CONFIG_HOME": str(tmp_path)})
    assert list(config.agents) == ["demo"]
    assert config.agents["demo"].argv[1:] == ["-m", "bridge.demo"]


def test_search_order_is_flag_then_env_then_xdg(tmp_path: Path) -> None:
    xdg = tmp_path / "xdg" / "lmbridge"
    xdg.mkdir(parents=True)
    (xdg / "config.toml").write_text("")
    env_file = tmp_path / "env.toml"
    env_file.write_text("")
    flag_file = tmp_path / "flag.toml"
    flag_file.write_text("")
    environ = {"XDG_CONFIG_HOME": str(tmp_path / "xdg"), "LMBRIDGE_CONFIG": str(env_file)}
    assert find_config_file(flag_file, environ) == flag_file
    assert find_config_file(None, environ) == env_file
    assert find_config_file(None, {"XDG_CONFIG_HOME": str(tmp_path / "xdg")}) == xdg / "config.toml"


def test_a_named_file_that_does_not_exist_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        find_config_file(tmp_path / "nope.toml", {})


def test_a_full_agent_definition() -> None:
    config = parse_config("""
[agents.claude]
name = "Claude Code"
command = "npx"
args = ["-y", "@agentclientprotocol/claude-agent-acp@0.49.0"]
env = { IS_SANDBOX = "1" }
cwd = "/tmp"
authenticate = "api-key"
permission_policy = "allow_reads"
max_input_tokens = 100000
prestart = true
options = { model = "sonnet", fast = false }

[sessions]
idle_ttl = 60
max_sessions = 8

[permissions]
policy = "deny"
tool_name = "confirm_agent_action"
""")
    claude = config.agents["claude"]
    assert claude.argv == ["npx", "-y", "@agentclientprotocol/claude-agent-acp@0.49.0"]
    assert claude.env == {"IS_SANDBOX": "1"} and claude.cwd == "/tmp" and claude.authenticate == "api-key"
    assert claude.permission_policy == "allow_reads" and claude.max_input_tokens == 100000 and claude.prestart
    assert claude.options == (("model", "sonnet"), ("fast", False))
    assert config.agents["demo"].prestart is False
    assert config.sessions.idle_ttl == 60.0 and config.sessions.max_sessions == 8
    assert config.permissions.policy == "deny" and config.permissions.tool_name == "confirm_agent_action"
    assert set(config.agents) == {"demo", "claude"}


@pytest.mark.parametrize(
    ("text", "line", "key", "words"),
    [
        ('[agents.a]\ncommand = "x"\nargs = "not a list"\n', 3, "agents.a.args", "must be a list"),
        ('[agents.a]\nname = "A"\n', 1, "agents.a.command", "is required"),
        ('[agents.a]\ncommand = "x"\ncolour = "blue"\n', 3, "agents.a.colour", "unknown key"),
        ('[agents.a]\ncommand = "x"\n\n[sessions]\nidle_ttl = -5\n', 5, "sessions.idle_ttl", "positive"),
        # The settings are tuples: their methods are not keys.
        ("[sessions]\ncount = 3\n", 2, "sessions.count", "unknown key (known keys: idle_ttl, max_sessions"),
        ("[serve]\n_replace = 1\n", 2, "serve._replace", "unknown key"),
        ('[permissions]\npolicy = "sometimes"\n', 2, "permissions.policy", "ask, allow_reads, allow_all, deny"),
        ('[agents.demo]\ncommand = "x"\n', 1, "agents.demo", "built-in"),
        ('[agents.a]\ncommand = "x"\ncwd = "relative/dir"\n', 3, "agents.a.cwd", "absolute"),
        ('[agents.a]\ncommand = "x"\nenv = { K = 1 }\n', 3, "agents.a.env", "strings"),
        ('[agent.a]\ncommand = "x"\n', 1, "agent", "unknown table"),
        ('[agents.a]\ncommand = "x"\nprestart = "yes"\n', 3, "agents.a.prestart", "must be true or false"),
        ('[agents.a]\ncommand = "x"\noptions = { effort = 3 }\n', 3, "agents.a.options.effort", "strings or booleans"),
    ],
)
def test_mistakes_name_file_line_and_key(tmp_path: Path, text: str, line: int, key: str, words: str) -> None:
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        load_config(path, {})
    assert error.value.path == path and error.value.line == line and error.value.key == key
    assert str(error.value).startswith(f"{path}:{line}, key {key!r}: ")
    assert words in str(error.value)


def test_invalid_toml_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[agents.a]\ncommand = "x"\nargs = [\n')
    with pytest.raises(ConfigError) as error:
        load_config(path, {})
    assert error.value.line is not None and "invalid TOML" in str(error.value)


def test_editor_supplied_agents_accept_camel_case() -> None:
    agent = agent_from_mapping("mine", {"command": "my-agent", "permissionPolicy": "deny", "imageInput": True})
    assert agent.permission_policy == "deny" and agent.image_input is True


def test_the_cli_reports_a_bad_config_in_one_line_and_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("[agents.a]\ncommand = 5\n")
    done = subprocess.run(
        [sys.executable, "-m", "bridge", "stdio", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert (
        done.stderr.strip()
        == f"lmbridge: configuration error: {path}:2, key 'agents.a.command': must be a string, got an integer"
    )


def test_unset_env_removes_inherited_variables(tmp_path: Path) -> None:
    config = parse_config('[agents.a]\ncommand = "x"\nunset_env = ["OPENAI_*", "HOME2"]\n')
    assert config.agents["a"].unset_env == ("OPENAI_*", "HOME2")
    with pytest.raises(ConfigError, match="unset_env"):
        parse_config('[agents.a]\ncommand = "x"\nunset_env = [""]\n')


def test_each_command_keeps_its_own_log_level_default() -> None:
    from bridge.cli import build_parser

    parser = build_parser()
    assert [parser.parse_args([c]).log_level for c in ("stdio", "serve", "demo", "chat")] == [
        "info",
        "info",
        "warning",
        "warning",
    ]


def test_tool_batch_idle_is_the_agents_then_the_sessions_then_the_known_agents() -> None:
    """Codex and OpenCode, which report each call only as (or after) they make it, wait for no other (measured,
    docs/tools.md); every other agent 15 ms; the config's word wins, the agent's own over [sessions]."""
    codex = {"command": "npx", "args": ["-y", "@zed-industries/codex-acp@0.16.0"]}
    claude = {"command": "claude-agent-acp"}
    defaults = parse_config("[agents.codex]\ncommand = 'codex-acp'\n").sessions
    assert defaults.tool_batch_idle is None
    assert tool_batch_idle(agent_from_mapping("c", codex), defaults) == 0.0
    assert tool_batch_idle(agent_from_mapping("c", claude), defaults) == 0.015
    opencode = {"command": "/usr/local/bin/opencode", "args": ["acp"]}  # reports its calls after making them
    assert tool_batch_idle(agent_from_mapping("o", opencode), defaults) == 0.0
    assert tool_batch_idle(None, defaults) == 0.015  # an agent no longer configured
    given = parse_config("[sessions]\ntool_batch_idle = 0.02\n").sessions
    assert given.tool_batch_idle == 0.02
    assert tool_batch_idle(agent_from_mapping("c", codex), given) == 0.02
    own = agent_from_mapping("c", {**codex, "toolBatchIdle": 1})  # an editor's camelCase, an integer
    assert own.tool_batch_idle == 1.0 and isinstance(own.tool_batch_idle, float)
    assert tool_batch_idle(own, given) == 1.0
    for wrong in (-1, -0.001, True, "fast", 10**9, float("nan")):
        with pytest.raises(ConfigError, match="tool_batch_idle"):
            agent_from_mapping("c", {**codex, "tool_batch_idle": wrong})
    with pytest.raises(ConfigError, match=r"sessions\.tool_batch_idle.*a number from 0"):
        parse_config("[sessions]\ntool_batch_idle = 'soon'\n")
    with pytest.raises(ConfigError, match=r"sessions\.tool_batch_idle"):
        parse_config("[sessions]\ntool_batch_idle = -1\n")
    # 0: no wait, each call goes to the editor as it comes (a model that streams its calls loses nothing by it)
    assert tool_batch_idle(agent_from_mapping("c", {**codex, "tool_batch_idle": 0}), given) == 0.0
    assert parse_config("[sessions]\ntool_batch_idle = 0\n").sessions.tool_batch_idle == 0.0


@pytest.mark.parametrize(
    ("command", "args", "known", "transport"),
    [
        ("/opt/bin/codex-acp", [], "codex", "stdio"),  # measured faster over the stdio relay (docs/agents.md)
        ("npx", ["-y", "@zed-industries/codex-acp@0.16.0"], "codex", "stdio"),
        ("npx", ["@agentclientprotocol/claude-agent-acp"], "claude", "stdio"),
        ("gemini", ["--experimental-acp"], "gemini", "stdio"),
        ("/usr/local/bin/opencode", ["acp"], "opencode", "stdio"),
        ("my-agent", [], None, "auto"),
    ],
)
def test_auto_gives_each_known_agent_its_faster_mcp_transport(
    command: str, args: list[str], known: str | None, transport: str
) -> None:
    agent = agent_from_mapping("a", {"command": command, "args": args})
    assert known_agent(agent) == known
    assert mcp_transport(agent) == transport
    for chosen in ("http", "stdio"):  # the config's word wins
        assert (
            mcp_transport(agent_from_mapping("a", {"command": command, "args": args, "mcp_transport": chosen}))
            == chosen
        )
