"""History matching, sans-IO: which ACP session does an editor request belong to, and what in it is new?

Owns the conversation records and the decision for each incoming ``lm/chat``; it never starts sessions or talks
to anyone. The router acts on the ``HistoryMatch``.

Each conversation keeps three things:

- ``committed`` — the history both sides agree on, exactly as the editor last sent it;
- ``input`` — the messages of the last request that were new (the user's latest words, tool results): the agent
  received them, but the editor may still take them back (edit the message, retry);
- ``provisional`` — what the bridge emitted in its last response, normalised.

For a request:

1. Tool results whose ``callId`` the bridge generated and still waits for identify their conversation outright,
   even when the editor re-rendered everything before them → continuation.
2. Otherwise candidates come from an index on the first non-system message's digest. The request must repeat
   ``committed`` (compared as raw JSON first — one C-speed list comparison — and only on a difference in normal
   form, see ``session.messages``). Then:
   - it repeats ``input`` and the next assistant message(s) equal ``provisional`` → continuation: what follows is
     new (tool results and/or user text);
   - otherwise the user moved on — edited or retried the last message, removed or rejected the response: cancel
     what is pending, discard provisional, and send what differs;
   - if ``committed`` itself differs, it is not this conversation.
3. Nothing matches → a new session, seeded with the prior messages.

Cost: the raw comparison of the repeated history runs at C speed (about 0.25 µs per message here); Python-level
work (validation, normalisation, digests) is spent only on new messages and on messages that differ. A digest
chain over the history gives each conversation a fingerprint (used to find a stored session id again after a
restart), extended with the new messages only.
"""

from __future__ import annotations

import enum
import hashlib
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .messages import MessageError, check_message, digest, normalize, normalize_parts

__all__ = [
    "EMPTY_CHAIN",
    "Conversation",
    "ConversationIndex",
    "HistoryMatch",
    "MatchKind",
    "chain_of",
    "chain_step",
]

EMPTY_CHAIN = b"\0" * 16


def chain_step(previous: bytes, message_digest: bytes) -> bytes:
    return hashlib.blake2b(previous + message_digest, digest_size=16).digest()


class MatchKind(enum.Enum):
    CONTINUATION = "continuation"
    MOVED_ON = "moved_on"
    NO_MATCH = "no_match"


@dataclass(eq=False)
class Conversation:
    """One conversation's view of the history. ``key`` names the session that serves it. ``messages`` is the
    last request's history: ``committed`` is its first ``agreed`` messages, ``input`` the rest."""

    key: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    agreed: int = 0
    digests: list[bytes] = field(default_factory=list)  # per message, of its normal form
    chain: list[bytes] = field(default_factory=list)  # chain[i] covers messages[: i + 1]
    provisional: list[tuple[Any, ...]] = field(default_factory=list)  # normalised parts of our last response
    pending_calls: set[str] = field(default_factory=set)
    anchor: bytes | None = None  # digest of the first non-system message: the index key

    @property
    def committed(self) -> list[dict[str, Any]]:
        return self.messages[: self.agreed]

    @property
    def input(self) -> list[dict[str, Any]]:
        return self.messages[self.agreed :]

    @property
    def fingerprint(self) -> bytes:
        """Of the history the agent has answered (committed and input)."""
        return self.chain[-1] if self.chain else EMPTY_CHAIN

    @property
    def fingerprint_with_provisional(self) -> bytes:
        """Of the same history followed by the answer, as the editor is expected to send it back."""
        return chain_step(self.fingerprint, digest(("assistant", *self.provisional)))


@dataclass(frozen=True, slots=True)
class HistoryMatch:
    kind: MatchKind
    conversation: Conversation | None
    agreed: int  # leading messages of the request equal to the conversation's (their digests are known)
    start: int  # index in the request of the first new message
    new_messages: list[dict[str, Any]]
    tool_results: dict[str, dict[str, Any]]  # callId → tool_result part, for calls the conversation waits on


