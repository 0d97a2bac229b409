"""A daemon shared by a team, over real sockets on 127.0.0.1: each key its own principal on both fronts (the HTTP API
through the official SDK, the WebSocket editor protocol), conversations that cannot be continued, read or listed
across keys, scopes, and a key revoked while its turn runs."""

from __future__ import annotations

import json
import stat
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import openai
import pytest
import trio
import trio_websocket
from conftest import HANG, processes_with_marker
from fakes import ScriptedEditorModel, user
from test_serve import Daemon, serving

from bridge.daemon.keys import KeysFile
from bridge.editor.client import EditorClient, connect_daemon
from wire.rpc.connection import ConnectionClosed, RpcError

pytestmark = pytest.mark.wire


@pytest.fixture
async def team(tmp_path: Path, agents_toml: Path, marker: str) -> AsyncIterator[tuple[Daemon, dict[str, str]]]:
    keys_file = KeysFile(tmp_path / "state" / "keys.json")  # beside the token file: found without an option
    keys = {name: keys_file.add(name)[1] for name in ("alice", "bob", "carol")}
    keys["reader"] = keys_file.add("reader", scopes=["models"])[1]
    async with serving(tmp_path, agents_toml, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0") as live:
        yield live, keys
    assert live.process.returncode == 0, live.stderr[-2000:]
    assert processes_with_marker(marker) == []
    for key in keys.values():
        assert key not in live.stderr  # no key in the logs


def _sdk(daemon: Daemon, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.http_url}/v1", api_key=key, max_retries=0, timeout=HANG)


@asynccontextmanager
async def _editor(daemon: Daemon, key: str, folder: Path, **initialize: Any) -> AsyncIterator[EditorClient]:
    async with connect_daemon(daemon.url, key) as client:
        with trio.fail_after(HANG):
            await client.initialize(clientInfo={"name": "code"}, workspaceFolders=[str(folder)], **initialize)
        yield client


async def test_a_key_never_continues_or_reads_another_keys_conversation_over_http(team: Any) -> None:
    daemon, keys = team
    alice, bob = _sdk(daemon, keys["alice"]), _sdk(daemon, keys["bob"])
    same = {"x-lmbridge-conversation": "standup"}  # the same conversation name too

    def ask(client: openai.OpenAI, messages: list[dict[str, str]]) -> str:
        reply = client.chat.completions.create(model="scripted", messages=messages, extra_headers=same)  # type: ignore[arg-type]
        return reply.choices[0].message.content or ""

    def converse() -> dict[str, str]:
        opening = [{"role": "user", "content": "/say good morning"}]
        first = ask(alice, opening)
        history = [*opening, {"role": "assistant", "content": first}]
        ask(alice, [*history, {"role": "user", "content": "/say alice's secret plan"}])
        # bob sends alice's opening and her first answer, word for word, and asks what the session heard.
        bobs = ask(bob, [*history, {"role": "user", "content": "/recall"}])
        # alice, asking the same, gets her session's memory: the check below can see a leak.
        alices = ask(
            alice,
            [
                *history,
                {"role": "user", "content": "/say alice's secret plan"},
                {"role": "assistant", "content": "alice's secret plan"},
                {"role": "user", "content": "/recall"},
            ],
        )
        return {"bob": bobs, "alice": alices}

    seen = await trio.to_thread.run_sync(converse)
    assert "alice's secret plan" in seen["alice"], seen
    assert "secret" not in seen["bob"], seen

    def responses() -> dict[str, Any]:
        stored = alice.responses.create(model="scripted", input="/say for alice only")
        out: dict[str, Any] = {"alice_get": alice.responses.retrieve(stored.id).id}
        try:
            bob.responses.create(model="scripted", input="/recall", previous_response_id=stored.id)
        except openai.BadRequestError as error:
            out["bob_continue"] = str(error)
        try:
            bob.responses.retrieve(stored.id)
        except openai.NotFoundError as error:
            out["bob_get"] = error.status_code
        return out

    seen = await trio.to_thread.run_sync(responses)
    assert seen["alice_get"].startswith("resp_")
    assert "is not stored here" in seen["bob_continue"]  # the same words as for an id that never was
    assert seen["bob_get"] == 404


async def test_a_key_never_continues_another_keys_conversation_over_the_editor_protocol(
    team: Any, tmp_path: Path
) -> None:
    daemon, keys = team
    folder = tmp_path / "shared-repo"  # the same editor, the same workspace: only the key differs
    folder.mkdir()
    opening = [user("/say good morning")]
    async with _editor(daemon, keys["alice"], folder) as alice:
        first = await alice.chat("scripted", opening)
        history = [*opening, first.assistant_message()]
        await alice.chat("scripted", [*history, user("/say alice's secret plan")])
    async with _editor(daemon, keys["bob"], folder) as bob:
        seen = await bob.chat("scripted", [*history, user("/recall")])
        status = await bob.request("daemon/status", {})
    assert "secret" not in seen.text, seen.text
    # bob (no admin scope) sees his own sessions, not alice's, and not the agents' processes
    assert status["sessions"] == {"scripted": 1} and "agents" not in status
    async with _editor(daemon, daemon.token, folder) as owner:
        everything = await owner.request("daemon/status", {})
    assert everything["sessions"] == {"scripted": 2}


async def test_an_editors_models_answer_its_own_keys_requests_only(team: Any, tmp_path: Path) -> None:
    daemon, keys = team
    model = ScriptedEditorModel("alices-model")
    async with connect_daemon(daemon.url, keys["alice"]) as editor:
        editor.serve_models(model.answer)
        with trio.fail_after(HANG):
            await editor.initialize(editorModels=model.models)

        def list_and_ask() -> dict[str, Any]:
            out: dict[str, Any] = {}
            for name in ("alice", "bob"):
                out[name] = [m.id for m in _sdk(daemon, keys[name]).models.list().data]
            out["alice_asks"] = (
                _sdk(daemon, keys["alice"])
                .chat.completions.create(model="editor/alices-model", messages=[{"role": "user", "content": "hi"}])
                .choices[0]
                .message.content
            )
            try:
                _sdk(daemon, keys["bob"]).chat.completions.create(
                    model="editor/alices-model", messages=[{"role": "user", "content": "hi"}]
                )
            except openai.NotFoundError as error:
                out["bob_asks"] = str(error)
            return out

        seen = await trio.to_thread.run_sync(list_and_ask)
    assert "editor/alices-model" in seen["alice"] and "editor/alices-model" not in seen["bob"]
    assert seen["alice_asks"] == "alices-model heard: hi"
    assert seen["bob_asks"].endswith(
        "'editor/alices-model' does not exist; models: demo, failing, missing, scripted, silent"
    )
    assert len(model.calls) == 1  # bob's request never reached alice's editor


async def test_scopes_are_enforced_on_both_fronts(team: Any, tmp_path: Path) -> None:
    daemon, keys = team
    reader = _sdk(daemon, keys["reader"])

    def try_it() -> dict[str, Any]:
        out: dict[str, Any] = {"models": [m.id for m in reader.models.list().data]}
        try:
            reader.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "hi"}])
        except openai.PermissionDeniedError as error:
            out["chat"] = error.status_code, str(error)
        return out

    seen = await trio.to_thread.run_sync(try_it)
    assert "scripted" in seen["models"]
    assert seen["chat"][0] == 403 and "lacks the 'chat' scope (it has: models)" in seen["chat"][1]
    async with _editor(daemon, keys["reader"], tmp_path) as editor:
        assert any(m["id"] == "scripted" for m in await editor.models())
        refused = (await editor.chat("scripted", [user("hi")])).error
    assert refused is not None and refused.code == -32006 and refused.data == {"scope": "chat"}


