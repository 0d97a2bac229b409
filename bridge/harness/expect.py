"""A turn's expectations against what came: streamed text, thinking, stop reason, errors, editor tool calls,
permission requests, rounds, and the sequence of ACP updates the agent sent.

Owns ``Failure`` (what was expected, what came, and where: file, turn, expectation) and the matching rules of
update expectations: an update is named by its ``sessionUpdate`` kind, tool calls by ``kind:status``
(``tool_call:pending``, ``tool_call_update:completed``); a name without a status matches any status; consecutive
repeats collapse (twenty ``agent_message_chunk`` updates are one).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .driver import TurnResult
from .scenario import Expect, Turn
from .traces import update_kind, update_label

__all__ = ["Failure", "check_turn", "collapsed_labels", "label_matches", "tool_call_histories"]


@dataclass
class Failure:
    file: str
    where: str  # "turn 2 (/say hello)", "conformance"
    what: str  # the expectation or check: "expect.text", "check cancel"
    expected: str
    got: str

    def message(self) -> str:
        return f"{self.file}: {self.where}: {self.what}: expected {self.expected}; got {self.got}"

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "where": self.where,
            "what": self.what,
            "expected": self.expected,
            "got": self.got,
            "message": self.message(),
        }


def show(value: Any, limit: int = 300) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def collapsed_labels(result: TurnResult) -> list[str]:
    labels: list[str] = []
    for event in result.updates:
        label = update_label(event.params)
        if not labels or labels[-1] != label:
            labels.append(label)
    return labels


def label_matches(expected: str, label: str) -> bool:
    return label == expected or (":" not in expected and label.split(":", 1)[0] == expected)


def tool_call_histories(result: TurnResult) -> dict[str, list[str]]:
    """toolCallId → the statuses it went through (repeats collapsed), for tool calls started in this turn."""
    histories: dict[str, list[str]] = {}
    for event in result.updates:
        update = (event.params or {}).get("update") if isinstance(event.params, dict) else None
        if not isinstance(update, dict):
            continue
        kind = update_kind(event.params)
        call_id = str(update.get("toolCallId"))
        if kind == "tool_call":
            histories[call_id] = [update.get("status") or "pending"]
        elif (
            kind == "tool_call_update"
            and call_id in histories
            and isinstance(update.get("status"), str)
            and histories[call_id][-1] != update["status"]
        ):
            histories[call_id].append(update["status"])
    return histories


def _contains(given: Any, wanted: dict[str, Any] | None) -> bool:
    if wanted is None:
        return True
    return isinstance(given, dict) and all(given.get(k) == v for k, v in wanted.items())


def check_turn(file: str, turn: Turn, result: TurnResult) -> list[Failure]:
    expect: Expect = turn.expect
    failures: list[Failure] = []

    def fail(what: str, expected: str, got: str) -> None:
        failures.append(Failure(file, turn.label, what, expected, got))

    if result.timeout is not None:
        fail(f"timeout ({result.timeout.phase})", result.timeout.expected, result.timeout.message)
        return failures  # what came is partial; more failures would only repeat this one
    if result.problem is not None:
        fail("tool rounds", f"at most {turn.max_rounds} rounds", result.problem)
    error = result.error
    if expect.error:
        if error is None:
            fail(
                "expect.error",
                "an error"
                + (f" {expect.error_code}" if expect.error_code is not None else "")
                + (f" containing {expect.error_contains!r}" if expect.error_contains else ""),
                f"no error (stopReason {result.stop_reason!r})",
            )
        else:
            if expect.error_code is not None and error.get("code") != expect.error_code:
                fail("expect.error", f"error code {expect.error_code}", f"{error.get('code')}: {error.get('message')}")
            if expect.error_contains and expect.error_contains not in str(error.get("message")):
                fail(
                    "expect.error",
                    f"an error message containing {expect.error_contains!r}",
                    f"{error.get('code')}: {error.get('message')}",
                )
    elif error is not None:
        fail("no error", "the turn to end without an error", f"error {error.get('code')}: {error.get('message')}")
    text = result.text
    if expect.text is not None and text != expect.text:
        fail("expect.text", f"the text {show(expect.text)}", show(text))
    for piece in expect.text_contains:
        if piece not in text:
            fail("expect.text_contains", f"the text to contain {show(piece)}", show(text))
    for piece in expect.text_not_contains:
        if piece in text:
            fail("expect.text_not_contains", f"the text not to contain {show(piece)}", show(text))
    for pattern in expect.text_matches:
        if not re.search(pattern, text):
            fail("expect.text_matches", f"the text to match /{pattern}/", show(text))
    for piece in expect.thinking_contains:
        if piece not in result.thinking:
            fail(
                "expect.thinking_contains",
                f"the thinking to contain {show(piece)} (is [editor] thinking on?)",
                show(result.thinking),
            )
    if expect.stop_reason and result.stop_reason not in expect.stop_reason:
        fail(
            "expect.stop_reason",
            " or ".join(repr(s) for s in expect.stop_reason),
            repr(result.stop_reason) if error is None else f"no stop reason (error {error.get('code')})",
        )
    if expect.tool_calls is not None:
        # In any order: calls made in parallel reach the editor in no particular order.
        calls = result.tool_calls
        unmatched = list(calls)
        missing = []
        for want in expect.tool_calls:
            found = next(
                (c for c in unmatched if c.get("name") == want.name and _contains(c.get("input"), want.input)), None
            )
            if found is None:
                missing.append(want)
            else:
                unmatched.remove(found)
        if missing or unmatched:
            wanted = [w.name if w.input is None else {"name": w.name, "input": w.input} for w in expect.tool_calls]
            made = [{"name": c.get("name"), "input": c.get("input")} for c in calls]
            fail("expect.tool_calls", f"editor tool calls {show(wanted)} (in any order)", show(made, 600))
    if expect.permissions is not None:
        titles = [p.get("title") for p in result.permissions]
        if sorted(map(str, titles)) != sorted(expect.permissions):
            fail("expect.permissions", f"permission requests {list(expect.permissions)} (in any order)", f"{titles}")
    if expect.rounds is not None and len(result.rounds) != expect.rounds:
        fail("expect.rounds", f"{expect.rounds} lm/chat round(s)", f"{len(result.rounds)}")
    labels = collapsed_labels(result)
    if expect.updates is not None:
        position = 0
        for wanted_label in expect.updates:
            while position < len(labels) and not label_matches(wanted_label, labels[position]):
                position += 1
            if position == len(labels):
                fail(
                    "expect.updates",
                    f"the updates {list(expect.updates)} in this order (others may come between); "
                    f"{wanted_label!r} is missing or out of order",
                    show(labels, 600),
                )
                break
            position += 1
    if expect.updates_exactly is not None:
        wanted_all = list(expect.updates_exactly)
        if len(wanted_all) != len(labels) or not all(
            label_matches(w, g) for w, g in zip(wanted_all, labels, strict=True)
        ):
            fail("expect.updates_exactly", f"exactly the updates {wanted_all}", show(labels, 600))
    for unwanted in expect.no_updates:
        hits = [label for label in labels if label_matches(unwanted, label)]
        if hits:
            fail("expect.no_updates", f"no {unwanted!r} update", show(labels, 600))
    if expect.tool_call_statuses is not None:
        histories = tool_call_histories(result)
        if not histories:
            fail(
                "expect.tool_call_statuses",
                f"agent tool calls going {' → '.join(expect.tool_call_statuses)}",
                "no tool_call update in this turn",
            )
        for call_id, history in histories.items():
            if history != list(expect.tool_call_statuses):
                fail(
                    "expect.tool_call_statuses",
                    f"tool call {call_id} to go {' → '.join(expect.tool_call_statuses)}",
                    " → ".join(history),
                )
    return failures
