"""Parsing editor messages without re-parsing the history the editor repeats.

An editor re-sends the whole conversation with every ``lm/chat`` (and ``lm/countTokens``): after a tool call the
request is the previous one plus two messages. Parsing it all again costs ~3 µs per message (30 ms for 10,000)
and, once parsed, the repeated history must be compared with the known one (another 0.5 µs per message).

``HistoryReusingParser`` is a drop-in for ``jsonrpc.parse`` that remembers, for the last few large histories it
parsed, the exact bytes of ``params.messages`` up to the end of its last element, and the messages parsed from
them. When a new message's ``"messages"`` value starts with one of those, the byte comparison (C speed, ~0.15 ms
per MB) replaces the parse: the remembered part is cut out of the message before it is decoded (a placeholder
stands in for it), only the rest is decoded and parsed, and the repeated messages are the *same objects* as
before — so history matching compares them by identity. Neither the repeated bytes nor a decoded copy of them is
made again (a 3 MB request: 0.5 ms, and megabytes of fresh memory whose first touch costs as much again). The
result is always what ``json.loads`` would return: the placeholder must be read exactly where ``params.messages``
is, or the whole message is parsed; anything unusual (another layout, invalid JSON, a number that continues past
the old end) falls back to the plain parse, which also produces the error message.

The editor's tool list (``params.options.tools``) comes again with every request too, and is often the largest part
of it (an editor with 80 tools sends ~140 KB of them: 0.3 ms to parse): the last few large ones are remembered
whole, and a request that repeats one exactly gets the same list object back — which the editor connection and the
synthetic MCP server then recognise by identity instead of checking and comparing it again.

The shared message and tool objects must not be mutated; nothing in lmbridge does (the history layer replaces
lists, never edits messages; the tool list is read, and copied where it is checked).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from wire.rpc.protocol import parse, scan_json, skip_json_space

__all__ = ["HistoryReusingParser"]

_JSON_SPACE = " \t\n\r"
_TOOL_LISTS = 4  # tool lists remembered per connection (an editor switching between a few modes' tool sets)
_TOOL_LIST_CHARS = 1 << 20  # and each at most this long (real editors send 0.1 – 0.2 MB): 4 MB per connection at most


class _Unusual(Exception):
    """The message is not laid out as the walk expects: parse it plainly."""


@dataclass(slots=True)
class _Remembered:
    pieces: tuple[bytes, ...]  # params.messages from "[" to the end of its last element, as received, in pieces
    size: int  # their total length
    messages: tuple[Any, ...]  # what they parse to


@dataclass(slots=True)
class _Splice:
    """A request whose remembered history has been cut out of its text: ``[0`` stands at ``index`` instead."""

    index: int
    entry: _Remembered
    rest: int  # where the request's bytes continue after the remembered history
    ascii: bool  # the text is ASCII: one character per byte
    taken: bool = False  # the walk reached the placeholder as params.messages


_MESSAGES_KEY = b'"messages"'
_KEY_TO_ARRAY = re.compile(rb"[ \t\n\r]*:[ \t\n\r]*\[")
_ARRAY_GOES_ON = re.compile(rb"[ \t\n\r]*[,\]]")
_KEY_LOOKS = 4  # occurrences of "messages" tried (a tool's input or schema may have such a key before params')
_MAX_PIECES = 16  # a remembered history in more pieces than this is joined into one


class HistoryReusingParser:
    """``parse`` for one editor connection, reusing the parsed prefix of repeated histories (see the module).

    Histories shorter than ``min_chars`` are not remembered (parsing them is cheaper than keeping them); at most
    ``max_entries`` histories (about one per concurrent conversation) and ``max_chars`` bytes are kept.
    The default, 4 KiB, is about where reusing starts to pay: the reused path costs the same whatever the length
    (the walk of the request's own keys), a plain parse grows with it (docs/performance-log.md has the figures).
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
        # The message being parsed: its bytes, and the remembered history cut out of its text (if any).
        self._data = b""
        self._splice: _Splice | None = None
        self._options: dict[str, Callable[[str, int], tuple[Any, int]]] = {"tools": self._tools}
        self._params: dict[str, Callable[[str, int], tuple[Any, int]]] = {
            "messages": self._messages,
            "options": self._options_value,
        }
        self._top: dict[str, Callable[[str, int], tuple[Any, int]]] = {"params": self._params_value}

    def __call__(self, raw: bytes | str) -> Any:
        if isinstance(raw, str):
            try:
                raw = raw.encode()
            except UnicodeEncodeError:  # a lone surrogate: only the plain parse can read it
                return parse(raw)
        data = raw if isinstance(raw, bytes) else bytes(raw)
        if len(data) < self.min_chars:
            return parse(data)  # it cannot hold a remembered history, and it is not worth remembering
        self._data = data
        try:
            # A repeated history is found and compared as bytes, and cut out before the text is decoded: neither
            # it nor its copy is decoded again (3 MB: 0.5 ms, and megabytes of fresh memory).
            found = self._find_remembered(data)
            if found is not None:
                index, entry, rest = found
                text = data[:index].decode() + "[0" + data[rest:].decode()
                self._splice = splice = _Splice(index, entry, rest, text.isascii())
                try:
                    value = self._walk(text)
                    if splice.taken:
                        return value
                except (_Unusual, StopIteration, ValueError):
                    pass
                self._splice = None  # the placeholder was read as something else, or the rest is unusual
            return self._walk(data.decode())
        except (_Unusual, StopIteration, ValueError):
            return parse(data)  # the plain parse decides, and names the error if there is one
        finally:
            self._data, self._splice = b"", None

    @property
    def remembered_chars(self) -> int:
        return sum(entry.size for entry in self._remembered)

    def _walk(self, text: str) -> Any:
        start = skip_json_space(text, 0)
        if text[start : start + 1] != "{":
            raise _Unusual
        value, end = self._object(text, start, self._top)
        if skip_json_space(text, end) != len(text):
            raise _Unusual
        return value

    def _find_remembered(self, data: bytes) -> tuple[int, _Remembered, int] | None:
        """Where a remembered history starts in ``data``, which one, and where the request goes on after it."""
        if not self._remembered:
            return None
        key = 0
        for _ in range(_KEY_LOOKS):
            key = data.find(_MESSAGES_KEY, key)
            if key < 0:
                return None
            key += len(_MESSAGES_KEY)
            array = _KEY_TO_ARRAY.match(data, key)
            if array is None:
                continue
            start = array.end() - 1
            for entry in self._remembered:
                end = start
                for piece in entry.pieces:
                    if not data.startswith(piece, end):
                        break
                    end += len(piece)
                else:
                    # The old text ended with a complete element; only "," or "]" may follow it (anything else —
                    # a number's next digit — means the element itself continues, and this entry does not apply).
                    if _ARRAY_GOES_ON.match(data, end):
                        return start, entry, end
        return None

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
        splice = self._splice
        if splice is not None:
            if index != splice.index or splice.taken:
                raise _Unusual  # another "messages" before this one holds the history: read the whole text
            return self._continue(text, splice)
        if text[index : index + 1] != "[":
            return scan_json(text, index)
        messages, end = scan_json(text, index)
        self.parsed_messages += len(messages)
        if messages:
            body = text[index : end - 1].rstrip(_JSON_SPACE)  # from "[" to the end of the last element
            if len(body) >= self.min_chars:
                piece = self._data[index : index + len(body)] if text.isascii() else body.encode()
                self._remember(None, _Remembered((piece,), len(piece), tuple(messages)))
        return messages, end

    def _continue(self, text: str, splice: _Splice) -> tuple[Any, int]:
        """The messages of the history cut out at ``splice.index`` (``[0`` in the text), and those after them."""
        entry = splice.entry
        messages = list(entry.messages)
        after = skip_json_space(text, splice.index + 2)
        last = splice.index + 2  # the end of the last element, in the text
        separator = text[after : after + 1]
        while separator == ",":
            value, last = scan_json(text, skip_json_space(text, after + 1))
            messages.append(value)
            after = skip_json_space(text, last)
            separator = text[after : after + 1]
        if separator != "]":
            raise _Unusual
        splice.taken = True
        added = len(messages) - len(entry.messages)
        self.reused_messages += len(entry.messages)
        self.parsed_messages += added
        if not added:
            self._remember(entry, entry)
        else:
            new = text[splice.index + 2 : last]
            size = len(new) if splice.ascii else len(new.encode())
            piece = self._data[splice.rest : splice.rest + size]
            pieces = (*entry.pieces, piece)
            if len(pieces) > _MAX_PIECES:
                pieces = (b"".join(pieces),)
            self._remember(entry, _Remembered(pieces, entry.size + size, tuple(messages)))
        return messages, after + 1

    def _remember(self, replaces: _Remembered | None, entry: _Remembered) -> None:
        if replaces is not None:
            self._remembered.remove(replaces)
        self._remembered.insert(0, entry)
        del self._remembered[self.max_entries :]
        total = 0
        for keep, kept in enumerate(self._remembered):
            total += kept.size
            if total > self.max_chars and keep > 0:
                del self._remembered[keep:]
                break
