"""Scenario files: the TOML format of ``lmbridge test`` (documented in docs/harness.md), loaded into plain objects.

Owns reading a scenario, checking every key (unknown keys are errors: a typo must not silently test nothing), and
turning mistakes into a ``ScenarioError`` that names the file and the key (``turns[2].expect.stop_reason``). Also
owns what a fake editor tool answers (canned, templated from the call's input, per-case, successive results, or
errors) and what the editor answers a permission request.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wire.vocabulary import TURN_STOP_REASONS

__all__ = [
    "CHECK_NAMES",
    "AgentRef",
    "Cancel",
    "Expect",
    "Scenario",
    "ScenarioError",
    "Timeouts",
    "ToolSpec",
    "Turn",
    "load_scenario",
    "parse_checks",
    "parse_scenario",
    "render_template",
]

CHECK_NAMES = ("initialize", "session-new", "stop-reason", "cancel", "update-schema", "tool-calls")
PERMISSION_WORDS = {
    "allow": "allow",
    "allow_once": "allow",
    "allow_always": "always",
    "always": "always",
    "reject": "reject",
    "reject_once": "reject",
    "deny": "reject",
    "never": "never",
}
PART_TYPES = ("any", "text", "thinking", "tool_call", "data")


class ScenarioError(Exception):
    """A mistake in a scenario file; the message names the file and the key."""

    def __init__(self, path: Path | str | None, key: str | None, message: str) -> None:
        where = [part for part in (str(path) if path is not None else None, key) if part]
        super().__init__(": ".join([*where, message]))
        self.path = path
        self.key = key


@dataclass(frozen=True)
class Timeouts:
    """Seconds each phase may take before the scenario fails with a timeout naming the phase."""

    initialize: float = 60.0  # the agent's answer to initialize (from when lmbridge sends it)
    session_new: float = 60.0  # the answer to session/new (or session/load, session/resume)
    first_update: float = 120.0  # from session/prompt to the agent's first message about it
    idle: float = 120.0  # the longest silence of the agent while the editor waits for it
    turn: float = 600.0  # a whole scenario turn, all its tool rounds included
    cancel: float = 10.0  # from session/cancel to the agent's answer to the cancelled prompt


@dataclass(frozen=True)
class Case:
    when: dict[str, Any]
    result: str | None
    error: str | None


@dataclass(frozen=True)
class ToolSpec:
    """A fake editor tool: its definition as the editor offers it, and how the editor answers calls."""

    name: str
    description: str
    input_schema: dict[str, Any]
    result: str | None = None
    error: str | None = None
    results: tuple[str, ...] = ()
    cases: tuple[Case, ...] = ()

    def definition(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "inputSchema": self.input_schema}

    def answer(self, arguments: Any, call_number: int) -> tuple[str, bool]:
        """The result text and whether it is an error, for the ``call_number``-th call (0-based) of this tool."""
        for case in self.cases:
            if isinstance(arguments, dict) and all(arguments.get(k) == v for k, v in case.when.items()):
                if case.error is not None:
                    return render_template(case.error, self.name, arguments), True
                return render_template(case.result or "", self.name, arguments), False
        if self.results:
            text = self.results[min(call_number, len(self.results) - 1)]
            return render_template(text, self.name, arguments), False
        if self.error is not None:
            return render_template(self.error, self.name, arguments), True
        if self.result is not None:
            return render_template(self.result, self.name, arguments), False
        return f"{self.name}: ok", False


_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)\}")


def render_template(template: str, name: str, arguments: Any) -> str:
    """``{key}`` → the call's argument (``{a.b}`` for nested ones), ``{input}`` → all arguments as JSON, ``{name}`` →
    the tool's name. Unknown placeholders stay as written."""

    def value(match: re.Match[str]) -> str:
        path = match.group(1)
        if path == "input":
            return json.dumps(arguments, ensure_ascii=False, sort_keys=True)
        if path == "name":
            return name
        current: Any = arguments
        for piece in path.split("."):
            if isinstance(current, dict) and piece in current:
                current = current[piece]
            else:
                return match.group(0)
        return current if isinstance(current, str) else json.dumps(current, ensure_ascii=False)

    return _PLACEHOLDER.sub(value, template)


@dataclass(frozen=True)
class Cancel:
    """When the editor cancels a turn (``$/cancelRequest``)."""

    on_text: str | None = None  # once the streamed text contains this
    on_part: str | None = None  # once a part of this type arrived ("any" for the first part)
    after_ms: int | None = None  # this long after the request was sent


