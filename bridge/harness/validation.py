"""ACP messages against the schema: the official SDK's pydantic models (``acp.schema``) always, and the official
JSON schema (``schema.json`` of the ACP spec, Draft 2020-12, with ``jsonschema``) when one is given.

Owns turning validation errors into one readable line each (``update.content.text: Field required``). The SDK's
models are lenient where the spec says ``x-deserialize-default-on-error``: an invalid tool-call status or plan entry
is silently replaced by a default. So a message that validates is also dumped again and compared with what was
sent: a value the SDK had to replace is reported as invalid ("the SDK would read it as None").
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from typing import Any

__all__ = ["MODELS", "JsonSchema", "load_json_schema", "validate"]

# What the harness validates, by JSON schema definition name → the SDK model of the same name.
MODELS = (
    "SessionNotification",
    "RequestPermissionRequest",
    "InitializeResponse",
    "NewSessionResponse",
    "LoadSessionResponse",
    "ResumeSessionResponse",
    "PromptResponse",
)


def validate(definition: str, value: Any, schema: JsonSchema | None = None) -> list[str]:
    """Problems with ``value`` as an ACP ``definition`` (e.g. ``SessionNotification``); empty when valid."""
    problems = _validate_model(definition, value)
    if not problems and schema is not None:  # (when both object, the model's words suffice)
        problems = schema.validate(definition, value)
    return problems


def _validate_model(definition: str, value: Any) -> list[str]:
    import acp.schema
    from pydantic import ValidationError

    model = getattr(acp.schema, definition)
    try:
        parsed = model.model_validate(value)
    except ValidationError as exc:
        return [_pydantic_line(dict(error), value) for error in exc.errors()[:5]]
    dumped = parsed.model_dump(mode="json", by_alias=True, exclude_unset=True)
    problems: list[str] = []
    _compare(value, dumped, "", problems)
    return problems


def _pydantic_line(error: dict[str, Any], value: Any) -> str:
    # The location names union members (``update.agent_message_chunk.content.text.text``); keep the parts that
    # are keys or indexes of the message itself (``update.content.text``).
    parts: list[str] = []
    current = value
    skipped: Any = None
    for part in error.get("loc", ()):
        if isinstance(current, dict) and current is not skipped and _is_tag(current, part):
            skipped = current  # pydantic's name for the union member, at most once per object
            continue
        if (isinstance(current, dict) and part in current) or (
            isinstance(current, list) and isinstance(part, int) and part < len(current)
        ):
            current = current[part]
        else:
            current = None
        parts.append(str(part))
    path = ".".join(parts)
    shown = json.dumps(error.get("input"), ensure_ascii=False, default=str)
    if len(shown) > 120:
        shown = shown[:117] + "..."
    return f"{path or '(message)'}: {error.get('msg')} (got {shown})"


def _is_tag(value: dict[str, Any], part: Any) -> bool:
    """Whether ``part`` is the name pydantic gives the union member ``value`` was tried as."""
    if not isinstance(part, str):
        return False
    return part in (value.get("sessionUpdate"), value.get("type"), value.get("outcome")) or "[" in part


def _compare(sent: Any, read: Any, path: str, problems: list[str]) -> None:
    """Values the SDK replaced while reading ``sent`` (its default-on-error fields)."""
    if len(problems) >= 5:
        return
    if isinstance(sent, dict):
        if not isinstance(read, dict):
            problems.append(
                f"{path or '(message)'}: {_short(sent)} is not valid here (the SDK would read it as {_short(read)})"
            )
            return
        for key, value in sent.items():
            if value is None or key not in read:  # unknown keys are allowed (extensibility)
                continue
            _compare(value, read[key], f"{path}.{key}" if path else key, problems)
    elif isinstance(sent, list):
        if not isinstance(read, list) or len(read) != len(sent):
            count = len(read) if isinstance(read, list) else 0
            problems.append(
                f"{path}: {len(sent) - count} of its {len(sent)} items are invalid (the SDK would drop them)"
            )
            return
        for index, (a, b) in enumerate(zip(sent, read, strict=True)):
            _compare(a, b, f"{path}.{index}", problems)
    else:
        numbers = (
            isinstance(sent, (int, float))
            and isinstance(read, (int, float))
            and not isinstance(sent, bool)
            and not isinstance(read, bool)
        )
        if sent != read or (not numbers and type(sent) is not type(read)):
            problems.append(f"{path}: {_short(sent)} is not a valid value (the SDK would read it as {_short(read)})")


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


class JsonSchema:
    """The ACP JSON schema (``schema.json``), validating values against its ``$defs``."""

    def __init__(self, document: dict[str, Any], path: str = "") -> None:
        self.path = path
        self._defs = document.get("$defs") or {}
        self._validators: dict[str, Any] = {}
        branches = (self._defs.get("SessionUpdate") or {}).get("oneOf") or []
        self._update_branches = {b.get("properties", {}).get("sessionUpdate", {}).get("const"): b for b in branches}

    def _validator(self, key: str, schema: dict[str, Any]) -> Any:
        validator = self._validators.get(key)
        if validator is None:
            import jsonschema

            validator = self._validators[key] = jsonschema.Draft202012Validator({**schema, "$defs": self._defs})
        return validator

    def validate(self, definition: str, value: Any) -> list[str]:
        if definition not in self._defs:
            return []
        errors = list(self._validator(definition, {"$ref": f"#/$defs/{definition}"}).iter_errors(value))
        if not errors:
            return []
        if definition == "SessionNotification" and isinstance(value, dict) and isinstance(value.get("update"), dict):
            # Validate against the branch the discriminator names, for errors about that branch only.
            kind = value["update"].get("sessionUpdate")
            branch = self._update_branches.get(kind)
            if branch is None:
                known = ", ".join(k for k in self._update_branches if k)
                return [f"update.sessionUpdate: {kind!r} is not an ACP update kind (schema: {known})"]
            branch_errors = list(self._validator(f"update:{kind}", branch).iter_errors(value["update"]))
            if branch_errors:
                return [_describe(e, "update") for e in branch_errors[:5]]
        return [_describe(e, "") for e in errors[:5]]


def _describe(error: Any, prefix: str) -> str:
    from jsonschema.exceptions import best_match

    while error.context:
        groups: dict[Any, list[Any]] = {}
        for sub in error.context:
            groups.setdefault(sub.relative_schema_path[0] if sub.relative_schema_path else None, []).append(sub)
        # Alternatives whose discriminator (a const) does not match are not what the sender meant.
        plausible = [g for g in groups.values() if not any(e.validator == "const" and e.relative_path for e in g)]
        if len(plausible) == 1:
            error = best_match(plausible[0])
            continue
        break
    path = ".".join(str(p) for p in [*([prefix] if prefix else []), *error.absolute_path])
    if error.validator in ("oneOf", "anyOf"):
        allowed = _consts(error)
        if allowed:
            return f"{path}: {_short(error.instance)} is not one of {', '.join(_short(a) for a in allowed)}"
    return f"{path or '(message)'}: {error.message if len(error.message) < 200 else error.message[:197] + '...'}"


def _consts(error: Any) -> list[Any]:
    found: list[Any] = []
    stack = list(error.context or ())
    while stack:
        sub = stack.pop(0)
        if sub.validator == "const":
            found.append(sub.validator_value)
        elif sub.validator == "type" and sub.validator_value == "null":
            found.append(None)
        stack.extend(sub.context or ())
    return found


def load_json_schema(path: str | None) -> JsonSchema | None:
    """The JSON schema at ``path`` (or ``$LMBRIDGE_ACP_SCHEMA``), or None when neither is given."""
    path = path or os.environ.get("LMBRIDGE_ACP_SCHEMA")
    if not path:
        return None
    return _load(os.path.abspath(path))


@lru_cache(maxsize=4)
def _load(path: str) -> JsonSchema:
    with open(path, encoding="utf-8") as handle:
        return JsonSchema(json.load(handle), path)
