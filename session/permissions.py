"""Permission bridging, sans-IO: ACP ``session/request_permission`` ↔ a ``tool_call`` of the editor's permission
tool.

Owns the policy (``ask``, ``allow_reads``, ``allow_all``, ``deny``), the permission tool's input (what a person needs
to decide), and reading the editor's answer back into an ACP outcome: an offered ``optionId``; or words — allow /
approve / yes → allow_once, always → allow_always, reject / deny / no → reject_once, VS Code's "The user chose to
skip the tool call" → reject_once; anything unreadable → reject_once.

Requests that concern the editor's own bridged tools are allowed once without asking: the editor confirms those
itself when it runs them (``session.bridged`` recognises them).

An agent's question (ACP ``elicitation/create``, ``session.elicitation``) takes the same path with kind
``elicitation``: asked only under the ``ask`` policy with the tool offered, declined otherwise; a form's answer is
a JSON object, kept for the elicitation's response.

For clients that cannot show a permission tool (an HTTP client that did not offer it), ``PermissionQuestions``
turns the permission tool's call into a plain-text question that ends the response, and reads the user's next
message (``allow``, ``always``, ``reject``, ``never`` or an option's number) back into the tool's result, so the
session sees exactly what it would have seen from an editor.
"""

from __future__ import annotations

import re
import secrets
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .bridged import is_bridged_tool
from .elicitation import is_elicitation, read_form_answer
from .messages import object_at, string_at

__all__ = [
    "DEFAULT_PERMISSION_TOOL",
    "READ_KINDS",
    "PermissionDecision",
    "PermissionPolicy",
    "PermissionQuestions",
    "cancelled_outcome",
    "permission_tool_schema",
    "question_text",
    "reply_option",
]

DEFAULT_PERMISSION_TOOL = "acp_agent_action"
READ_KINDS = frozenset({"read", "search", "fetch", "think"})

_ALWAYS = re.compile(r"\balways\b")
_ALLOW = re.compile(
    r"\b(allow|allowed|approve|approved|accept|accepted|yes|ok|okay|proceed|continue|confirm|confirmed)\b"
)
_REJECT = re.compile(
    r"\b(reject|rejected|deny|denied|no|not|never|don't|dont|decline|declined|refuse|refused|cancel|"
    r"cancelled|skip|skipped|abort)\b"
)
_SKIPPED = "the user chose to skip the tool call"


TITLE_KEPT = 200  # characters of an action's title a decision keeps: which action, not all it would do


@dataclass(frozen=True, slots=True)
class PermissionDecision:
    """A permission request answered, as an audit log keeps it: which agent's session, whose conversation (a
    principal id), what was asked (the tool call's title and kind), what was chosen (the option's kind:
    ``allow_once``, ``reject_always``, ...; or ``cancelled``) and who chose: ``client`` (the editor or HTTP client,
    that is the person), ``policy`` (the permission policy), ``lmbridge`` (withdrawn: the turn was cancelled or the
    session closed)."""

    agent: str
    principal: str
    session: str
    title: str = ""
    kind: str = ""
    decision: str = ""
    decided_by: str = ""

    @classmethod
    def about(cls, agent: str, principal: str, session: str) -> PermissionDecision:
        return cls(agent, principal, session)

    def of(self, params: dict[str, Any], outcome: dict[str, Any], decided_by: str) -> PermissionDecision:
        tool_call = object_at(params, "toolCall")
        chosen = object_at(outcome, "outcome")
        decision = "cancelled"
        if chosen.get("outcome") == "selected":
            kinds = {option["optionId"]: option.get("kind") for option in _options(params)}
            decision = str(kinds.get(chosen.get("optionId")) or chosen.get("optionId") or "selected")
        title = string_at(tool_call, "title")[:TITLE_KEPT]
        kind = string_at(tool_call, "kind", "other")
        return replace(self, title=title, kind=kind, decision=decision, decided_by=decided_by)


def cancelled_outcome() -> dict[str, Any]:
    return {"outcome": {"outcome": "cancelled"}}


def _selected(option_id: str) -> dict[str, Any]:
    return {"outcome": {"outcome": "selected", "optionId": option_id}}