class ConversationIndex:
    """All conversations the bridge serves (for one agent), indexed for matching."""

    def __init__(self) -> None:
        self._conversations: dict[str, Conversation] = {}
        self._by_anchor: dict[bytes, dict[str, Conversation]] = {}
        self._by_call: dict[str, Conversation] = {}

    def __len__(self) -> int:
        return len(self._conversations)

    def get(self, key: str) -> Conversation | None:
        return self._conversations.get(key)

    # -- matching -------------------------------------------------------------------------------------------

    def match(self, messages: list[Any]) -> HistoryMatch:
        """Decide where ``messages`` (an ``lm/chat`` history) belongs. Raises ``MessageError`` for a malformed
        message among those it had to read (an unchanged, already accepted prefix is not re-checked)."""
        if not isinstance(messages, list) or not messages:
            raise MessageError("messages", "must be a non-empty list of messages")
        tail = _tail_start(messages)
        for index in range(tail, len(messages)):
            check_message(messages[index], f"messages[{index}]")

        by_call = self._match_by_call(messages, tail)
        if by_call is not None:
            return by_call

        anchor_index = _anchor_index(messages)
        check_message(messages[anchor_index], f"messages[{anchor_index}]")
        anchor = digest(normalize(messages[anchor_index]))
        candidates = [
            conversation
            for conversation in self._by_anchor.get(anchor, {}).values()
            if conversation.agreed <= len(messages) and self._repeats(conversation, messages, 0, conversation.agreed)
        ]
        if not candidates:
            return self.unmatched(messages, checked_from=tail)
        # The longest agreed history wins; but a conversation this request continues beats one it would edit: two
        # conversations that began alike and then diverged are told apart by which one each request continues.
        candidates.sort(key=lambda conversation: conversation.agreed, reverse=True)
        fallback: HistoryMatch | None = None
        for conversation in candidates:
            decided = self._decide(conversation, messages)
            if decided.kind is MatchKind.CONTINUATION:
                return decided
            fallback = fallback or decided
        assert fallback is not None
        return fallback

    def _decide(self, best: Conversation, messages: list[Any]) -> HistoryMatch:
        """``messages`` repeat what ``best`` committed: a continuation of it, or a change of its last turn."""
        committed = best.agreed
        answered = len(best.messages)
        if answered <= len(messages) and self._repeats(best, messages, committed, answered):
            end = answered
            while end < len(messages) and isinstance(messages[end], dict) and messages[end].get("role") == "assistant":
                end += 1
            for index in range(answered, end):
                check_message(messages[index], f"messages[{index}]")
            rendered = normalize_parts(
                list(itertools.chain.from_iterable(_content(messages[index]) for index in range(answered, end)))
            )
            if rendered == best.provisional:
                new = messages[end:]
                return HistoryMatch(MatchKind.CONTINUATION, best, answered, end, new, _results_for(best, new))
            # The agent has the input; the response was edited, removed or rejected.
            start = answered
        else:
            start = committed  # the last input itself was edited or taken back
        for index in range(start, len(messages)):
            check_message(messages[index], f"messages[{index}]")
        return HistoryMatch(MatchKind.MOVED_ON, best, start, start, messages[start:], {})

    def unmatched(self, messages: list[Any], *, checked_from: int | None = None) -> HistoryMatch:
        """``messages`` as the start of a new conversation (checked whole — up to ``checked_from`` when the rest was
        checked already): what ``match`` answers when nothing matches, and what a caller uses when the matching
        conversation may not be shared."""
        tail = _tail_start(messages)
        for index in range(len(messages) if checked_from is None else checked_from):
            check_message(messages[index], f"messages[{index}]")
        start = _latest_input(messages, tail)
        return HistoryMatch(MatchKind.NO_MATCH, None, 0, start, messages[start:], {})

    def _match_by_call(self, messages: list[Any], tail: int) -> HistoryMatch | None:
        found: Conversation | None = None
        for message in messages[tail:]:
            for part in _content(message):
                if part.get("type") == "tool_result":
                    conversation = self._by_call.get(part["callId"])
                    if conversation is not None:
                        found = conversation
        if found is None:
            return None
        known = found.messages
        agreed = min(len(known), tail)
        if messages[:agreed] != known[:agreed]:
            agreed = next(i for i, (a, b) in enumerate(zip(messages[:agreed], known[:agreed], strict=True)) if a != b)
        for index in range(agreed, tail):
            check_message(messages[index], f"messages[{index}]")
        new = messages[tail:]
        return HistoryMatch(MatchKind.CONTINUATION, found, agreed, tail, new, _results_for(found, new))

    def _repeats(self, conversation: Conversation, messages: list[Any], start: int, end: int) -> bool:
        """Does the request repeat the conversation's messages ``[start:end]``? Raw first; where a message was
        re-rendered, in normal form (and the new rendering is adopted)."""
        known = conversation.messages
        if messages[start:end] == known[start:end]:
            return True
        for index in range(start, end):
            if messages[index] == known[index]:
                continue
            try:
                check_message(messages[index], f"messages[{index}]")
            except MessageError:
                return False
            if digest(normalize(messages[index])) != conversation.digests[index]:
                return False
        known[start:end] = messages[start:end]
        return True

    # -- updates --------------------------------------------------------------------------------------------

    def create(self, key: str) -> Conversation:
        if key in self._conversations:
            raise KeyError(f"conversation {key!r} exists")
        conversation = self._conversations[key] = Conversation(key)
        return conversation

    def commit(self, conversation: Conversation, messages: list[dict[str, Any]], agreed: int, start: int) -> None:
        """The request ``messages`` is being answered: its first ``start`` messages are now committed, the rest
        is the new input. Its first ``agreed`` messages equal the conversation's (their digests are reused)."""
        self._unindex_anchor(conversation)
        agreed = min(agreed, len(conversation.messages), len(messages))
        conversation.messages = list(messages)
        conversation.agreed = start
        del conversation.digests[agreed:]
        del conversation.chain[agreed:]
        previous = conversation.chain[-1] if conversation.chain else EMPTY_CHAIN
        for message in messages[agreed:]:
            message_digest = digest(normalize(message))
            previous = chain_step(previous, message_digest)
            conversation.digests.append(message_digest)
            conversation.chain.append(previous)
        conversation.provisional = []
        anchor_index = _anchor_index(messages)
        conversation.anchor = conversation.digests[anchor_index] if anchor_index < len(conversation.digests) else None
        if conversation.anchor is not None:
            self._by_anchor.setdefault(conversation.anchor, {})[conversation.key] = conversation

    def set_provisional(self, conversation: Conversation, parts: list[dict[str, Any]]) -> None:
        conversation.provisional = normalize_parts(parts)

    def add_pending_calls(self, conversation: Conversation, call_ids: Iterable[str]) -> None:
        for call_id in call_ids:
            conversation.pending_calls.add(call_id)
            self._by_call[call_id] = conversation

    def resolve_calls(self, conversation: Conversation, call_ids: Iterable[str]) -> None:
        for call_id in call_ids:
            conversation.pending_calls.discard(call_id)
            if self._by_call.get(call_id) is conversation:
                del self._by_call[call_id]

    def forget(self, conversation: Conversation) -> None:
        self._conversations.pop(conversation.key, None)
        self._unindex_anchor(conversation)
        self.resolve_calls(conversation, list(conversation.pending_calls))

    def _unindex_anchor(self, conversation: Conversation) -> None:
        if conversation.anchor is not None:
            bucket = self._by_anchor.get(conversation.anchor)
            if bucket is not None:
                bucket.pop(conversation.key, None)
                if not bucket:
                    del self._by_anchor[conversation.anchor]


