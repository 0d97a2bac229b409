"""Principals kept apart, in-process: the router never lets one principal's request continue, reopen or read another's
session, whatever histories they send; the keys file and the key ring; editor models and stored responses per
principal. (Both fronts over real sockets: tests/test_team_keys.py.)"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from fakes import FakeAgent, FakeAgentProvider, FakeInfo, answer_next_prompt, assistant, user
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.config import EditorModelSettings, ToolSettings
from bridge.daemon.keys import OWNER, KeyRing, KeysFile, keys_path_for, parse_expiry
from bridge.daemon.security import Refusal, ServeError
from bridge.http.openai_responses import ResponseStore
from bridge.service.editor_models import EditorModels
from bridge.service.principals import Principal
from bridge.service.shared_models import SharedModel
from session.router import RouterSettings, SessionRouter, TurnRequest
from session.store import SessionStore
from wire.cancel import CancelRequest
from wire.errors import ScopeMissing, UnknownModel
from wire.observe.logs import get_logger

PRINCIPALS = ("owner", "key:a", "key:b")
OPENINGS = ("hello", "fix the bug", "hello")  # alike on purpose: principals who open their conversations alike

# -- the router: a property over interleaved principals ---------------------------------------------------------------

# A step: a principal, which of its conversations (by opening), and whether it goes on with it or asks the same again.
_steps = st.lists(
    st.tuples(st.sampled_from(PRINCIPALS), st.integers(0, len(OPENINGS) - 1), st.sampled_from(["next", "again"])),
    min_size=1,
    max_size=14,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=_steps)
def test_interleaved_principals_with_identical_histories_never_share_a_session(tmp_path: Path, steps: Any) -> None:
    # Every principal sends the very histories the others send (the same openings, the same answers), sessions are
    # closed by a cap of two and reopened from the state file: whichever way they interleave, no session serves
    # two principals.
    state = tmp_path / f"state-{os.urandom(4).hex()}.json"
    used_by: dict[str, set[str]] = {principal: set() for principal in PRINCIPALS}

    async def main() -> None:
        agent = FakeAgent()
        agent.info = FakeInfo(can_load=True)
        router = SessionRouter(
            FakeAgentProvider(agent), RouterSettings(max_sessions=2, store=SessionStore(state)), log=get_logger()
        )
        histories: dict[tuple[str, int], list[dict[str, Any]]] = {}
        async with trio.open_nursery() as nursery:
            await nursery.start(router.run)
            nursery.start_soon(_answer_with_the_session_id, agent)
            for number, (principal, which, how) in enumerate(steps):
                history = histories.get((principal, which), [])
                if how == "next" or not history:
                    history = [*history, user(OPENINGS[which] if not history else f"turn {number}")]
                parts: list[dict[str, Any]] = []

                async def sink(part: dict[str, Any], parts: list[dict[str, Any]] = parts) -> None:
                    parts.append(part)

                request = TurnRequest("fake", history, "/work", scope="", principal=principal)
                with trio.fail_after(600):  # on the mock clock: a turn that never ends fails, it does not hang
                    outcome = await router.chat(request, sink, CancelRequest())
                assert outcome.stop_reason == "end_turn"
                # What it was told came from this session (a retry may be answered from what was kept: the same).
                text = "".join(part["value"] for part in parts if part["type"] == "text")
                if text:  # (a history answered already, sent again, may get nothing new)
                    used_by[principal].add(text.removeprefix("from "))
                    histories[(principal, which)] = [*history, assistant(text)]
            await router.close_all("test over")
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    for principal, sessions in used_by.items():
        for other, theirs in used_by.items():
            if other != principal:
                assert not sessions & theirs, (principal, other, steps)


async def _answer_with_the_session_id(agent: FakeAgent) -> None:
    """Answers every prompt with the id of the session it came to (a loaded session keeps its id)."""
    while True:
        await answer_next_prompt(agent, "end_turn", lambda session_id: f"from {session_id}")


async def _ignore(part: dict[str, Any]) -> None:
    pass


# -- the keys file and the key ring -----------------------------------------------------------------------------------


def test_a_key_is_shown_once_and_only_its_digest_is_stored(tmp_path: Path) -> None:
    keys = KeysFile(tmp_path / "state" / "keys.json")
    record, key = keys.add("alice", scopes=["chat", "models"], agents=["demo"])
    text = keys.path.read_text()
    assert key.startswith("lmb_") and len(key) > 40
    assert key not in text and record.digest in text
    assert stat.S_IMODE(keys.path.stat().st_mode) == 0o600
    assert [r.name for r in keys.load()] == ["alice"]
    assert keys.load()[0].principal() == Principal(
        f"key:{record.id}", "alice", frozenset({"chat", "models"}), frozenset({"demo"})
    )
    assert sorted(p.name for p in keys.path.parent.iterdir()) == ["keys.json", "keys.json.lock"]  # no temporary left


def test_keys_file_mistakes_say_what_to_do(tmp_path: Path) -> None:
    keys = KeysFile(tmp_path / "keys.json")
    keys.add("alice")
    with pytest.raises(ServeError, match="revoke it first"):
        keys.add("alice")
    with pytest.raises(ServeError, match="scopes are: chat, models, metrics, admin"):
        keys.add("bob", scopes=["chat", "root"])
    with pytest.raises(ServeError, match="key name"):
        keys.add("-bob")
    with pytest.raises(ServeError, match="'owner' is the token file's holder"):
        keys.add("owner")
    with pytest.raises(ServeError, match="no key named 'carol' \\(keys: alice\\)"):
        keys.revoke("carol")
    keys.path.chmod(0o644)
    with pytest.raises(ServeError, match="chmod 600"):
        keys.load()
    keys.path.chmod(0o600)
    keys.path.write_text("{not json")
    with pytest.raises(ServeError, match="not JSON"):
        keys.load()


def test_expiry_is_a_duration_or_a_date() -> None:
    assert parse_expiry("90m", now=1000.0) == 1000.0 + 5400
    assert parse_expiry("2d", now=0.0) == 2 * 86400
    assert parse_expiry("1970-01-02") == 86400
    assert parse_expiry("1970-01-01T01:00:00+01:00") == 0
    with pytest.raises(ServeError, match="give a duration"):
        parse_expiry("soon")


def test_the_key_ring_knows_the_owner_and_each_key_until_it_is_revoked_or_expires(tmp_path: Path) -> None:
    keys = KeysFile(tmp_path / "keys.json")
    t = time.time()  # the times below: seconds after now
    alice, alice_key = keys.add("alice", now=t)
    bob, bob_key = keys.add("bob", expires=t + 5000, now=t)
    ring = KeyRing("the-owner-token-0123456789", keys)
    assert ring.authenticate(b"the-owner-token-0123456789", now=t + 2000) is OWNER
    assert ring.authenticate(alice_key.encode(), now=t + 2000).id == f"key:{alice.id}"
    assert ring.authenticate(bob_key.encode(), now=t + 2000).name == "bob"
    for wrong in (None, b"", b"lmb_guess", alice_key.encode()[:-1]):
        with pytest.raises(Refusal) as refused:
            ring.authenticate(wrong, now=t + 2000)
        assert refused.value.status == 401
    # bob's key expires: refused, and reported ended once.
    with pytest.raises(Refusal, match="expired"):
        ring.authenticate(bob_key.encode(), now=t + 5000)
    changes = ring.refresh(now=t + 5000)
    assert ([r.name for r in changes.expired], changes.revoked, changes.added) == (["bob"], [], [])
    assert ring.refresh(now=t + 5001).expired == []
    # alice's is revoked (by another process: the file is replaced): refused from the next request on, and
    # reported ended by the next refresh.
    KeysFile(keys.path).revoke("alice")
    with pytest.raises(Refusal):
        ring.authenticate(alice_key.encode(), now=t + 5002)
    assert [r.name for r in ring.refresh(now=t + 5003).revoked] == ["alice"]
    assert ring.refresh(now=t + 5004).revoked == []
    _carol, _carol_key = keys.add("carol")
    assert [r.name for r in ring.refresh(now=t + 5005).added] == ["carol"]
    assert ring.name_of(f"key:{_carol.id}") == "carol" and ring.name_of("owner") == "owner"
    # When a key was last used goes to the sidecar (the keys file is the operator's alone).
    ring.flush_used()
    assert keys.last_used() == {alice.id: t + 2000, bob.id: t + 2000}


def test_what_was_let_in_is_checked_again_and_a_broken_keys_file_refuses_every_key(tmp_path: Path) -> None:
    keys = KeysFile(tmp_path / "keys.json")
    _alice, alice_key = keys.add("alice")
    ring = KeyRing("the-owner-token-0123456789", keys)
    # Added, used and revoked between two refreshes: what it let in is still found out.
    _dave, dave_key = keys.add("dave")
    dave = ring.authenticate(dave_key.encode())
    keys.revoke("dave")
    assert not ring.valid(dave) and ring.valid(OWNER)
    assert ring.valid(ring.authenticate(alice_key.encode()))
    # A keys file broken by hand: every key is refused (a key removed by that edit must not live on), not the owner.
    keys.path.write_text("{broken")
    with pytest.raises(Refusal):
        ring.authenticate(alice_key.encode())
    with pytest.raises(ServeError, match="not JSON"):
        ring.refresh()
    assert ring.authenticate(b"the-owner-token-0123456789") is OWNER
    keys.path.unlink()
    _erin, erin_key = keys.add("erin")  # mended: its keys work again
    assert ring.authenticate(erin_key.encode()).name == "erin"
    with pytest.raises(Refusal):
        ring.authenticate(alice_key.encode())  # (alice's entry went with the broken file)


def test_stored_scopes_of_principals_and_of_a_one_user_process_never_meet() -> None:
    from session.router import _stored_scope

    assert _stored_scope("", "editor\0code") == "editor\0code"  # what earlier versions stored
    forged = json.dumps(["key:a", "standup"])  # a one-user process's client naming its conversation like this
    assert _stored_scope("", forged) != _stored_scope("key:a", "standup")
    assert _stored_scope("key:a", "x") != _stored_scope("key:b", "x")


def test_a_missing_scope_is_refused_with_what_the_key_has() -> None:
    reader = Principal("key:r", "reader", frozenset({"models"}))
    reader.require("models")
    with pytest.raises(ScopeMissing, match="lacks the 'chat' scope \\(it has: models\\)") as missing:
        reader.require("chat")
    assert missing.value.code == -32006 and missing.value.data == {"scope": "chat"}


def test_the_keys_command(tmp_path: Path) -> None:
    token = tmp_path / "state" / "token"
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "xdg")}

    def keys(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "bridge", "keys", "--token-file", str(token), *args]
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)

    added = keys("add", "alice", "--scope", "chat", "--expires", "30d", "--json")
    assert added.returncode == 0, added.stderr
    shown = json.loads(added.stdout)
    assert shown["key"].startswith("lmb_") and shown["scopes"] == ["chat"] and "sha256" not in shown
    plain = keys("add", "bob")
    assert plain.returncode == 0 and plain.stdout.startswith("lmb_") and "shown once" in plain.stderr
    listed = keys("list")
    assert listed.returncode == 0
    assert "alice" in listed.stdout and "bob" in listed.stdout and shown["key"] not in listed.stdout
    assert keys_path_for(token).exists()
    assert keys("revoke", "alice").returncode == 0
    assert [row["name"] for row in json.loads(keys("list", "--json").stdout)] == ["bob"]
    again = keys("revoke", "alice")
    assert again.returncode == 2 and "no key named 'alice'" in again.stderr
    bad = keys("add", "carol", "--scope", "everything")
    assert bad.returncode == 2 and "scopes are:" in bad.stderr


# -- what else is kept per principal ---------------------------------------------------------------------------------


class _Link:
    def __init__(self, principal_id: str, label: str) -> None:
        self.principal_id = principal_id
        self.label = label

    async def editor_chat(self, params: dict[str, Any], on_part: Any, cancel: CancelRequest) -> Any:
        raise AssertionError("not called here")


def test_each_principal_sees_and_names_only_its_own_editors_models() -> None:
    models = EditorModels(EditorModelSettings(), ToolSettings(), own_models=list, log=get_logger())
    alices, bobs = _Link("key:a", "alice's editor"), _Link("key:b", "bob's editor")
    models.share(alices, [SharedModel("gpt-x", "GPT X")])
    models.share(bobs, [SharedModel("gpt-x", "GPT X"), SharedModel("claude-y", "Claude Y")])
    assert [(name, link) for name, _m, link in models.listed("key:a")] == [("editor/gpt-x", alices)]
    # bob's first gpt-x is "editor/gpt-x" too: his names do not depend on alice's editors
    assert [name for name, _m, _l in models.listed("key:b")] == ["editor/gpt-x", "editor/claude-y"]
    assert models.resolve("editor/gpt-x", "key:b")[1] is bobs
    with pytest.raises(UnknownModel):
        models.resolve("editor/claude-y", "key:a")
    with pytest.raises(UnknownModel):
        models.resolve("editor/gpt-x@2", "key:a")  # another's editor, even by its number
    assert len(models.listed()) == 3  # the daemon itself sees all


def test_a_stored_response_is_its_principals_only() -> None:
    store = ResponseStore()
    store.put({"id": "resp_1"}, None, [user("alice's secret")], "", "key:a")
    assert store.get("resp_1", "key:a") == {"id": "resp_1"}
    assert store.get("resp_1", "key:b") is None
    assert store.history("resp_1", "key:a")[0] == [user("alice's secret")]
    with pytest.raises(Exception, match="is not stored here"):
        store.history("resp_1", "key:b")


def test_with_isolation_per_key_each_principal_has_its_own_agent_process() -> None:
    from bridge.acp.pool import _key, _principal_of
    from bridge.config import AgentConfig

    per_key = AgentConfig(id="a", name="A", command="agent", isolation="key")
    shared = per_key._replace(isolation="agent")

    class Editor:
        principal_id = "key:alice"

    alice, bob = _key(per_key, "key:alice"), _key(per_key, "key:bob")
    assert alice != bob and _key(per_key, Editor()) == alice  # an editor connection counts as its key
    assert _principal_of(alice) == "key:alice"
    assert _key(per_key, None) == _key(per_key, "") == _key(shared, "key:alice") == ("a", "")  # one user; default
