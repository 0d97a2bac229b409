"""The session state file on its own: what is remembered is found again by the same agent and scope only; the file
keeps the most recently remembered entries, and what it holds is what ``json.dumps`` makes of the store."""

from __future__ import annotations

import itertools
import json
import stat
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import session.store as store_module
from session.store import SessionStore, _scope_prefix


def test_a_session_is_found_again_by_its_scope_only(tmp_path: Path) -> None:
    path = tmp_path / "state" / "sessions.json"
    store = SessionStore(path)
    chain = [b"\x01" * 32, b"\x02" * 32]
    store.remember("claude", "s-one", "/work/one", [chain[1]], scope="editor\0code\0/work/one")
    reopened = SessionStore(path)  # as after a restart
    hit = reopened.lookup("claude", chain, "editor\0code\0/work/one")
    assert hit is not None and hit[0] == 2 and hit[1].session_id == "s-one"
    assert reopened.lookup("claude", chain, "editor\0code\0/work/two") is None
    assert reopened.lookup("claude", chain) is None
    assert reopened.lookup("codex", chain, "editor\0code\0/work/one") is None
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "/work/one" not in next(iter(json.loads(path.read_text())["entries"]))  # the key holds a digest only


def test_with_an_owner_that_writes_a_change_is_only_announced_until_written(tmp_path: Path) -> None:
    """lmbridge's service writes the file after the turn that changed the store was answered (``on_change``)."""
    path = tmp_path / "state" / "sessions.json"
    changes: list[None] = []
    store = SessionStore(path, on_change=lambda: changes.append(None))
    store.remember("claude", "s-one", "/work", [b"\x01" * 32])
    store.remember_offer("claude", ["claude-agent-acp"], {"options": []})
    assert len(changes) == 2 and not path.exists()
    content = store.snapshot()
    assert content is not None and store.snapshot() is None  # one snapshot per change
    store.write(content)
    reopened = SessionStore(path)
    hit = reopened.lookup("claude", [b"\x01" * 32])
    assert hit is not None and hit[1].session_id == "s-one"
    assert reopened.offer("claude", ["claude-agent-acp"]) == {"options": []}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    store.forget("s-one")
    assert len(changes) == 3 and store.snapshot() is not None


class _Clock:
    """Stands in for the ``time`` module in ``session.store``: every reading one second after the last."""

    def __init__(self) -> None:
        self._ticks = itertools.count(1_000_000)

    def time(self) -> float:
        return float(next(self._ticks))


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "time", _Clock())


def test_a_full_store_drops_what_was_remembered_longest_ago(tmp_path: Path, clock: None) -> None:
    path = tmp_path / "sessions.json"
    store = SessionStore(path, max_entries=3)
    one, two, three, four = (bytes([n]) * 32 for n in range(1, 5))
    store.remember("claude", "s-1", "/w", [one, two])
    store.remember("claude", "s-2", "/w", [three])
    store.remember("claude", "s-1", "/w", [one])  # remembered again: now the most recent
    store.remember("codex", "s-3", "/w", [four])  # the store is full: `two` goes
    assert store.lookup("claude", [two]) is None
    assert store.lookup("claude", [one]) is not None and store.lookup("claude", [three]) is not None
    reopened = SessionStore(path, max_entries=3)
    assert reopened.has_agent("codex") and reopened.lookup("codex", [four]) is not None
    reopened.remember("codex", "s-4", "/w", [two])  # and after a restart, `three` is the oldest
    assert reopened.lookup("claude", [three]) is None and reopened.lookup("claude", [one]) is not None


