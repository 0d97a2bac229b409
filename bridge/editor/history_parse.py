"""Parsing editor messages without re-parsing the history the editor repeats.

An editor re-sends the whole conversation with every ``lm/chat`` (and ``lm/countTokens``): after a tool call the
request is the previous one plus two messages. Parsing it all again costs ~3 µs per message (30 ms for 10,000)
and, once parsed, the repeated history must be compared with the known one (another 0.5 µs per message).

``HistoryReusingParser`` is a drop-in for ``jsonrpc.parse`` that remembers, for the last few large histories it
parsed, the exact text of ``params.messages`` up to the end of its last element, and the messages parsed from
it. When a new message's ``params.messages`` starts with one of those texts, the text comparison (C speed,
~0.1 ms per MB) replaces the parse, only the new elements are parsed, and the repeated messages are the *same
objects* as before — so history matching compares them by identity. The result is always what ``json.loads``
would return; anything unusual (another layout, invalid JSON, a number that continues past the old end) falls back
to the plain parse, which also produces the error message.

The editor's tool list (``params.options.tools``) comes again with every request too, and is often the largest part
of it (an editor with 80 tools sends ~140 KB of them: 0.3 ms to parse): the last few large ones are remembered
whole, and a request that repeats one exactly gets the same list object back — which the editor connection and the
synthetic MCP server then recognise by identity instead of checking and comparing it again.

The shared message and tool objects must not be mutated; nothing in lmbridge does (the history layer replaces
lists, never edits messages; the tool list is read, and copied where it is checked).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bridge.rpc.protocol import parse, scan_json, skip_json_space

__all__ = ["HistoryReusingParser"]

_JSON_SPACE = " \t\n\r"
_TOOL_LISTS = 4  # tool lists remembered per connection (an editor switching between a few modes' tool sets)
_TOOL_LIST_CHARS = 1 << 20  # and each at most this long (real editors send 0.1 – 0.2 MB): 4 MB per connection at most


class _Unusual(Exception):
    """The message is not laid out as the walk expects: parse it plainly."""


@dataclass(slots=True)
class _Remembered:
    text: str  # params.messages from "[" to the end of its last element
    messages: tuple[Any, ...]  # what that text parses to


class HistoryReusingParser:
    """``parse`` for one editor connection, reusing the parsed prefix of repeated histories (see the module).

    Histories shorter than ``min_chars`` are not remembered (parsing them is cheaper than keeping them); at most
    ``max_entries`` histories (about one per concurrent conversation) and ``max_chars`` characters are kept.
    The default, 4 KiB, is about where reusing starts to pay (measured: the reused path costs ~20 µs whatever the
    length, for the walk of the request's own keys; a plain parse of tool calls and results ~7 µs per KB — 18 µs
    at 2.9 KB, 35 µs at 5 KB, 124 µs at 19 KB; a tool conversation grows by ~0.3 KB a call).
    """

    def __init__(self, *, min_chars: int = 4 * 1024, max_entries: int = 16, max_chars: int = 64 * 1024 * 1024):
        self.min_chars = min_chars
        self.max_entries = max_entries
        self.max_chars = max_chars
        self._remembered: list[_Remembered] = []  # most recently used first
        self._tool_lists: list[tuple[str, Any]] = []  # (exact text, parsed list) of the last large tool lists
        self.reused_messages = 0  # counters, for tests and benchmarks
        self.parsed_messages = 0
        self.reused_tool_lists = 0
        self._options: dict[str, Callable[[str, int], tuple[Any, int]]] = {"tools": self._tools}
        self._params: dict[str, Callable[[str, int], tuple[Any, int]]] = {
            "messages": self._messages,
            "options": self._options_value,
        }
        self._top: dict[str, Callable[[str, int], tuple[Any, int]]] = {"params": self._params_value}

    def __call__(self, raw: bytes | str) -> Any:
        text = raw if isinstance(raw, str) else bytes(raw).decode()
        if len(text) < self.min_chars:
            return parse(text)  # it cannot hold a remembered history, and it is not worth remembering
        try:
            start = skip_json_space(text, 0)
            if text[start : start + 1] != "{":
                raise _Unusual
            value, end = self._object(text, start, self._top)
            if skip_json_space(text, end) != len(text):
                raise _Unusual
            return value
        except (_Unusual, StopIteration, ValueError):
            return parse(text)  # the plain parse decides, and names the error if there is one

    @property
    def remembered_chars(self) -> int:
        return sum(len(entry.text) for entry in self._remembered)

    # -- the walk: the top object and params key by key, everything else by the C scanner --------------------

    def _object(
        self, text: str, index: int, special: dict[str, Callable[[str, int], tuple[Any, int]]]
    ) -> tuple[dict[str, Any], int]:
        result: dict[str, Any] = {}
        index = skip_json_space(text, index + 1)
        if text[index : index + 1] == "}":
            return result, index + 1
        while True:
            if text[index : index + 1] != '"':
                raise _Unusual
            key, index = scan_json(text, index)
            index = skip_json_space(text, index)
            if text[index : index + 1] != ":":
                raise _Unusual
            index = skip_json_space(text, index + 1)
            reader = special.get(key)
            value, index = reader(text, index) if reader is not None else scan_json(text, index)
            result[key] = value  # a repeated key: the last one wins, as in json.loads
            index = skip_json_space(text, index)
            separator = text[index : index + 1]
            if separator == "}":
                return result, index + 1
            if separator != ",":
                raise _Unusual
            index = skip_json_space(text, index + 1)

    def _params_value(self, text: str, index: int) -> tuple[Any, int]:
        if text[index : index + 1] != "{":
            return scan_json(text, index)
        return self._object(text, index, self._params)

    def _options_value(self, text: str, index: int) -> tuple[Any, int]:
        if text[index : index + 1] != "{":
            return scan_json(text, index)
        return self._object(text, index, self._options)

    def _tools(self, text: str, index: int) -> tuple[Any, int]:
        # A complete JSON value's text determines where it ends: a remembered list's exact text at ``index`` is that
        # list, whatever follows it.
        for position, (known, value) in enumerate(self._tool_lists):
            if text.startswith(known, index):
                if position:
                    self._tool_lists.insert(0, self._tool_lists.pop(position))
                self.reused_tool_lists += 1
                return value, index + len(known)
        value, end = scan_json(text, index)
        if isinstance(value, list) and self.min_chars <= end - index <= _TOOL_LIST_CHARS:
            self._tool_lists.insert(0, (text[index:end], value))
            del self._tool_lists[_TOOL_LISTS:]
        return value, end

    def _messages(self, text: str, index: int) -> tuple[Any, int]:
        if text[index : index + 1] != "[":
            return scan_json(text, index)
        found = self._continue_remembered(text, index)
        if found is None:
            messages, end = scan_json(text, index)
            self.parsed_messages += len(messages)
            self._remember(None, text, index, end, messages)
            return messages, end
        entry, messages, end = found
        self._remember(entry, text, index, end, messages)
        return messages, end

    def _continue_remembered(self, text: str, index: int) -> tuple[_Remembered, list[Any], int] | None:
        for entry in self._remembered:
            if not text.startswith(entry.text, index):
                continue
            messages = list(entry.messages)
            after = skip_json_space(text, index + len(entry.text))
            separator = text[after : after + 1]
            added = 0
            # The old text ended with a complete element; only "," or "]" may follow it (anything else — a
            # number's next digit — means the element itself continues, and this entry does not apply).
            while separator == ",":
                value, after = scan_json(text, skip_json_space(text, after + 1))
                messages.append(value)
                added += 1
                after = skip_json_space(text, after)
                separator = text[after : after + 1]
            if separator != "]":
                continue
            self.reused_messages += len(entry.messages)
            self.parsed_messages += added
            return entry, messages, after + 1
        return None

    def _remember(self, replaces: _Remembered | None, text: str, start: int, end: int, messages: list[Any]) -> None:
        if replaces is not None:
            self._remembered.remove(replaces)
        body = text[start : end - 1].rstrip(_JSON_SPACE)  # from "[" to the end of the last element
        if not messages or len(body) < self.min_chars:
            if replaces is not None:
                self._remembered.insert(0, replaces)  # still the best start for this conversation
            return
        self._remembered.insert(0, _Remembered(body, tuple(messages)))
        del self._remembered[self.max_entries :]
        total = 0
        for keep, entry in enumerate(self._remembered):
            total += len(entry.text)
            if total > self.max_chars and keep > 0:
                del self._remembered[keep:]
                break