@dataclass(frozen=True)
class ExpectedCall:
    name: str
    input: dict[str, Any] | None = None  # a subset the call's input must contain


@dataclass(frozen=True)
class Expect:
    text: str | None = None
    text_contains: tuple[str, ...] = ()
    text_not_contains: tuple[str, ...] = ()
    text_matches: tuple[str, ...] = ()
    thinking_contains: tuple[str, ...] = ()
    stop_reason: tuple[str, ...] = ()
    tool_calls: tuple[ExpectedCall, ...] | None = None
    permissions: tuple[str, ...] | None = None
    rounds: int | None = None
    error: bool = False
    error_code: int | None = None
    error_contains: str | None = None
    updates: tuple[str, ...] | None = None
    updates_exactly: tuple[str, ...] | None = None
    no_updates: tuple[str, ...] = ()
    tool_call_statuses: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Turn:
    number: int  # 1-based, as reports name it
    user: str
    expect: Expect = field(default_factory=Expect)
    tools: tuple[str, ...] | None = None  # the scenario tools offered in this turn (default: all)
    permission_tool: bool = True  # offer the permission tool
    permissions: str | None = None  # this turn's answer to permission requests (default: the scenario's)
    cancel: Cancel | None = None
    new_conversation: bool = False
    max_rounds: int = 10
    reverse_results: bool = False  # answer a round's tool calls in reverse order (as editors may)

    @property
    def label(self) -> str:
        first = self.user.strip().splitlines()[0] if self.user.strip() else ""
        return f"turn {self.number}" + (f" ({first[:60]})" if first else "")


@dataclass(frozen=True)
class AgentRef:
    """The agent a scenario names: a configured id, or a command."""

    id: str | None = None
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    authenticate: str | None = None


@dataclass(frozen=True)
class Scenario:
    path: Path | None
    name: str
    description: str = ""
    agent: AgentRef | None = None
    thinking: bool = False
    acp_updates: bool = False
    workspace: str | None = None
    timeouts: Timeouts = field(default_factory=Timeouts)
    tools: tuple[ToolSpec, ...] = ()
    permission_answer: str = "allow"
    permission_by_title: dict[str, str] = field(default_factory=dict)
    permission_policy: str = "ask"
    checks: tuple[str, ...] | None = None  # None: every check
    turns: tuple[Turn, ...] = ()

    @property
    def file(self) -> str:
        return str(self.path) if self.path is not None else self.name

    def permission_answer_for(self, turn: Turn, title: str) -> str:
        """What the editor answers a permission request: a word lmbridge reads (allow, always, reject), an option
        id, or ``never`` (no answer: the next turn moves on, which lmbridge answers ``cancelled``)."""
        if title in self.permission_by_title:
            return self.permission_by_title[title]
        return turn.permissions or self.permission_answer


def load_scenario(path: str | Path) -> Scenario:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(path, None, f"cannot read: {exc}") from None
    return parse_scenario(text, path)