def permission_tool_schema(name: str = DEFAULT_PERMISSION_TOOL) -> dict[str, Any]:
    """The tool an editor registers so the agent's permission requests reach its confirmation UI."""
    return {
        "name": name,
        "description": (
            "Asks the user to approve an action the coding agent wants to take (run a command, edit files, ...). "
            "Show the title, kind, command or paths and the options; answer with the chosen optionId, or with "
            "'allow', 'always' or 'reject'."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {
                "title": {"type": "string", "description": "What the agent wants to do."},
                "kind": {
                    "type": "string",
                    "description": (
                        "read, edit, delete, move, search, execute, think, fetch, switch_mode or other; elicitation: "
                        "the agent asks for input (details.form: a JSON Schema to fill in, answer with a JSON "
                        "object; details.url: a page to visit)."
                    ),
                },
                "command": {"type": "string", "description": "The command line, for execute actions."},
                "paths": {"type": "array", "items": {"type": "string"}, "description": "Files concerned."},
                "details": {"type": "object", "description": "The agent's raw input for the action."},
                "options": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "optionId": {"type": "string"},
                            "name": {"type": "string"},
                            "kind": {"type": "string"},
                        },
                        "required": ["optionId", "name", "kind"],
                    },
                },
            },
            "required": ["title", "options"],
        },
    }


