"""Checking tool arguments against the editor's JSON Schemas (Draft 2020-12), before the editor sees a call.

Owns one compiled validator per tool, the clear report of a schema that is itself invalid, and the leniency
agents need: arguments the model wrote as a JSON *string* where the schema wants an object or an array are parsed
(Copilot does the same). Problems are reported as a list of lines the model can read and act on.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

__all__ = ["ArgumentCheck", "ToolSchema", "warm_up_schemas"]

# Compiled schemas, by the schema's repr (exact: 1 and 1.0, or true and 1, are different schemas here), for every
# session of the process: each conversation has a session of its own, and editors send the same tools to all.
_CACHE_SIZE = 4096
_compiled: dict[str, _Compiled] = {}
_cache_lock = threading.Lock()  # the warm-up compiles in a worker thread


def warm_up_schemas() -> None:
    """Import jsonschema (~30 ms) and build its Draft 2020-12 meta-schema checker: done in a worker thread before
    the first tool list needs it."""
    ToolSchema("warm-up", {"type": "object", "properties": {"x": {"type": "string"}}}).compile()


@dataclass(frozen=True, slots=True)
class ArgumentCheck:
    arguments: Any  # after parsing nested JSON strings
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True, slots=True)
class _Compiled:
    validator: Any  # None when the schema is invalid
    error: str | None


def _compile(schema: Any) -> _Compiled:
    from jsonschema import Draft202012Validator, SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "(root)"
        return _Compiled(None, f"invalid input schema at {where}: {exc.message}")
    return _Compiled(Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER), None)


class ToolSchema:
    """A tool's input schema. Checking it against the meta-schema and building its validator (~0.5 ms for a small
    schema, more for large ones) happens once per distinct schema in the process, on first use (``compile``):
    ``mcp_synthetic.wiring`` does it in the background when the editor's tools arrive, off the turn's path."""

    __slots__ = ("_compiled", "_key", "name", "schema")

    def __init__(self, name: str, schema: Any) -> None:
        self.name = name
        self.schema = schema
        self._key = repr(schema)
        self._compiled: _Compiled | None = _compiled.get(self._key)

    @property
    def compiled(self) -> bool:
        return self._compiled is not None

    def compile(self) -> None:
        if self._compiled is None:
            compiled = _compiled.get(self._key)
            if compiled is None:
                compiled = _compile(self.schema)
                with _cache_lock:
                    if len(_compiled) >= _CACHE_SIZE:
                        del _compiled[next(iter(_compiled))]  # the oldest entry
                    _compiled[self._key] = compiled
            self._compiled = compiled

    @property
    def error(self) -> str | None:
        """Why the schema itself is invalid, or None."""
        self.compile()
        assert self._compiled is not None
        return self._compiled.error

    def check(self, arguments: Any) -> ArgumentCheck:
        self.compile()
        assert self._compiled is not None
        validator = self._compiled.validator
        if validator is None:
            return ArgumentCheck(arguments, [f"the tool {self.name!r} cannot be called: its {self._compiled.error}"])
        if arguments is None:
            arguments = {}
        arguments = _parse_nested_json(arguments, self.schema)
        problems = []
        for error in sorted(validator.iter_errors(arguments), key=lambda e: list(map(str, e.absolute_path))):
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