def parse_scenario(text: str, path: Path | None = None) -> Scenario:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(path, None, f"invalid TOML: {exc}") from None
    r = _Reader(path)
    r.keys(
        data, "", {"name", "description", "agent", "editor", "timeouts", "tools", "permissions", "conformance", "turns"}
    )
    name = r.get(data, "", "name", str) or (path.stem if path is not None else "scenario")
    agent = _agent(r, data.get("agent")) if "agent" in data else None
    editor = r.table(data, "", "editor")
    r.keys(editor, "editor", {"thinking", "acp_updates", "workspace"})
    workspace = r.get(editor, "editor", "workspace", str)
    if workspace is not None and path is not None and not Path(workspace).is_absolute():
        workspace = str((path.parent / workspace).resolve())
    timeouts_table = r.table(data, "", "timeouts")
    r.keys(timeouts_table, "timeouts", set(Timeouts.__dataclass_fields__))
    timeouts = Timeouts(**{key: float(r.positive(timeouts_table, "timeouts", key)) for key in timeouts_table})
    tools = tuple(_tool(r, raw, f"tools[{i}]") for i, raw in enumerate(r.array(data, "", "tools")))
    names = [tool.name for tool in tools]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ScenarioError(path, "tools", f"tool names must be unique; repeated: {', '.join(duplicates)}")
    permissions = r.table(data, "", "permissions")
    r.keys(permissions, "permissions", {"answer", "by_title", "policy"})
    answer = _permission_answer(r, permissions, "permissions", "answer") or "allow"
    by_title_raw = r.table(permissions, "permissions", "by_title")
    by_title = {
        title: _permission_answer(r, by_title_raw, "permissions.by_title", title) or "allow" for title in by_title_raw
    }
    policy = r.get(permissions, "permissions", "policy", str) or "ask"
    if policy not in ("ask", "allow_reads", "allow_all", "deny"):
        raise ScenarioError(path, "permissions.policy", "must be one of ask, allow_reads, allow_all, deny")
    conformance = r.table(data, "", "conformance")
    r.keys(conformance, "conformance", {"checks", "skip"})
    checks: tuple[str, ...] | None = None
    if "checks" in conformance:
        checks = parse_checks(r.strings(conformance, "conformance", "checks"), path, "conformance.checks")
    if "skip" in conformance:
        skip = parse_checks(r.strings(conformance, "conformance", "skip"), path, "conformance.skip")
        checks = tuple(c for c in (checks if checks is not None else CHECK_NAMES) if c not in skip)
    raw_turns = r.array(data, "", "turns")
    if not raw_turns:
        raise ScenarioError(path, "turns", "a scenario needs at least one [[turns]] table")
    turns = tuple(_turn(r, raw, i, names) for i, raw in enumerate(raw_turns))
    return Scenario(
        path=path,
        name=name,
        description=r.get(data, "", "description", str) or "",
        agent=agent,
        thinking=bool(r.get(editor, "editor", "thinking", bool)),
        acp_updates=bool(r.get(editor, "editor", "acp_updates", bool)),
        workspace=workspace,
        timeouts=timeouts,
        tools=tools,
        permission_answer=answer,
        permission_by_title=by_title,
        permission_policy=policy,
        checks=checks,
        turns=turns,
    )


def parse_checks(values: list[str] | tuple[str, ...], path: Path | None = None, key: str = "checks") -> tuple[str, ...]:
    """Check names, with ``all`` for every check and ``none`` for no check."""
    out: list[str] = []
    for value in values:
        value = value.strip()
        if not value:
            continue
        if value == "all":
            out.extend(CHECK_NAMES)
        elif value == "none":
            continue
        elif value in CHECK_NAMES:
            out.append(value)
        else:
            raise ScenarioError(path, key, f"unknown check {value!r} (known: {', '.join(CHECK_NAMES)}, all, none)")
    return tuple(dict.fromkeys(out))


def _agent(r: _Reader, raw: Any) -> AgentRef:
    if not isinstance(raw, dict):
        raise ScenarioError(r.path, "agent", "must be a table with 'id' or 'command'")
    r.keys(raw, "agent", {"id", "command", "args", "env", "cwd", "authenticate"})
    agent_id = r.get(raw, "agent", "id", str)
    command = r.get(raw, "agent", "command", str)
    if (agent_id is None) == (command is None):
        raise ScenarioError(r.path, "agent", "needs exactly one of 'id' (a configured agent) or 'command'")
    env = r.table(raw, "agent", "env")
    if not all(isinstance(v, str) for v in env.values()):
        raise ScenarioError(r.path, "agent.env", "values must be strings")
    cwd = r.get(raw, "agent", "cwd", str)
    if cwd is not None and r.path is not None and not Path(cwd).expanduser().is_absolute():
        cwd = str((r.path.parent / cwd).resolve())  # relative to the scenario file
    return AgentRef(
        id=agent_id,
        command=command,
        args=tuple(r.strings(raw, "agent", "args")),
        env=dict(env),
        cwd=cwd,
        authenticate=r.get(raw, "agent", "authenticate", str),
    )