def chain_of(messages: list[dict[str, Any]]) -> list[bytes]:
    """The digest chain of a whole (checked) history: used only when nothing matched in memory."""
    chain = []
    previous = EMPTY_CHAIN
    for message in messages:
        previous = chain_step(previous, digest(normalize(message)))
        chain.append(previous)
    return chain


def _content(message: Any) -> list[dict[str, Any]]:
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return [{"type": "text", "value": content}]
    return [part for part in content if isinstance(part, dict)] if isinstance(content, list) else []


def _tail_start(messages: list[Any]) -> int:
    """Index after the last assistant message: the trailing messages are the editor's new input."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, dict) and message.get("role") == "assistant":
            return index + 1
    return 0


def _latest_input(messages: list[Any], tail: int) -> int:
    """Where the new input of an unknown conversation starts: its last user message. Earlier user messages after
    the last answer were never answered (the turn failed, or the user wrote twice): they are context, not orders."""
    for index in range(len(messages) - 1, tail - 1, -1):
        if messages[index].get("role") == "user":
            return index
    return tail


def _anchor_index(messages: list[Any]) -> int:
    for index, message in enumerate(messages):
        if not (isinstance(message, dict) and message.get("role") == "system"):
            return index
    return 0


def _results_for(conversation: Conversation, new: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    for message in new:
        for part in _content(message):
            if part.get("type") == "tool_result" and part["callId"] in conversation.pending_calls:
                results[part["callId"]] = part
    return results
