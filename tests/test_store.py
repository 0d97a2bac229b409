"""The session state file on its own: what is remembered is found again by the same agent and scope only."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from session.store import SessionStore


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