def test_a_file_of_an_earlier_version_is_aged_by_its_times(tmp_path: Path) -> None:
    """Earlier versions kept entries in the order first remembered; what counts when the store is full is when."""
    path = tmp_path / "sessions.json"
    entries = {
        (bytes([n]) * 32).hex(): {"agent": "claude", "sessionId": f"s-{n}", "cwd": "/w", "updated": updated}
        for n, updated in [(1, 30.0), (2, 10.0), (3, 20.0)]
    }
    path.write_text(json.dumps({"version": 1, "entries": entries, "offers": {}}))
    store = SessionStore(path, max_entries=3)
    store.remember("claude", "s-4", "/w", [b"\x04" * 32])
    assert store.lookup("claude", [b"\x02" * 32]) is None  # updated 10.0: the oldest
    assert all(store.lookup("claude", [bytes([n]) * 32]) is not None for n in (1, 3, 4))


def test_an_unreadable_file_is_left_for_an_empty_store(tmp_path: Path) -> None:
    path = tmp_path / "sessions.json"
    path.write_text('{"version": 1, "entries": {"k": {"agent": "claude"}}}')  # no sessionId
    warnings: list[str] = []

    class Log:
        def warning(self, event: str, **_: Any) -> None:
            warnings.append(event)

    store = SessionStore(path, log=Log())
    assert not store.has_agent("claude") and store.lookup("claude", [b"k"]) is None
    assert warnings == ["ignoring an unreadable session state file"]


_AGENTS = st.sampled_from(["claude", "codex"])
_FINGERPRINTS = st.lists(st.integers(0, 7).map(lambda n: bytes([n]) * 32), min_size=1, max_size=3)
_OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("remember"), _AGENTS, st.sampled_from(["s-1", "s-2", "s-3"]), _FINGERPRINTS,
                  st.sampled_from(["", "editor\0code\0/w"])),
        st.tuples(st.just("forget"), st.sampled_from(["s-1", "s-2", "s-3"])),
        st.tuples(st.just("offer"), _AGENTS, st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)),
        st.just(("restart",)),
        st.just(("flush",)),
    ),
    max_size=25,
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(_OPERATIONS, st.booleans())
def test_the_file_is_what_json_dumps_makes_of_the_remembered_entries(
    operations: list[tuple[Any, ...]], deferred: bool
) -> None:
    """Against a model: a dict in the order entries were last remembered, the oldest dropped beyond the bound.
    ``deferred``: the store only announces changes and the file is written at ``flush`` (and before a restart), as
    lmbridge's service writes it a second after a turn."""
    ticks = itertools.count(1)
    model: dict[str, dict[str, Any]] = {}
    offers: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "sessions.json"
        original_time = store_module.time
        store_module.time = _Clock()  # type: ignore[assignment]
        try:

            def open_store() -> SessionStore:
                return SessionStore(path, max_entries=5, on_change=(lambda: None) if deferred else None)

            def flush() -> None:
                content = store.snapshot()
                if content is not None:
                    store.write(content)

            store = open_store()
            for operation in operations:
                match operation:
                    case ("remember", agent, session_id, fingerprints, scope):
                        store.remember(agent, session_id, "/w", fingerprints, scope)
                        updated = float(999_999 + next(ticks))
                        for fingerprint in fingerprints:
                            key = _scope_prefix(scope) + fingerprint.hex()
                            model.pop(key, None)
                            model[key] = {"agent": agent, "sessionId": session_id, "cwd": "/w", "updated": updated}
                        while len(model) > 5:
                            del model[next(iter(model))]
                    case ("forget", session_id):
                        store.forget(session_id)
                        model = {k: v for k, v in model.items() if v["sessionId"] != session_id}
                    case ("offer", agent, offer):
                        store.remember_offer(agent, ["run", agent], offer)
                        offers[agent] = {"command": ["run", agent], "offer": offer}
                    case ("restart",):
                        flush()  # the service writes what changed on its way out
                        store = open_store()
                    case ("flush",):
                        flush()
                expected = {"version": 1, "entries": model, "offers": offers}
                if path.exists() and (not deferred or operation[0] in ("flush", "restart")):
                    assert json.loads(path.read_text()) == expected
                    assert path.read_bytes() == json.dumps(expected, separators=(",", ":")).encode()
                for agent in ("claude", "codex"):
                    assert store.has_agent(agent) == any(v["agent"] == agent for v in model.values())
        finally:
            store_module.time = original_time