def _tool(r: _Reader, raw: Any, key: str) -> ToolSpec:
    if not isinstance(raw, dict):
        raise ScenarioError(r.path, key, "must be a table")
    r.keys(raw, key, {"name", "description", "input_schema", "result", "error", "results", "cases"})
    name = r.get(raw, key, "name", str)
    if not name:
        raise ScenarioError(r.path, f"{key}.name", "is required")
    schema = r.table(raw, key, "input_schema") or {"type": "object"}
    outcomes = [k for k in ("result", "error", "results") if k in raw]
    if len(outcomes) > 1:
        raise ScenarioError(r.path, key, f"give one of result, error, results (got {', '.join(outcomes)})")
    cases = []
    for i, case in enumerate(r.array(raw, key, "cases")):
        case_key = f"{key}.cases[{i}]"
        if not isinstance(case, dict):
            raise ScenarioError(r.path, case_key, "must be a table")
        r.keys(case, case_key, {"when", "result", "error"})
        if ("result" in case) == ("error" in case):
            raise ScenarioError(r.path, case_key, "needs exactly one of result, error")
        cases.append(
            Case(
                dict(r.table(case, case_key, "when")),
                r.get(case, case_key, "result", str),
                r.get(case, case_key, "error", str),
            )
        )
    return ToolSpec(
        name=name,
        description=r.get(raw, key, "description", str) or f"The {name} tool",
        input_schema=dict(schema),
        result=r.get(raw, key, "result", str),
        error=r.get(raw, key, "error", str),
        results=tuple(r.strings(raw, key, "results")),
        cases=tuple(cases),
    )


def _turn(r: _Reader, raw: Any, index: int, tool_names: list[str]) -> Turn:
    key = f"turns[{index}]"
    if not isinstance(raw, dict):
        raise ScenarioError(r.path, key, "must be a table")
    r.keys(
        raw,
        key,
        {
            "user",
            "expect",
            "tools",
            "permission_tool",
            "permissions",
            "cancel",
            "new_conversation",
            "max_rounds",
            "reverse_results",
        },
    )
    user = r.get(raw, key, "user", str)
    if user is None:
        raise ScenarioError(r.path, f"{key}.user", "is required: the user's message")
    tools = None
    if "tools" in raw:
        tools = tuple(r.strings(raw, key, "tools"))
        unknown = [t for t in tools if t not in tool_names]
        if unknown:
            raise ScenarioError(
                r.path,
                f"{key}.tools",
                f"unknown tool(s) {', '.join(unknown)}; the scenario's "
                f"[[tools]] are: {', '.join(tool_names) or '(none)'}",
            )
    cancel = None
    if "cancel" in raw:
        table = r.table(raw, key, "cancel")
        r.keys(table, f"{key}.cancel", {"on_text", "on_part", "after_ms"})
        on_part = r.get(table, f"{key}.cancel", "on_part", str)
        if on_part is not None and on_part not in PART_TYPES:
            raise ScenarioError(r.path, f"{key}.cancel.on_part", f"must be one of {', '.join(PART_TYPES)}")
        after_ms = r.get(table, f"{key}.cancel", "after_ms", int)
        cancel = Cancel(on_text=r.get(table, f"{key}.cancel", "on_text", str), on_part=on_part, after_ms=after_ms)
        if cancel == Cancel():
            raise ScenarioError(r.path, f"{key}.cancel", "give on_text, on_part or after_ms")
    max_rounds = r.get(raw, key, "max_rounds", int)
    return Turn(
        number=index + 1,
        user=user,
        expect=_expect(r, r.table(raw, key, "expect"), f"{key}.expect"),
        tools=tools,
        permission_tool=r.get(raw, key, "permission_tool", bool) is not False,
        permissions=_permission_answer(r, raw, key, "permissions"),
        cancel=cancel,
        new_conversation=bool(r.get(raw, key, "new_conversation", bool)),
        max_rounds=max_rounds if max_rounds is not None else 10,
        reverse_results=bool(r.get(raw, key, "reverse_results", bool)),
    )