async def test_only_an_admin_key_may_define_agents_for_everyone(team: Any, tmp_path: Path) -> None:
    daemon, keys = team
    agents = {"sneaky": {"command": "/bin/sh", "args": ["-c", "touch pwned"], "prestart": True}}
    async with connect_daemon(daemon.url, keys["alice"]) as client:
        with trio.fail_after(HANG), pytest.raises(RpcError) as refused:
            await client.initialize(agents=agents, workspaceFolders=[str(tmp_path)])
    assert refused.value.code == -32006 and refused.value.data == {"scope": "admin"}
    async with _editor(daemon, keys["bob"], tmp_path) as bob:
        assert "sneaky" not in {m["id"] for m in await bob.models()}
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


async def test_a_revoked_key_is_refused_and_its_running_turns_end(team: Any, tmp_path: Path) -> None:
    daemon, keys = team
    carol = _sdk(daemon, keys["carol"])
    outcome: dict[str, Any] = {}

    def long_turn() -> None:
        stream = carol.chat.completions.create(
            model="scripted", messages=[{"role": "user", "content": "/say started\n/sleep 600000"}], stream=True
        )
        outcome["stream"] = stream
        said = ""
        for chunk in stream:
            said += (chunk.choices[0].delta.content or "") if chunk.choices else ""
            if said:
                outcome.setdefault("first", said)
        outcome["text"] = said

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.to_thread.run_sync, long_turn)
        try:
            async with _editor(daemon, keys["carol"], tmp_path) as editor:
                with trio.fail_after(HANG):
                    while not outcome.get("first"):
                        await trio.sleep(0.05)  # polling what the SDK's thread has read: the turn is running
                KeysFile(tmp_path / "state" / "keys.json").revoke("carol")
                with trio.fail_after(HANG):  # the stream ends (cancelled) once the daemon has seen the revocation
                    while "text" not in outcome:
                        await trio.sleep(0.05)
                with trio.fail_after(HANG), pytest.raises(ConnectionClosed):  # the editor's connection is closed
                    await editor.models()
        finally:
            if "text" not in outcome and "stream" in outcome:
                outcome["stream"].close()  # a check failed: the SDK's thread must not read for ever
    assert outcome["text"].startswith("started")

    def again() -> int:
        try:
            carol.models.list()
        except openai.AuthenticationError as error:
            return error.status_code
        return 200

    assert await trio.to_thread.run_sync(again) == 401
    log = daemon.stderr
    assert "key revoked or expired" in log and "key=carol" in log
    assert json.dumps(keys["carol"])[1:-1] not in log


