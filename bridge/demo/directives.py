"""The demo agent's directive language: its table (``DIRECTIVES``, the reference), and the parser.

Lines of a prompt that start with ``/`` are directives, carried out in order; other lines are echoed back
(``echo: <text>``). Every directive is one row of ``DIRECTIVES``: its syntax, what it does, and how its argument is
read into a ``Step``. ``reference()`` renders the table (the demo agent answers ``/help`` with it, and
docs/harness.md shows it); ``bridge.demo.agent`` has one ``_do_<name>`` handler per row, and a test holds the two
to each other.

A malformed directive raises ``ScriptError`` naming it; the agent says so as text instead of failing the turn.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from wire.vocabulary import STOP_REASONS

__all__ = [
    "DIRECTIVES",
    "PERMISSION_OPTIONS",
    "TOOL_KINDS",
    "Directive",
    "ScriptError",
    "Step",
    "parse_script",
    "reference",
]

# What /stop may end a turn with: every ACP stop reason but "cancelled", which only a cancel produces.
FINAL_STOP_REASONS = tuple(reason for reason in STOP_REASONS if reason != "cancelled")
TOOL_KINDS = ("read", "edit", "delete", "move", "search", "execute", "think", "fetch", "switch_mode", "other")
PERMISSION_OPTIONS = (
    ("allow-once", "Allow once", "allow_once"),
    ("allow-always", "Allow always", "allow_always"),
    ("reject-once", "Reject", "reject_once"),
)


class ScriptError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Step:
    """One directive (``kind`` is its name without the slash), or ``echo`` for plain text."""

    kind: str
    arg: str = ""
    calls: tuple[tuple[str, Any], ...] = ()  # tool calls (name, arguments), permission requests (title, kind), plan
    number: int = 0


@dataclass(frozen=True, slots=True)
class Directive:
    name: str
    syntax: str  # what follows the name
    does: str
    read: Callable[[str, str], Step]  # (name, argument) → Step
    misbehaviour: bool = False  # for testing ACP test tools: ``lmbridge test`` catches each one


# -- argument readers --------------------------------------------------------------------------------------------


def _text(name: str, arg: str) -> Step:
    if not arg:
        raise ScriptError(f"/{name} needs a text")
    return Step(name, arg)


def _title(name: str, arg: str) -> Step:
    if not arg:
        raise ScriptError(f"/{name} needs a title")
    return Step(name, arg)


def _number(name: str, arg: str) -> Step:
    if not arg.isdigit():
        raise ScriptError(f"/{name} needs a whole number, got {arg!r}")
    return Step(name, number=int(arg))


def _nothing(name: str, arg: str) -> Step:
    return Step(name)


def _barrier(name: str, arg: str) -> Step:
    label, _, count = arg.partition(" ")
    if not label or not count.strip().isdigit() or int(count) < 1:
        raise ScriptError("/barrier needs a name and a number of prompts, e.g. /barrier pair 2")
    return Step(name, label, number=int(count))


def _later(name: str, arg: str) -> Step:
    ms, _, rest = arg.partition(" ")
    if not ms.isdigit() or not rest.strip():
        raise ScriptError("/later needs MS and a text, e.g. /later 100 hello")
    return Step(name, rest.strip(), number=int(ms))


def _plan(name: str, arg: str) -> Step:
    entries = [entry.strip() for entry in arg.split(";") if entry.strip()]
    if not entries:
        raise ScriptError("/plan needs entries separated by ';'")
    return Step(name, arg, calls=tuple((entry, None) for entry in entries))


def _tool_call(text: str) -> tuple[str, Any]:
    name, _, raw = text.partition(" ")
    if not name:
        raise ScriptError("/tool needs a tool name")
    raw = raw.strip()
    if not raw:
        return name, {}
    try:
        return name, json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ScriptError(f"/tool {name}: arguments are not JSON: {exc}") from None


def _tool(name: str, arg: str) -> Step:
    return Step(name, calls=(_tool_call(arg),))


def _tools(name: str, arg: str) -> Step:
    return Step(name, calls=tuple(_tool_call(part.strip()) for part in arg.split("|")))


def _toolwait(name: str, arg: str) -> Step:
    ms, _, rest = arg.partition(" ")
    if not ms.isdigit():
        raise ScriptError("/toolwait needs MS, a tool name and JSON arguments")
    return Step(name, calls=(_tool_call(rest.strip()),), number=int(ms))


def _ask(name: str, arg: str) -> Step:
    model = ""
    if arg.startswith("model="):
        first, _, arg = arg.partition(" ")
        model = first.removeprefix("model=")
    if not arg.strip():
        raise ScriptError("/ask needs a question, e.g. /ask model=gpt-4o What is 6 times 7?")
    arguments: dict[str, Any] = {"prompt": arg.strip(), **({"model": model} if model else {})}
    return Step(name, calls=(("editor_model", arguments),))


def _permission_request(text: str) -> tuple[str, str]:
    kind = "execute"
    if text.startswith("kind="):
        first, _, text = text.partition(" ")
        kind = first.removeprefix("kind=")
        if kind not in TOOL_KINDS:
            raise ScriptError(f"/permission kind must be one of {', '.join(TOOL_KINDS)}")
    if not text.strip():
        raise ScriptError("/permission needs a title")
    return text.strip(), kind


def _permission(name: str, arg: str) -> Step:
    return Step(name, calls=(_permission_request(arg),))


def _permissions(name: str, arg: str) -> Step:
    return Step(name, calls=tuple(_permission_request(part.strip()) for part in arg.split("|")))


def _stop(name: str, arg: str) -> Step:
    if arg not in FINAL_STOP_REASONS:
        raise ScriptError(f"/stop needs one of {', '.join(FINAL_STOP_REASONS)}")
    return Step(name, arg)


def _variable(name: str, arg: str) -> Step:
    if not arg:
        raise ScriptError(f"/{name} needs a variable name")
    return Step(name, arg)


def _usage(name: str, arg: str) -> Step:
    words = arg.split()
    if len(words) not in (2, 4) or not words[0].isdigit() or not words[1].isdigit():
        raise ScriptError(f"/{name} needs USED SIZE [AMOUNT CURRENCY], e.g. /{name} 1200 200000 0.05 USD")
    cost = None
    if len(words) == 4:
        try:
            cost = {"amount": float(words[2]), "currency": words[3]}
        except ValueError:
            raise ScriptError(f"/{name}: the cost amount must be a number, got {words[2]!r}") from None
    return Step(name, calls=(("used", int(words[0])), ("size", int(words[1])), ("cost", cost)))


_FIELD_TYPES = ("string", "integer", "number", "boolean")


def _elicit(name: str, arg: str) -> Step:
    """``FIELD:TYPE ... | MESSAGE``: TYPE is string, integer, number, boolean or values a/b/c."""
    fields_text, bar, message = arg.partition("|")
    fields = []
    for word in fields_text.split():
        field, colon, kind = word.partition(":")
        if not colon or not field or not kind:
            raise ScriptError(f"/{name}: {word!r} is not FIELD:TYPE")
        if kind not in _FIELD_TYPES and "/" not in kind:
            raise ScriptError(f"/{name}: {field}'s type is {', '.join(_FIELD_TYPES)} or values a/b/c, not {kind!r}")
        fields.append((field, kind))
    if not bar or not fields or not message.strip():
        raise ScriptError(f"/{name} needs FIELD:TYPE ... | MESSAGE, e.g. /{name} name:string age:integer | Who?")
    return Step(name, message.strip(), calls=tuple(fields))


def _visit(name: str, arg: str) -> Step:
    url, _, message = arg.partition(" ")
    if not url.startswith(("http://", "https://")) or not message.strip():
        raise ScriptError(f"/{name} needs URL MESSAGE, e.g. /{name} https://example.com Sign in there")
    return Step(name, message.strip(), calls=((url, None),))


def _badstop(name: str, arg: str) -> Step:
    return Step(name, arg or "finished")


# -- the table ---------------------------------------------------------------------------------------------------

DIRECTIVES: dict[str, Directive] = {
    d.name: d
    for d in (
        Directive("say", "TEXT", "stream TEXT (and a newline) in several chunks", _text),
        Directive("stream", "N", 'N numbered chunks ("1 2 3 ...")', _number),
        Directive("think", "TEXT", "a thought chunk", _text),
        Directive("plan", "A; B; C", "a plan update", _plan),
        Directive("run", "TITLE", "an agent-internal tool call: pending → in_progress → completed", _text),
        Directive("tool", "NAME {json}", "call NAME on the client's MCP server, then say the result", _tool),
        Directive("tools", "N {j} | M {j}", "the same, several calls in parallel", _tools),
        Directive(
            "toolwait",
            "MS NAME {j}",
            "call NAME but give up after MS (the MCP client sends notifications/cancelled)",
            _toolwait,
        ),
        Directive(
            "ask",
            "[model=ID] QUESTION",
            "ask a model of the editor (lmbridge's editor_model tool, with progress), then say the answer and how many "
            "progress notes came",
            _ask,
        ),
        Directive(
            "llm",
            "PROMPT",
            'ask the agent\'s own model (the one lmbridge gives it with model_source = "editor"), streaming its answer',
            _text,
        ),
        Directive(
            "permission",
            "[kind=K] T",
            "ask permission for T (options allow-once, allow-always, reject-once; K "
            "an ACP tool kind, default execute), then say the outcome",
            _permission,
        ),
        Directive("permissions", "T1 | T2", "several permission requests at once", _permissions),
        Directive("sleep", "MS", "wait (cancellable)", _number),
        Directive(
            "barrier",
            "NAME N",
            "wait until N prompts (of any session of this agent process) have reached /barrier NAME (cancellable): "
            "proves they run at the same time",
            _barrier,
        ),
        Directive(
            "later", "MS TEXT", "MS after this turn's response is sent, send TEXT as an out-of-turn update", _later
        ),
        Directive("flush", "", "wait until every /later update of this session has been sent", _nothing),
        Directive("recall", "", "say the texts of the earlier prompts of this session", _nothing),
        Directive("env", "NAME", 'say the value of an environment variable of the agent (or "(unset)")', _variable),
        Directive("stop", "REASON", f"end the turn with this stopReason ({', '.join(FINAL_STOP_REASONS)})", _stop),
        Directive(
            "options", "", "say the session option values (model, mode, effort, verbose; set_config_option)", _nothing
        ),
        Directive(
            "usage",
            "USED SIZE [AMOUNT CUR]",
            "a usage_update: USED of SIZE context tokens, the session's cost so far; the answer reports tokens",
            _usage,
        ),
        Directive(
            "elicit",
            "F:TYPE ... | MSG",
            "ask the user to fill in a form (elicitation; TYPE string, integer, number, boolean or values a/b/c), "
            "then say the answer",
            _elicit,
        ),
        Directive("visit", "URL MSG", "ask the user to visit a page (URL elicitation), then say the answer", _visit),
        Directive("crash", "", "exit abruptly, mid-turn", _nothing),
        Directive("help", "", "say this table", _nothing),
        Directive(
            "badstop",
            "[REASON]",
            'end the turn with a stopReason ACP does not have (default "finished")',
            _badstop,
            misbehaviour=True,
        ),
        Directive(
            "ignorecancel",
            "",
            'from here on this turn ignores session/cancel (and ends normally, not "cancelled")',
            _nothing,
            misbehaviour=True,
        ),
        Directive(
            "orphan",
            "TITLE",
            "an agent-internal tool call that starts (pending → in_progress) and never ends",
            _title,
            misbehaviour=True,
        ),
        Directive(
            "straycall", "", "a tool_call_update for a toolCallId that was never announced", _nothing, misbehaviour=True
        ),
        Directive(
            "badupdate",
            "",
            "a session/update that violates the schema (a text chunk without its text)",
            _nothing,
            misbehaviour=True,
        ),
    )
}


def reference() -> str:
    """The table as text: one line per directive, the misbehaviours last."""
    rows = sorted(DIRECTIVES.values(), key=lambda d: d.misbehaviour)
    usage = [f"/{d.name} {d.syntax}".rstrip() for d in rows]
    width = max(map(len, usage))
    lines = []
    headed = False
    for directive, text in zip(rows, usage, strict=True):
        if directive.misbehaviour and not headed:
            lines.append("misbehaviours (for testing ACP test tools; `lmbridge test` catches each one):")
            headed = True
        lines.append(f"{text.ljust(width)}  {directive.does}")
    return "\n".join(lines)


# -- the parser --------------------------------------------------------------------------------------------------

_DIRECTIVE_LINE = re.compile(r"^/([a-z]+)\b\s*(.*)$", re.DOTALL)


def parse_script(text: str) -> list[Step]:
    """Directives and echo paragraphs of one prompt, in order."""
    steps: list[Step] = []
    paragraph: list[str] = []

    def flush() -> None:
        if paragraph:
            body = "\n".join(paragraph).strip()
            if body:
                steps.append(Step("echo", body))
            paragraph.clear()

    for line in text.splitlines():
        match = _DIRECTIVE_LINE.match(line.strip())
        if not match:
            paragraph.append(line)
            continue
        flush()
        name, arg = match.group(1), match.group(2).strip()
        directive = DIRECTIVES.get(name)
        if directive is None:
            raise ScriptError(f"unknown directive /{name} (/help lists them)")
        steps.append(directive.read(name, arg))
    flush()
    return steps
