"""Checking tool arguments against the editor's JSON Schemas (Draft 2020-12), before the editor sees a call.

Owns one compiled validator per tool, the clear report of a schema that is itself invalid, and the leniency
agents need: arguments the model wrote as a JSON *string* where the schema wants an object or an array are parsed
(Copilot does the same). Problems are reported as a list of lines the model can read and act on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["ArgumentCheck", "ToolSchema", "warm_up_schemas"]


def warm_up_schemas() -> None:
    """Import jsonschema and build its Draft 2020-12 meta-schema checker (about 70 ms the first time): done in a
    worker thread before the first tool list needs it."""
    ToolSchema("warm-up", {"type": "object", "properties": {"x": {"type": "string"}}})


@dataclass(frozen=True, slots=True)
class ArgumentCheck:
    arguments: Any  # after parsing nested JSON strings
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


class ToolSchema:
    """A tool's input schema, compiled once. ``error`` is set when the schema itself is invalid."""

    def __init__(self, name: str, schema: Any) -> None:
        from jsonschema import Draft202012Validator, SchemaError

        self.name = name
        self.schema = schema
        self.error: str | None = None
        self._validator: Any = None
        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as exc:
            where = "/".join(str(p) for p in exc.path) or "(root)"
            self.error = f"invalid input schema at {where}: {exc.message}"
            return
        self._validator = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)

    def check(self, arguments: Any) -> ArgumentCheck:
        if self._validator is None:
            return ArgumentCheck(arguments, [f"the tool {self.name!r} cannot be called: its {self.error}"])
        if arguments is None:
            arguments = {}
        arguments = _parse_nested_json(arguments, self.schema)
        problems = []
        for error in sorted(self._validator.iter_errors(arguments), key=lambda e: list(map(str, e.absolute_path))):
            where = "/".join(str(p) for p in error.absolute_path)
            problems.append(f"{where or 'arguments'}: {error.message}")
        return ArgumentCheck(arguments, problems)


def _wants(schema: Any, kind: str) -> bool:
    if not isinstance(schema, dict):
        return False
    declared = schema.get("type")
    if declared == kind or (isinstance(declared, list) and kind in declared):
        return True
    return declared is None and (
        (kind == "object" and "properties" in schema) or (kind == "array" and "items" in schema)
    )


def _parse_nested_json(value: Any, schema: Any) -> Any:
    if isinstance(value, str) and (_wants(schema, "object") or _wants(schema, "array")):
        try:
            parsed = json.loads(value)
        except (ValueError, RecursionError):
            return value
        if isinstance(parsed, (dict, list)):
            value = parsed
    if isinstance(value, dict) and isinstance(schema, dict) and isinstance(schema.get("properties"), dict):
        properties = schema["properties"]
        return {key: _parse_nested_json(item, properties.get(key)) for key, item in value.items()}
    if isinstance(value, list) and isinstance(schema, dict) and isinstance(schema.get("items"), dict):
        return [_parse_nested_json(item, schema["items"]) for item in value]
    return value