@pytest.mark.smoke
async def test_a_key_over_its_limits_is_refused_before_any_work_and_other_keys_are_not(
    tmp_path: Path, agents_toml: Path, marker: str
) -> None:
    config = tmp_path / "limited.toml"
    config.write_text(
        agents_toml.read_text()
        + """
[limits.keys.alice]
requests_per_minute = 1

[limits.keys.bob]
concurrent_turns = 1

[limits.keys.carol]
daily_tokens = 1000
"""
    )
    keys_file = KeysFile(tmp_path / "state" / "keys.json")
    keys = {name: keys_file.add(name)[1] for name in ("alice", "bob", "carol", "dave")}
    hello = [{"role": "user", "content": "/say hello"}]

    def refusal(client: openai.OpenAI, content: str = "/say hello", model: str = "scripted") -> tuple[int, str, str]:
        try:
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}])
        except openai.RateLimitError as error:
            body = error.body if isinstance(error.body, dict) else {}
            return error.status_code, error.response.headers.get("retry-after", ""), str(body.get("message"))
        return 200, "", ""

    async with serving(tmp_path, config, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0") as daemon:
        alice, bob, carol, dave = (_sdk(daemon, keys[name]) for name in ("alice", "bob", "carol", "dave"))

        # alice: one request a minute, on both fronts together.
        assert await trio.to_thread.run_sync(refusal, alice) == (200, "", "")
        status, retry, message = await trio.to_thread.run_sync(refusal, alice, "/say hello", "scripted/demo-large")
        assert status == 429 and 1 <= int(retry) <= 60 and "requests_per_minute" in message
        async with _editor(daemon, keys["alice"], tmp_path) as editor:
            refused = (await editor.chat("scripted", [user("/say hello")])).error
        assert refused is not None and refused.code == -32004
        assert refused.data["name"] == "requests_per_minute" and refused.data["limit"] == 1
        assert await trio.to_thread.run_sync(refusal, dave) == (200, "", "")  # no limits: never refused

        # carol: a budget of 1000 tokens a day; her turn reports 1501 (admitted under it, so it finishes).
        assert await trio.to_thread.run_sync(refusal, carol, "/usage 1500 200000\n/say counted") == (200, "", "")
        status, retry, message = await trio.to_thread.run_sync(refusal, carol)
        assert status == 429 and 1 <= int(retry) <= 86400 and "1501 tokens today" in message

        # bob: one turn at a time; a second waits for the first to end.
        opened: dict[str, Any] = {}

        def long_turn() -> None:
            stream = bob.chat.completions.create(
                model="scripted", messages=[{"role": "user", "content": "/say started\n/sleep 600000"}], stream=True
            )
            opened["stream"] = stream
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    opened["first"] = True
                    return

        with trio.fail_after(HANG):
            await trio.to_thread.run_sync(long_turn)
        try:
            status, retry, message = await trio.to_thread.run_sync(refusal, bob)
            assert (status, retry) == (429, "1") and "concurrent_turns" in message
            assert await trio.to_thread.run_sync(refusal, dave) == (200, "", "")
        finally:
            opened["stream"].close()  # the client goes away: its turn is cancelled, its slot freed
        with trio.fail_after(HANG):
            while await trio.to_thread.run_sync(refusal, bob) != (200, "", ""):
                await trio.sleep(0.05)  # polling: the daemon sees the disconnect and ends the turn
        assert await trio.to_thread.run_sync(lambda: bob.chat.completions.create(model="scripted", messages=hello))
    assert daemon.process.returncode == 0, daemon.stderr[-2000:]
    assert processes_with_marker(marker) == []

    # Every turn left its row in the usage ledger, every refusal too; nothing of what was said.
    ledger = tmp_path / "state" / "usage.db"
    report = await trio.run_process(
        [sys.executable, "-m", "bridge", "usage", "--ledger", str(ledger), "--since", "1d", "--json"],
        capture_stdout=True,
    )
    rows = {row["group"]: row for row in json.loads(report.stdout)["rows"]}
    assert (rows["alice"]["turns"], rows["alice"]["refused"]) == (1, 2)  # refused on HTTP and the editor protocol
    assert (rows["carol"]["turns"], rows["carol"]["refused"], rows["carol"]["totalTokens"]) == (1, 1, 1501)
    assert rows["carol"]["estimatedTokens"] == 0  # reported by the agent
    assert rows["bob"]["cancelled"] == 1 and rows["bob"]["turns"] >= 3 and rows["bob"]["refused"] >= 1
    assert rows["dave"]["turns"] == 2 and rows["dave"]["estimatedTokens"] == rows["dave"]["totalTokens"] > 0
    assert b"alice's" not in ledger.read_bytes() and b"hello" not in ledger.read_bytes()
    by_agent = await trio.run_process(
        [sys.executable, "-m", "bridge", "usage", "--ledger", str(ledger), "--since", "1d", "--by", "agent", "--json"],
        capture_stdout=True,
    )
    agents = {row["group"]: row for row in json.loads(by_agent.stdout)["rows"]}
    # alice's HTTP request named a model of the agent: refused before its turn was set up, it is still the agent's.
    assert set(agents) == {"scripted"} and agents["scripted"]["refused"] >= 4
    # A group the ledger does not have is a usage error that lists the ones it has (the help names the same).
    wrong = await trio.run_process(
        [sys.executable, "-m", "bridge", "usage", "--ledger", str(ledger), "--by", "person"],
        capture_stderr=True,
        check=False,
    )
    assert wrong.returncode == 2
    assert wrong.stderr.decode().strip() == "lmbridge usage: --by 'person': one of agent, day, front, key, model"

    # A restarted daemon goes on from the ledger: carol's budget for today is still spent.
    async with serving(tmp_path, config, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0") as daemon:
        status, _retry, message = await trio.to_thread.run_sync(refusal, _sdk(daemon, keys["carol"]))
        assert status == 429 and "1501 tokens today" in message


async def test_the_audit_log_says_who_did_what_and_never_a_key(tmp_path: Path, agents_toml: Path, marker: str) -> None:
    keys_file = KeysFile(tmp_path / "state" / "keys.json")
    keys = {name: keys_file.add(name)[1] for name in ("alice", "bob")}
    permission_tool = {"type": "function", "function": {"name": "acp_agent_action", "parameters": {"type": "object"}}}
    async with serving(tmp_path, agents_toml, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0") as daemon:
        alice = _sdk(daemon, keys["alice"])

        def decide() -> str:
            messages: list[Any] = [{"role": "user", "content": "/permission rm -rf build\n/say removed"}]
            asked = alice.chat.completions.create(model="scripted", messages=messages, tools=[permission_tool])  # type: ignore[list-item]
            (call,) = asked.choices[0].message.tool_calls or []
            messages += [
                asked.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "allow once"},
            ]
            done = alice.chat.completions.create(model="scripted", messages=messages, tools=[permission_tool])  # type: ignore[list-item]
            return done.choices[0].message.content or ""

        assert "removed" in await trio.to_thread.run_sync(decide)

        def refused() -> int:
            count = 0
            for wrong in ("lmb_not-a-key", "lmb_not-a-key", keys["alice"][:-1]):
                try:
                    _sdk(daemon, wrong).models.list()
                except openai.AuthenticationError:
                    count += 1
            return count

        assert await trio.to_thread.run_sync(refused) == 3
        with pytest.raises(trio_websocket.HandshakeError):  # and once on the editor protocol's socket
            headers = [(b"authorization", b"Bearer lmb_not-a-key")]
            async with trio_websocket.open_websocket_url(daemon.url, extra_headers=headers):
                pass
        keys_file.revoke("bob")
        keys_file.add("carol", scopes=["models"])
        audit_path = tmp_path / "state" / "audit.log"
        with trio.fail_after(HANG):
            while "key_revoked" not in audit_path.read_text() or "key_added" not in audit_path.read_text():
                await trio.sleep(0.05)  # polling: the daemon looks at the keys file once a second
    assert daemon.process.returncode == 0, daemon.stderr[-2000:]
    assert processes_with_marker(marker) == []

    assert stat.S_IMODE(audit_path.stat().st_mode) == 0o600
    text = audit_path.read_text()
    events = [json.loads(line) for line in text.splitlines()]
    kinds = [event["event"] for event in events]
    assert kinds[0] == "daemon_started" and kinds[-1] == "daemon_stopped"
    (decision,) = [event for event in events if event["event"] == "permission"]
    assert decision["key"] == "alice" and decision["agent"] == "scripted" and decision["title"] == "rm -rf build"
    assert (decision["decision"], decision["decided_by"]) == ("allow_once", "client")
    assert {(e["event"], e["key"]) for e in events if e["event"].startswith("key_")} == {
        ("key_revoked", "bob"),
        ("key_added", "carol"),
    }
    (refusals,) = [event for event in events if event["event"] == "credential_refused"]
    assert refusals["count"] == 4 and refusals["peer"] == "127.0.0.1"  # counted over both fronts, one line
    started = [event for event in events if event["event"] == "agent_started"]
    exited = [event for event in events if event["event"] == "agent_exited"]
    assert started and len(exited) == len(started) and all(event["sessions_lost"] == 0 for event in exited)
    for key in keys.values():
        assert key not in text and key[:-1] not in text  # neither the keys nor what was presented


async def test_with_isolation_per_key_each_key_has_its_own_agent_process(
    tmp_path: Path, agents_toml: Path, marker: str
) -> None:
    config = tmp_path / "per-key.toml"
    config.write_text(
        agents_toml.read_text().replace('name = "Scripted test agent"', 'name = "Scripted"\nisolation = "key"')
    )
    keys_file = KeysFile(tmp_path / "state" / "keys.json")
    keys = {name: keys_file.add(name)[1] for name in ("alice", "bob")}
    async with serving(tmp_path, config, "--listen", "127.0.0.1:0") as daemon:
        for n, name in enumerate(("alice", "bob", "alice")):
            async with _editor(daemon, keys[name], tmp_path) as editor:
                assert (await editor.chat("scripted", [user(f"/say conversation {n} of {name}")])).error is None
        async with _editor(daemon, daemon.token, tmp_path) as owner:
            status = await owner.request("daemon/status", {})
    scripted = [agent for agent in status["agents"] if agent["id"] == "scripted"]
    assert len(scripted) == 2 and len({agent["pid"] for agent in scripted}) == 2, status["agents"]
    assert sorted(agent["sessions"] for agent in scripted) == [1, 2]  # alice's two conversations share hers
    assert processes_with_marker(marker) == []