@dataclass(frozen=True, slots=True)
class PermissionPolicy:
    policy: str = "ask"
    tool_name: str = DEFAULT_PERMISSION_TOOL
    server_name: str = "editor"  # the synthetic MCP server's name in session/new

    def automatic(self, params: dict[str, Any], *, tool_offered: bool) -> dict[str, Any] | None:
        """The outcome to answer without asking the editor, or None to ask."""
        options = _options(params)
        tool_call = object_at(params, "toolCall")
        if is_elicitation(params):  # a question only a person can answer: asked, or declined
            return None if self.policy == "ask" and tool_offered else _choose(options, "reject_once")
        if is_bridged_tool(tool_call, self.server_name):
            return _choose(options, "allow_once")
        if self.policy == "allow_all":
            return _choose(options, "allow_once")
        if self.policy == "deny":
            return _choose(options, "reject_once")
        if self.policy == "allow_reads" and tool_call.get("kind") in READ_KINDS:
            return _choose(options, "allow_once")
        if not tool_offered:
            return _choose(options, "reject_once")
        return None

    def tool_input(self, params: dict[str, Any]) -> dict[str, Any]:
        """The permission tool's input: what a person needs to decide."""
        tool_call = object_at(params, "toolCall")
        raw_input = tool_call.get("rawInput")
        title = string_at(tool_call, "title") or "The agent asks for permission"
        value: dict[str, Any] = {"title": title, "kind": tool_call.get("kind") or "other"}
        command = _command(raw_input)
        if command:
            value["command"] = command
        paths = _paths(tool_call, raw_input)
        if paths:
            value["paths"] = paths
        if isinstance(raw_input, dict) and raw_input:
            value["details"] = raw_input
        value["options"] = [
            {"optionId": o["optionId"], "name": o.get("name", o["optionId"]), "kind": o.get("kind", "")}
            for o in _options(params)
        ]
        return value

    def outcome_for_result(self, params: dict[str, Any], result: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Read the editor's tool result. Returns the outcome and whether the answer was understood."""
        options = _options(params)
        text = "".join(p.get("value", "") for p in result.get("content", ()) if p.get("type") == "text").strip()
        if is_elicitation(params):
            outcome, understood = _question_outcome(options, text, result)
            return {**outcome, "answer": text}, understood
        return self._option_for(options, text, result)

    @staticmethod
    def _option_for(options: list[dict[str, Any]], text: str, result: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        for option in options:
            if text == option["optionId"]:
                return _selected(option["optionId"]), True
        lowered = text.lower()
        if result.get("isError") or _SKIPPED in lowered:
            return _choose(options, "reject_once"), True
        for option in options:  # the option's display name, e.g. "Allow always"
            if lowered == str(option.get("name", "")).lower():
                return _selected(option["optionId"]), True
        if _REJECT.search(lowered):
            return _choose(options, "reject_once"), True
        if _ALWAYS.search(lowered):
            return _choose(options, "allow_always"), True
        if _ALLOW.search(lowered):
            return _choose(options, "allow_once"), True
        return _choose(options, "reject_once"), False


def _question_outcome(options: list[dict[str, Any]], text: str, result: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """An answer to an agent's question: an option (its id or name), a form's JSON object, or words. A generic "yes"
    chooses only when there is one thing to say yes to ("Done", "Submit"): it never picks one of a form's values."""
    lowered = text.lower()
    for option in options:
        if text == option["optionId"] or lowered == str(option.get("name", "")).lower():
            return _selected(option["optionId"]), True
    if read_form_answer(text) is not None and any(o["optionId"] == "accept" for o in options):
        return _selected("accept"), True
    if result.get("isError") or _SKIPPED in lowered or _REJECT.search(lowered):
        return _choose(options, "reject_once"), True
    accepting = [o for o in options if o.get("kind") == "allow_once"]
    if _ALLOW.search(lowered) and len(accepting) == 1:
        return _selected(accepting[0]["optionId"]), True
    return _choose(options, "reject_once"), False


def _options(params: dict[str, Any]) -> list[dict[str, Any]]:
    options = params.get("options")
    if not isinstance(options, list):
        return []
    return [o for o in options if isinstance(o, dict) and isinstance(o.get("optionId"), str)]


_FALLBACK = {
    "allow_always": ("allow_always", "allow_once"),
    "allow_once": ("allow_once", "allow_always"),
    "reject_once": ("reject_once", "reject_always"),
    "reject_always": ("reject_always", "reject_once"),
}


def _choose(options: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The first offered option of ``kind`` (or its nearest kind). With none, ``cancelled``: the only outcome that
    needs no option (agents treat it as a refusal)."""
    for wanted in _FALLBACK.get(kind, (kind,)):
        for option in options:
            if option.get("kind") == wanted:
                return _selected(option["optionId"])
    return cancelled_outcome()


def _command(raw_input: Any) -> str | None:
    if not isinstance(raw_input, dict):
        return None
    for key in ("command", "cmd"):
        value = raw_input.get(key)
        if isinstance(value, str) and value:
            return value
        if isinstance(value, list) and all(isinstance(v, str) for v in value) and value:
            return " ".join(value)
    return None


def _paths(tool_call: dict[str, Any], raw_input: Any) -> list[str]:
    paths: list[str] = []
    locations = tool_call.get("locations")
    if isinstance(locations, list):
        paths += [loc["path"] for loc in locations if isinstance(loc, dict) and isinstance(loc.get("path"), str)]
    if isinstance(raw_input, dict):
        for key in ("path", "file_path", "filePath", "abs_path", "absolute_path", "notebook_path"):
            value = raw_input.get(key)
            if isinstance(value, str) and value not in paths:
                paths.append(value)
        for key in ("paths", "files"):
            value = raw_input.get(key)
            if isinstance(value, list):
                paths += [v for v in value if isinstance(v, str) and v not in paths]
    return paths


# -- permission requests asked in words ---------------------------------------------------------------------------

# The word that answers each option kind, shown beside the option.
_KIND_WORDS = {"allow_once": "allow", "allow_always": "always", "reject_once": "reject", "reject_always": "never"}
_WORD_KINDS = {
    **{word: kind for kind, word in _KIND_WORDS.items()},
    "yes": "allow_once",
    "y": "allow_once",
    "ok": "allow_once",
    "approve": "allow_once",
    "no": "reject_once",
    "n": "reject_once",
    "deny": "reject_once",
}
_QUESTION_REF = re.compile(r"\[permission ([0-9a-f]{8})\]\s*$")
_MAX_REPLY_WORDS = 4  # a longer reply is the user saying something else: the question stays unanswered


@dataclass(frozen=True, slots=True)
class _Asked:
    call_id: str
    tool_name: str
    tool_input: dict[str, Any]
    text: str


class PermissionQuestions:
    """Permission requests asked as text, and the answers read back. The question ends with a reference
    (``[permission 1a2b3c4d]``) that finds the request again when the client sends the conversation back; the
    ``limit`` newest questions are remembered."""

    def __init__(self, limit: int = 4096) -> None:
        self._asked: OrderedDict[str, _Asked] = OrderedDict()
        self._limit = limit

    def ask(self, call: dict[str, Any]) -> str:
        """The question for a ``tool_call`` part of the permission tool."""
        ref = secrets.token_hex(4)
        while ref in self._asked:
            ref = secrets.token_hex(4)
        tool_input = object_at(call, "input")
        text = question_text(tool_input, ref)
        self._asked[ref] = _Asked(call["callId"], call["name"], tool_input, text)
        while len(self._asked) > self._limit:
            self._asked.popitem(last=False)
        return text

    def restore(self, messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """The conversation as the session knows it: each assistant message that ends with a question asked here
        gets its permission tool call back, and a user reply that answers it becomes the call's result. Messages
        are the editor protocol's (``role``, ``content`` as a list of parts); unchanged ones are passed through."""
        out: list[Mapping[str, Any]] = []
        answered: _Asked | None = None
        for message in messages:
            if answered is not None:
                reply = _reply_text(message)
                option = reply_option(reply, answered.tool_input.get("options")) if reply is not None else None
                if option is None and reply is not None and answered.tool_input.get("kind") == "elicitation":
                    option = reply if read_form_answer(reply) is not None else None  # a form's answer, as given
                if option is not None:
                    result = {"type": "tool_result", "callId": answered.call_id, "content": [_text(option)]}
                    out.append({**message, "content": [result]})
                    answered = None
                    continue
            answered = None
            asked = self._asked_in(message)
            if asked is None:
                out.append(message)
                continue
            parts = [p for p in message["content"] if p.get("type") != "text"]
            text = "".join(p["value"] for p in message["content"] if p.get("type") == "text")
            before = text[: text.rfind(asked.text)]
            call = {"type": "tool_call", "callId": asked.call_id, "name": asked.tool_name, "input": asked.tool_input}
            out.append({**message, "content": ([_text(before)] if before.strip() else []) + parts + [call]})
            answered = asked
        return out

    def _asked_in(self, message: Mapping[str, Any]) -> _Asked | None:
        if message.get("role") != "assistant" or not isinstance(message.get("content"), list):
            return None
        texts = [p for p in message["content"] if isinstance(p, dict) and p.get("type") == "text"]
        if not texts:
            return None
        found = _QUESTION_REF.search(str(texts[-1].get("value", ""))[-64:])  # the reference ends the question
        asked = self._asked.get(found.group(1)) if found else None
        if asked is None or asked.text not in "".join(p.get("value", "") for p in texts):
            return None
        return asked


def question_text(tool_input: dict[str, Any], ref: str) -> str:
    """A permission request in words: what the agent wants to do, the choices and how to answer."""
    if tool_input.get("kind") == "elicitation":
        return _question_in_words(tool_input, ref)
    lines = [f"The agent asks for permission: {tool_input.get('title') or 'an action'}"]
    if tool_input.get("command"):
        lines.append(f"  command: {tool_input['command']}")
    paths = tool_input.get("paths")
    if isinstance(paths, list) and paths:
        lines.append(f"  files: {', '.join(str(p) for p in paths[:10])}" + (" …" if len(paths) > 10 else ""))
    options = tool_input.get("options")
    options = [o for o in options if isinstance(o, dict)] if isinstance(options, list) else []
    lines.append("Answer with a number or a word:")
    for number, option in enumerate(options, 1):
        word = _KIND_WORDS.get(str(option.get("kind")))
        lines.append(f"  {number}. {option.get('name') or option.get('optionId')}" + (f" ({word})" if word else ""))
    lines.append(f"[permission {ref}]")
    return "\n".join(lines)


def _question_in_words(tool_input: dict[str, Any], ref: str) -> str:
    """An agent's question (elicitation) in words: a form's fields, or the page to visit; the choices."""
    lines = [f"The agent asks: {tool_input.get('title') or 'for your input'}"]
    details = object_at(tool_input, "details")
    form = details.get("form") if isinstance(details.get("form"), dict) else None
    options = [o for o in tool_input.get("options") or () if isinstance(o, dict)]
    if form is not None and any(o.get("optionId") == "accept" for o in options):
        properties = form.get("properties") if isinstance(form.get("properties"), dict) else {}
        required = form.get("required") if isinstance(form.get("required"), list) else []
        for name, spec in properties.items():
            spec = spec if isinstance(spec, dict) else {}
            title = str(spec.get("title") or "")
            about = spec.get("description") or (title if title.lower() != str(name).lower() else "")
            kind = spec.get("type", "string")
            lines.append(
                f"  {name} ({kind}{', required' if name in required else ''})" + (f": {about}" if about else "")
            )
        lines.append('Answer with a JSON object of these fields, e.g. {"name": "…"}, or "decline".')
    else:
        lines.append("Answer with a number or a word:")
        for number, option in enumerate(options, 1):
            lines.append(f"  {number}. {option.get('name') or option.get('optionId')}")
    lines.append(f"[permission {ref}]")
    return "\n".join(lines)


def reply_option(reply: str, options: Any) -> str | None:
    """The ``optionId`` a short reply chooses — an option's number, id or name, or a word (allow, always, reject,
    never, yes, no) — or None when the reply is not an answer."""
    if not isinstance(options, list):
        return None
    offered = [o for o in options if isinstance(o, dict) and isinstance(o.get("optionId"), str)]
    text = reply.strip().lower().strip(".!")
    if not text or len(text.split()) > _MAX_REPLY_WORDS:
        return None
    if text.isdigit():
        number = int(text)
        return offered[number - 1]["optionId"] if 1 <= number <= len(offered) else None
    for option in offered:
        if text in (option["optionId"].lower(), str(option.get("name", "")).lower()):
            return str(option["optionId"])
    kind = _WORD_KINDS.get(re.split(r"[\s,.;:!]+", text)[0])
    if kind is None:
        return None
    outcome = _choose(offered, kind)["outcome"]
    return outcome.get("optionId") if isinstance(outcome.get("optionId"), str) else None


def _reply_text(message: Mapping[str, Any]) -> str | None:
    """The text of a user message made of text only, else None."""
    content = message.get("content")
    if message.get("role") != "user" or not isinstance(content, list) or not content:
        return None
    if any(not isinstance(p, dict) or p.get("type") != "text" for p in content):
        return None
    return "".join(str(p.get("value", "")) for p in content)


def _text(value: str) -> dict[str, Any]:
    return {"type": "text", "value": value}
