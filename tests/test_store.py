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
