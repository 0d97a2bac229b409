"""History matching, sans-IO: generated conversations re-rendered the ways editors do still match; edits,
removals and rejections are detected as moved-on; changed history is not mistaken for a known conversation."""

from __future__ import annotations

import copy
import itertools
import json
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from session.history import ConversationIndex, MatchKind
from session.messages import MessageError, digest, normalize

words = st.text(alphabet="abcdefghij klmnop", min_size=1, max_size=20).map(str.strip).filter(bool)
json_inputs = st.dictionaries(
    st.sampled_from(["path", "city", "n", "flag"]), st.one_of(st.integers(-5, 5), words, st.booleans()), max_size=3
)
_call_ids = itertools.count(1)


@st.composite
def responses(draw: st.DrawFn) -> list[dict[str, Any]]:
    """What the bridge emitted in one turn: text chunks and tool calls."""
    parts: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.integers(0, 3)) == 0:
            parts.append(
                {
                    "type": "tool_call",
                    "callId": f"lmb_{next(_call_ids)}",
                    "name": draw(words).replace(" ", "_"),
                    "input": draw(json_inputs),
                }
            )
        else:
            parts.append({"type": "text", "value": draw(words) + " "})
    return parts


@st.composite
def rerendered(draw: st.DrawFn, parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An assistant response as an editor may send it back: text merged or split differently, trailing whitespace
    trimmed or added, thinking and cache-control parts added, tool inputs as JSON strings, or split over two
    assistant messages."""
    content: list[dict[str, Any]] = []
    for part in parts:
        if part["type"] == "text":
            value = part["value"]
            if draw(st.booleans()) and len(value) > 1:
                cut = draw(st.integers(1, len(value) - 1))
                content += [{"type": "text", "value": value[:cut]}, {"type": "text", "value": value[cut:]}]
            else:
                content.append({"type": "text", "value": value})
        else:
            call = dict(part)
            if draw(st.booleans()):
                call["input"] = json.dumps(part["input"], indent=draw(st.sampled_from([None, 2])), sort_keys=False)
            content.append(call)
        if draw(st.integers(0, 5)) == 0:
            content.append({"type": "thinking", "value": draw(words)})
    if draw(st.booleans()):
        content.append({"type": "data", "mimeType": "cache_control", "data": "ZXBoZW1lcmFs"})
    texts = [i for i, p in enumerate(content) if p["type"] == "text"]
    if texts and draw(st.booleans()):
        last = texts[-1]
        content[last] = {
            "type": "text",
            "value": content[last]["value"].rstrip() + draw(st.sampled_from(["", "\n", "  "])),
        }
    if len(content) > 1 and draw(st.integers(0, 4)) == 0:
        cut = draw(st.integers(1, len(content) - 1))
        return [{"role": "assistant", "content": content[:cut]}, {"role": "assistant", "content": content[cut:]}]
    return [{"role": "assistant", "content": content}]


def user_text(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "value": text}]}


def results_for(parts: list[dict[str, Any]]) -> dict[str, Any] | None:
    calls = [p for p in parts if p["type"] == "tool_call"]
    if not calls:
        return None
    return {
        "role": "user",
        "content": [
            {"type": "tool_result", "callId": c["callId"], "content": [{"type": "text", "value": "ok"}]} for c in calls
        ],
    }


class Bridge:
    """Plays the router's bookkeeping around the index, turn after turn."""

    def __init__(self) -> None:
        self.index = ConversationIndex()
        self.keys = itertools.count(1)

    def turn(self, history: list[dict[str, Any]], response: list[dict[str, Any]]):
        match = self.index.match(history)
        if match.kind is MatchKind.NO_MATCH:
            conversation = self.index.create(f"c{next(self.keys)}")
            self.index.commit(conversation, history, 0, match.start)
        else:
            conversation = match.conversation
            self.index.resolve_calls(conversation, list(conversation.pending_calls))
            self.index.commit(conversation, history, match.agreed, match.start)
        self.index.set_provisional(conversation, response)
        self.index.add_pending_calls(conversation, [p["callId"] for p in response if p["type"] == "tool_call"])
        return match, conversation


@st.composite
def conversations(draw: st.DrawFn, turns: int | None = None):
    """A conversation played through the bridge: (bridge, history so far, last response, the conversation)."""
    bridge = Bridge()
    history: list[dict[str, Any]] = []
    if draw(st.booleans()):
        history.append({"role": "system", "content": [{"type": "text", "value": "You are helpful."}]})
    conversation = None
    response: list[dict[str, Any]] = []
    for number in range(turns if turns is not None else draw(st.integers(1, 6))):
        results = results_for(response) if number else None
        history.append(results if results is not None and draw(st.booleans()) else user_text(draw(words)))
        match, conversation = bridge.turn(history, response := draw(responses()))
        if number == 0:
            assert match.kind is MatchKind.NO_MATCH
        else:
            assert match.kind is MatchKind.CONTINUATION, (match.kind, history)
            assert match.conversation is conversation
            assert match.new_messages == [history[-1]]
            for part in history[-1]["content"]:
                if part["type"] == "tool_result":
                    assert part["callId"] in match.tool_results
        history += draw(rerendered(response))
    return bridge, history, response, conversation


@settings(max_examples=300, deadline=None)
@given(conversations())
def test_rerendered_conversations_keep_matching_their_session(played) -> None:
    # The assertions are inside the generator: every turn after the first was a continuation.
    bridge, history, _response, conversation = played
    assert len(bridge.index) == 1
    follow_up = bridge.index.match(history + [user_text("next")])
    assert follow_up.kind is MatchKind.CONTINUATION and follow_up.conversation is conversation


@settings(max_examples=300, deadline=None)
@given(conversations(), st.sampled_from(["edit", "remove", "replace"]), st.data())
def test_edits_removals_and_rejections_of_the_last_response_are_moved_on(played, how: str, data) -> None:
    bridge, history, response, conversation = played
    answered = len(conversation.messages)  # committed history and the input the agent answered
    tail = history[answered:]  # the re-rendered last response
    if how == "edit":
        edited = copy.deepcopy(tail)
        edited[-1]["content"].append({"type": "text", "value": " (edited by the user)"})
        history = history[:answered] + edited
    elif how == "remove":
        assume(any(p["type"] in ("text", "tool_call") for p in response))
        history = history[:answered]
    else:  # the user rejected the response: it is replaced by a different one
        history = history[:answered] + [{"role": "assistant", "content": [{"type": "text", "value": "zzz different"}]}]
    new_message = user_text(data.draw(words))
    match = bridge.index.match(history + [new_message])
    assert match.kind is MatchKind.MOVED_ON and match.conversation is conversation
    # The agent already has the input it answered: only what differs after it is new.
    assert match.start == answered and match.new_messages == (history + [new_message])[answered:]


@settings(max_examples=200, deadline=None)
@given(conversations(), st.data())
def test_editing_or_retrying_the_last_message_is_moved_on(played, data) -> None:
    bridge, history, _response, conversation = played
    committed = len(conversation.committed)
    assume(history[committed]["role"] == "user")
    # (An edited first message is a new conversation: nothing earlier says otherwise.)
    assume(any(m["role"] != "system" for m in history[:committed]))
    edited = history[:committed] + [user_text("an edited question " + data.draw(words))]
    match = bridge.index.match(edited)
    assert match.kind is MatchKind.MOVED_ON and match.conversation is conversation
    assert match.start == committed and match.new_messages == edited[committed:]
    # The same request again (a retry, or the duplicate of one still running) has nothing new.
    retry = bridge.index.match(history[: len(conversation.messages)])
    assert retry.conversation is conversation and retry.new_messages == []


@settings(max_examples=200, deadline=None)
@given(conversations(), st.data())
def test_a_changed_earlier_message_is_not_this_conversation(played, data) -> None:
    bridge, history, _response, conversation = played
    committed = len(conversation.committed)
    editable = [
        i
        for i, m in enumerate(history[:committed])
        if m["role"] == "user" and any(p["type"] == "text" for p in m["content"])
    ]
    assume(editable)
    position = data.draw(st.sampled_from(editable))
    changed = copy.deepcopy(history)
    changed[position] = user_text("a completely different question")
    match = bridge.index.match(changed + [user_text("next")])
    assert match.kind is MatchKind.NO_MATCH


@settings(max_examples=200, deadline=None)
@given(conversations(), st.data())
def test_tool_results_identify_their_session_even_when_the_rest_is_rerendered(played, data) -> None:
    bridge, history, response, conversation = played
    results = results_for(response)
    assume(results is not None)
    rewritten = [user_text("the editor summarised everything before")] + history[-1:]
    match = bridge.index.match(rewritten + [results])
    assert match.kind is MatchKind.CONTINUATION and match.conversation is conversation
    assert set(match.tool_results) == {p["callId"] for p in response if p["type"] == "tool_call"}


@settings(max_examples=100, deadline=None)
@given(st.lists(conversations(turns=3), min_size=2, max_size=4))
def test_interleaved_conversations_stay_apart(played_list) -> None:
    # Merge the indexes of several conversations into one, as a single bridge would hold them.
    index = ConversationIndex()
    for n, (_bridge, _history, _response, conversation) in enumerate(played_list):
        copy_ = index.create(f"conv{n}")
        index.commit(copy_, conversation.messages, 0, conversation.agreed)
        copy_.provisional = conversation.provisional
        index.add_pending_calls(copy_, conversation.pending_calls)
    for n, (_bridge, history, _response, _conversation) in enumerate(played_list):
        match = index.match(history + [user_text("more")])
        first_words = next(h for h in history if h["role"] == "user")
        # Identical opening messages are indistinguishable until they differ; otherwise each finds its own.
        same_start = [
            m
            for m, (_, other, _, _) in enumerate(played_list)
            if next(h for h in other if h["role"] == "user") == first_words
        ]
        if len(same_start) == 1:
            assert match.conversation.key == f"conv{n}" and match.kind is MatchKind.CONTINUATION


def test_an_exact_repeat_of_the_history_has_nothing_new() -> None:
    bridge = Bridge()
    history = [user_text("hello")]
    bridge.turn(history, [{"type": "text", "value": "hi"}])
    match = bridge.index.match(list(history))
    assert match.new_messages == [] and match.conversation is not None


def test_conversations_that_began_alike_are_told_apart_by_which_one_a_request_continues() -> None:
    index = ConversationIndex()
    opening = [user_text("hello")]
    answer = {"type": "text", "value": "hi"}
    first, second = index.create("a"), index.create("b")
    for conversation in (first, second):
        index.commit(conversation, opening, 0, 0)
        index.set_provisional(conversation, [answer])
    history = [*opening, {"role": "assistant", "content": [answer]}]
    # "a" moves on with its own words...
    match = index.match([*history, user_text("only a")])
    assert match.kind is MatchKind.CONTINUATION
    index.commit(match.conversation, [*history, user_text("only a")], match.agreed, match.start)
    taken = match.conversation
    # ...and the other conversation's next request continues the other session, not an edit of the first.
    match = index.match([*history, user_text("only b")])
    assert match.kind is MatchKind.CONTINUATION and match.conversation is not taken
    # An edit of "only a" still finds the first, when no other conversation continues instead.
    index.commit(match.conversation, [*history, user_text("only b")], match.agreed, match.start)
    match = index.match([*history, user_text("only a, edited")])
    assert match.kind is MatchKind.MOVED_ON


def test_a_failed_turn_leaves_an_unanswered_user_message_as_context() -> None:
    match = ConversationIndex().match([user_text("/crash"), user_text("try again")])
    assert match.kind is MatchKind.NO_MATCH and match.start == 1


def test_malformed_new_messages_name_the_field() -> None:
    with pytest.raises(MessageError) as error:
        ConversationIndex().match([{"role": "user", "content": [{"type": "tool_call", "name": "x", "input": {}}]}])
    assert error.value.field == "messages[0].content[0].callId"


def test_an_image_over_the_limit_is_refused_naming_the_part_and_the_limit() -> None:
    from session.messages import MAX_IMAGE_BYTES

    fits = "A" * (MAX_IMAGE_BYTES * 4 // 3)
    image = {"role": "user", "content": [{"type": "text", "value": "look"}, {"type": "data", "mimeType": "image/png"}]}
    image["content"][1]["data"] = fits
    assert ConversationIndex().match([image]).kind is MatchKind.NO_MATCH  # at the limit: accepted
    image["content"][1]["data"] = fits + "AAAA"
    with pytest.raises(MessageError) as error:
        ConversationIndex().match([image])
    assert error.value.field == "messages[0].content[1].data"
    assert "20.0 MB is over lmbridge's limit of 20 MB" in error.value.problem


def test_normalisation_treats_renderings_alike() -> None:
    a = {
        "role": "assistant",
        "content": [
            {"type": "text", "value": "Hello "},
            {"type": "text", "value": "world  \n"},
            {"type": "tool_call", "callId": "c", "name": "f", "input": {"b": 1, "a": 2}},
        ],
    }
    b = {
        "role": "assistant",
        "name": "bot",
        "content": [
            {"type": "thinking", "value": "..."},
            {"type": "text", "value": "Hello world"},
            {"type": "data", "mimeType": "cache_control", "data": "eA=="},
            {"type": "tool_call", "callId": "c", "name": "f", "input": '{"a": 2, "b": 1}'},
        ],
    }
    assert digest(normalize(a)) == digest(normalize(b))


def test_matching_cost_grows_with_new_messages_not_history_length() -> None:
    """A functional check of the fast path: a long, unchanged history is compared without re-normalising it."""
    import session.history as history_module

    bridge = Bridge()
    history = []
    for n in range(2000):
        history += [user_text(f"question {n}"), {"role": "assistant", "content": [{"type": "text", "value": f"a{n}"}]}]
    history.append(user_text("last"))
    bridge.turn(history, [{"type": "text", "value": "reply"}])
    history.append({"role": "assistant", "content": [{"type": "text", "value": "reply"}]})
    calls = 0
    original = history_module.normalize

    def counting(message):
        nonlocal calls
        calls += 1
        return original(message)

    history_module.normalize = counting
    try:
        match = bridge.index.match(history + [user_text("one more")])
    finally:
        history_module.normalize = original
    assert match.kind is MatchKind.CONTINUATION
    assert calls <= 2  # the anchor message only — not 4,000 messages
