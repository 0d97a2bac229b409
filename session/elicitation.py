"""Elicitation bridging, sans-IO: ACP ``elicitation/create`` (unstable; the agent asks the user for input — a form,
or a URL to visit) ↔ the permission path, so that an agent's question reaches the client exactly as a permission
request does (the editor's permission tool, or a question in words for an HTTP client) and is answered under the
same policy.

Owns turning the request into permission-shaped params, and the answer back into an ACP elicitation response:

- a form with one field that takes a few values (an enum, a boolean) → one option per value, and "decline";
- any other form → options "submit" and "decline", the form's schema in the tool's ``details``; the client
  answers with a JSON object, which is read against the schema (``"42"`` becomes ``42`` for an integer field); an
  answer that is not such an object, or lacks a required field, declines;
- a URL → the URL in the title, options "done" and "decline";
- cancelled (the turn was cancelled, or nobody could be asked under an automatic policy) → ``cancel`` /
  ``decline``. Unknown modes are declined without asking.
"""

from __future__ import annotations

import json
from typing import Any

from .messages import object_at, string_at

__all__ = ["ELICITATION", "KIND", "as_permission", "elicitation_answer", "is_elicitation", "read_form_answer"]

ELICITATION = "_lmbridgeElicitation"  # where permission-shaped params keep the original request
KIND = "elicitation"  # the permission tool's ``kind`` for an agent's question
_DECLINE = {"optionId": "decline", "name": "Decline", "kind": "reject_once"}
_MAX_CHOICES = 20


def is_elicitation(params: dict[str, Any]) -> bool:
    return isinstance(params.get(ELICITATION), dict)


def as_permission(params: dict[str, Any]) -> dict[str, Any] | None:
    """The request as ``session/request_permission`` params; None for a mode lmbridge does not know."""
    mode = params.get("mode")
    message = string_at(params, "message") or "The agent asks for your input"
    raw_input: dict[str, Any]
    if mode == "url":
        url = string_at(params, "url")
        title, raw_input = f"{message} — open {url}", {"url": url}
        options = [{"optionId": "accept", "name": "Done", "kind": "allow_once"}, _DECLINE]
    elif mode == "form":
        schema = object_at(params, "requestedSchema")
        title, raw_input = message, {"form": schema}
        single = _single_choice(schema)
        if single is not None:
            options = [{"optionId": value, "name": name, "kind": "allow_once"} for value, name in single[1]]
        else:
            options = [{"optionId": "accept", "name": "Submit", "kind": "allow_once"}]
        options.append(_DECLINE)
    else:
        return None
    tool_call: dict[str, Any] = {
        "toolCallId": f"elicitation:{string_at(params, 'elicitationId')}",
        "title": title,
        "kind": KIND,
        "rawInput": raw_input,
    }
    return {"sessionId": params.get("sessionId"), "toolCall": tool_call, "options": options, ELICITATION: params}


def read_form_answer(text: str) -> dict[str, Any] | None:
    """A client's answer to a form: a JSON object (possibly inside a Markdown code fence), else None."""
    text = text.strip()
    if text.startswith("```"):
        text = text.strip("`").partition("\n")[2]
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def elicitation_answer(params: dict[str, Any], outcome: dict[str, Any]) -> dict[str, Any]:
    """The ACP response for the permission ``outcome`` of ``as_permission(…)`` params (``outcome["answer"]``: the
    client's words, for a free form)."""
    chosen = object_at(outcome, "outcome")
    if chosen.get("outcome") != "selected":
        return {"action": "cancel"}
    option = chosen.get("optionId")
    original = params[ELICITATION]
    if option == "decline":
        return {"action": "decline"}
    if original.get("mode") == "url":
        return {"action": "accept"}
    schema = object_at(original, "requestedSchema")
    single = _single_choice(schema)
    if single is not None:
        field = single[0]
        return {"action": "accept", "content": {field: _typed(object_at(_properties(schema), field), option)}}
    answer = outcome.get("answer")
    content = _content(read_form_answer(answer) if isinstance(answer, str) else None, schema)
    return {"action": "accept", "content": content} if content is not None else {"action": "decline"}


# -- reading the schema --------------------------------------------------------------------------------------------


def _properties(schema: dict[str, Any]) -> dict[str, Any]:
    properties = schema.get("properties")
    return properties if isinstance(properties, dict) else {}


def _single_choice(schema: dict[str, Any]) -> tuple[str, list[tuple[str, str]]] | None:
    """(field, [(value, label)]) when the form is one field taking a few values."""
    properties = _properties(schema)
    if len(properties) != 1:
        return None
    ((field, spec),) = properties.items()
    if not isinstance(spec, dict):
        return None
    if spec.get("type") == "boolean":
        return field, [("true", "Yes"), ("false", "No")]
    if spec.get("type") != "string":
        return None
    choices: list[tuple[str, str]] = []
    if isinstance(spec.get("oneOf"), list):
        for entry in spec["oneOf"]:
            if isinstance(entry, dict) and isinstance(entry.get("const"), str):
                choices.append((entry["const"], str(entry.get("title") or entry["const"])))
    elif isinstance(spec.get("enum"), list):
        given = spec.get("enumNames")
        names: list[Any] = given if isinstance(given, list) else []
        for index, value in enumerate(spec["enum"]):
            if isinstance(value, str):
                name = names[index] if index < len(names) and isinstance(names[index], str) else value
                choices.append((value, name))
    if not choices or len(choices) > _MAX_CHOICES or "decline" in (value for value, _ in choices):
        return None
    return field, choices


def _typed(spec: dict[str, Any], value: Any) -> Any:
    """``value`` as the field's type says, when it reads as one (else unchanged: the agent checks its own form)."""
    kind = spec.get("type")
    try:
        if kind == "boolean" and isinstance(value, str) and value.lower() in ("true", "false", "yes", "no"):
            return value.lower() in ("true", "yes")
        if kind == "integer" and isinstance(value, str | float) and not isinstance(value, bool):
            number = float(value)
            return int(number) if number.is_integer() else value
        if kind == "number" and isinstance(value, str):
            return float(value)
        if kind == "string" and isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        if kind == "array" and isinstance(value, str):
            return [item.strip() for item in value.split(",") if item.strip()]
    except ValueError:
        return value
    return value


def _content(answer: dict[str, Any] | None, schema: dict[str, Any]) -> dict[str, Any] | None:
    if answer is None:
        return None
    properties = _properties(schema)
    content = {key: _typed(object_at(properties, key), value) for key, value in answer.items() if key in properties}
    required = schema.get("required")
    if isinstance(required, list) and any(field not in content for field in required):
        return None
    return content
