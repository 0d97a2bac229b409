"""Script files for ``lmbridge fake-model --script FILE``: JSON, the turns the model answers in order.

```json
{"turns": [
  {"say": "Hello!"},
  {"call": {"name": "get_weather", "arguments": {"city": "Paris"}}, "say": "Let me look."},
  {"call": {"offered": "*weather*", "arguments": {"city": "Paris"}}},
  {"parallel": [{"name": "a", "arguments": {}}, {"name": "b", "arguments": {}}]},
  {"say": "Thinking...", "stall": true}
],
 "then": {"say": "That is all I was told to say."}}
```

A turn has ``say`` (text, streamed in ``chunks`` deltas, default 3), and/or ``call`` (one tool call) or
``parallel`` (several); ``stall`` keeps the response open until the client goes away (a turn to cancel). A call
names its tool (``name``; ``namespace`` for OpenAI Responses namespace tools), or picks the first offered tool whose
name matches the glob ``offered``. ``then``: the answer to every request after the last turn (default: a text
saying the script is used up). Errors name the turn and key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .server import Call, Text, Turn

__all__ = ["ScriptError", "load_script", "parse_script"]


class ScriptError(ValueError):
    pass


def load_script(path: str | Path) -> tuple[list[Turn], Turn | None]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ScriptError(f"{path}: cannot read: {exc.strerror}") from exc
    except ValueError as exc:
        raise ScriptError(f"{path}: not JSON: {exc}") from exc
    try:
        return parse_script(data)
    except ScriptError as exc:
        raise ScriptError(f"{path}: {exc}") from exc


def parse_script(data: Any) -> tuple[list[Turn], Turn | None]:
    if not isinstance(data, dict) or set(data) - {"turns", "then"}:
        raise ScriptError('expected an object with "turns" (a list) and optionally "then"')
    turns = data.get("turns", [])
    if not isinstance(turns, list):
        raise ScriptError('"turns" must be a list')
    parsed = [_turn(turn, f"turns[{index}]") for index, turn in enumerate(turns)]
    then = _turn(data["then"], "then") if "then" in data else None
    return parsed, then


def _turn(raw: Any, where: str) -> Turn:
    if not isinstance(raw, dict):
        raise ScriptError(f"{where}: expected an object")
    unknown = set(raw) - {"say", "chunks", "call", "parallel", "stall"}
    if unknown:
        raise ScriptError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    items: list[Text | Call] = []
    if "say" in raw:
        if not isinstance(raw["say"], str):
            raise ScriptError(f"{where}.say: expected a string")
        chunks = raw.get("chunks", 3)
        if not isinstance(chunks, int) or isinstance(chunks, bool) or chunks < 1:
            raise ScriptError(f"{where}.chunks: expected a positive integer")
        items.append(Text(raw["say"], chunks))
    if "call" in raw and "parallel" in raw:
        raise ScriptError(f"{where}: call or parallel, not both")
    if "call" in raw:
        items.append(_call(raw["call"], f"{where}.call"))
    if "parallel" in raw:
        if not isinstance(raw["parallel"], list) or not raw["parallel"]:
            raise ScriptError(f"{where}.parallel: expected a non-empty list of calls")
        items += [_call(call, f"{where}.parallel[{i}]") for i, call in enumerate(raw["parallel"])]
    stall = raw.get("stall", False)
    if not isinstance(stall, bool):
        raise ScriptError(f"{where}.stall: expected true or false")
    if not items and not stall:
        raise ScriptError(f"{where}: say something, call something, or stall")
    return Turn(tuple(items), stall)


def _call(raw: Any, where: str) -> Call:
    if not isinstance(raw, dict) or set(raw) - {"name", "offered", "arguments", "namespace"}:
        raise ScriptError(f"{where}: expected an object with name (or offered), arguments, namespace")
    name, offered = raw.get("name"), raw.get("offered")
    if (name is None) == (offered is None) or not isinstance(name or offered, str):
        raise ScriptError(f"{where}: give exactly one of name and offered (a string)")
    arguments = raw.get("arguments", {})
    if not isinstance(arguments, dict):
        raise ScriptError(f"{where}.arguments: expected an object")
    namespace = raw.get("namespace")
    if namespace is not None and not isinstance(namespace, str):
        raise ScriptError(f"{where}.namespace: expected a string")
    return Call(name or "", arguments, namespace, offered)