def _expect(r: _Reader, raw: dict[str, Any], key: str) -> Expect:
    r.keys(
        raw,
        key,
        {
            "text",
            "text_contains",
            "text_not_contains",
            "text_matches",
            "thinking_contains",
            "stop_reason",
            "tool_calls",
            "permissions",
            "rounds",
            "error",
            "updates",
            "updates_exactly",
            "no_updates",
            "tool_call_statuses",
        },
    )
    stop = r.strings_or_one(raw, key, "stop_reason")
    for value in stop:
        if value not in TURN_STOP_REASONS:
            raise ScenarioError(
                r.path,
                f"{key}.stop_reason",
                f"unknown stop reason {value!r} (editor stop reasons: {', '.join(TURN_STOP_REASONS)})",
            )
    for pattern in r.strings_or_one(raw, key, "text_matches"):
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ScenarioError(
                r.path, f"{key}.text_matches", f"invalid regular expression {pattern!r}: {exc}"
            ) from None
    calls = None
    if "tool_calls" in raw:
        items = raw["tool_calls"]
        if not isinstance(items, list):
            raise ScenarioError(r.path, f"{key}.tool_calls", "must be a list of tool names or {name, input} tables")
        parsed = []
        for i, item in enumerate(items):
            if isinstance(item, str):
                parsed.append(ExpectedCall(item))
            elif isinstance(item, dict) and isinstance(item.get("name"), str):
                r.keys(item, f"{key}.tool_calls[{i}]", {"name", "input"})
                parsed.append(
                    ExpectedCall(
                        item["name"],
                        dict(r.table(item, f"{key}.tool_calls[{i}]", "input")) if "input" in item else None,
                    )
                )
            else:
                raise ScenarioError(r.path, f"{key}.tool_calls[{i}]", "must be a tool name or a {name, input} table")
        calls = tuple(parsed)
    error = raw.get("error")
    error_code = error_contains = None
    if error is not None:
        if isinstance(error, bool):
            pass
        elif isinstance(error, int):
            error_code = error
        elif isinstance(error, str):
            error_contains = error
        else:
            raise ScenarioError(r.path, f"{key}.error", "must be true, an error code, or a text the message contains")
    return Expect(
        text=r.get(raw, key, "text", str),
        text_contains=tuple(r.strings_or_one(raw, key, "text_contains")),
        text_not_contains=tuple(r.strings_or_one(raw, key, "text_not_contains")),
        text_matches=tuple(r.strings_or_one(raw, key, "text_matches")),
        thinking_contains=tuple(r.strings_or_one(raw, key, "thinking_contains")),
        stop_reason=tuple(stop),
        tool_calls=calls,
        permissions=tuple(r.strings(raw, key, "permissions")) if "permissions" in raw else None,
        rounds=r.get(raw, key, "rounds", int),
        error=error is not None and error is not False,
        error_code=error_code,
        error_contains=error_contains,
        updates=tuple(r.strings(raw, key, "updates")) if "updates" in raw else None,
        updates_exactly=tuple(r.strings(raw, key, "updates_exactly")) if "updates_exactly" in raw else None,
        no_updates=tuple(r.strings(raw, key, "no_updates")),
        tool_call_statuses=tuple(r.strings(raw, key, "tool_call_statuses")) if "tool_call_statuses" in raw else None,
    )


def _permission_answer(r: _Reader, table: dict[str, Any], key: str, name: str) -> str | None:
    value: str | None = r.get(table, key, name, str)
    if value is None:
        return None
    return PERMISSION_WORDS.get(value.strip().lower(), value.strip())


class _Reader:
    """Typed access to TOML tables with errors that name the key."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    def _key(self, table_key: str, name: str) -> str:
        return f"{table_key}.{name}" if table_key else name

    def keys(self, table: dict[str, Any], key: str, known: set[str]) -> None:
        for name in table:
            if name not in known:
                raise ScenarioError(
                    self.path, self._key(key, name), f"unknown key (known here: {', '.join(sorted(known))})"
                )

    def get(self, table: dict[str, Any], key: str, name: str, kind: type) -> Any:
        if name not in table:
            return None
        value = table[name]
        if kind is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        elif kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, kind)
        if not ok:
            raise ScenarioError(
                self.path,
                self._key(key, name),
                f"must be {_KIND_NAMES.get(kind, kind.__name__)}, got {type(value).__name__} {value!r}",
            )
        return value

    def positive(self, table: dict[str, Any], key: str, name: str) -> float:
        value: float | None = self.get(table, key, name, float)
        if value is None or value <= 0:
            raise ScenarioError(self.path, self._key(key, name), "must be a positive number of seconds")
        return value

    def table(self, table: dict[str, Any], key: str, name: str) -> dict[str, Any]:
        value = self.get(table, key, name, dict)
        return value if value is not None else {}

    def array(self, table: dict[str, Any], key: str, name: str) -> list[Any]:
        value = self.get(table, key, name, list)
        return value if value is not None else []

    def strings(self, table: dict[str, Any], key: str, name: str) -> list[str]:
        values = self.array(table, key, name)
        if not all(isinstance(v, str) for v in values):
            raise ScenarioError(self.path, self._key(key, name), "must be a list of strings")
        return values

    def strings_or_one(self, table: dict[str, Any], key: str, name: str) -> list[str]:
        if isinstance(table.get(name), str):
            return [table[name]]
        return self.strings(table, key, name)


_KIND_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    dict: "a table",
    list: "a list",
}
