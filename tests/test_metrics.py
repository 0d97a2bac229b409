"""/metrics over real sockets: scraped while turns of several keys run on both fronts, and its counters checked
against what was sent; who may read it."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest
import trio
from conftest import HANG, processes_with_marker
from fakes import user
from prometheus_client.parser import text_string_to_metric_families
from test_serve import Daemon, serving

from bridge.daemon.keys import KeysFile
from bridge.editor.client import connect_daemon

pytestmark = pytest.mark.wire

TOOL = {
    "type": "function",
    "function": {"name": "read_file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}},
}


def _scrape(daemon: Daemon, key: str | None) -> tuple[int, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    request = urllib.request.Request(f"{daemon.http_url}/metrics")
    if key is not None:
        request.add_header("authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=HANG) as reply:
            text = reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, {}
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return 200, samples


def _value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.mark.smoke
async def test_metrics_count_what_was_sent_while_turns_run(tmp_path: Path, agents_toml: Path, marker: str) -> None:
    config = tmp_path / "config.toml"
    config.write_text(agents_toml.read_text() + "\n[limits.keys.carol]\nconcurrent_turns = 1\n")
    keys_file = KeysFile(tmp_path / "state" / "keys.json")
    keys = {name: keys_file.add(name)[1] for name in ("alice", "bob", "carol")}
    keys["grafana"] = keys_file.add("grafana", scopes=["metrics"])[1]
    per_key, editor_turns = 6, 4
    async with serving(tmp_path, config, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0") as daemon:
        done = trio.Event()
        scrapes: list[dict[Any, float]] = []

        async def scrape_while_running() -> None:
            while not done.is_set():  # a Prometheus scraping as the load runs
                status, samples = await trio.to_thread.run_sync(_scrape, daemon, keys["grafana"])
                assert status == 200
                scrapes.append(samples)
                await trio.sleep(0.05)

        def conversation(name: str, n: int) -> None:
            client = openai.OpenAI(base_url=f"{daemon.http_url}/v1", api_key=keys[name], max_retries=0, timeout=HANG)
            messages: list[Any] = [{"role": "user", "content": f'/tool read_file {{"path": "{name}-{n}"}}'}]
            first = client.chat.completions.create(model="scripted", messages=messages, tools=[TOOL])  # type: ignore[list-item]
            (call,) = first.choices[0].message.tool_calls or []
            messages += [
                first.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": f"contents of {name}-{n}"},
            ]
            client.chat.completions.create(model="scripted", messages=messages, tools=[TOOL])  # type: ignore[list-item]

        async def editor() -> None:
            async with connect_daemon(daemon.url, keys["bob"]) as client:
                with trio.fail_after(HANG):
                    await client.initialize(clientInfo={"name": "code"}, workspaceFolders=[str(tmp_path)])
                for n in range(editor_turns):
                    reply = await client.chat("scripted", [user(f"/usage 100 1000\n/say editor turn {n}")])
                    assert reply.error is None, reply.error

        with trio.fail_after(HANG * 2):
            async with trio.open_nursery() as scraping:
                scraping.start_soon(scrape_while_running)
                async with trio.open_nursery() as load:
                    for name in ("alice", "bob"):
                        for n in range(per_key):
                            load.start_soon(trio.to_thread.run_sync, conversation, name, n)
                    load.start_soon(editor)
                done.set()

        # carol, one turn at a time: her second at once is refused, and counted so.
        carol = openai.OpenAI(base_url=f"{daemon.http_url}/v1", api_key=keys["carol"], max_retries=0, timeout=HANG)
        opened: dict[str, Any] = {}

        def hold() -> None:
            stream = carol.chat.completions.create(
                model="scripted", messages=[{"role": "user", "content": "/say held\n/sleep 600000"}], stream=True
            )
            opened["stream"] = stream
            next(iter(stream))

        def second() -> int:
            try:
                carol.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "/say again"}])
            except openai.RateLimitError as error:
                return error.status_code
            return 200

        await trio.to_thread.run_sync(hold)
        try:
            assert await trio.to_thread.run_sync(second) == 429
        finally:
            opened["stream"].close()

        cancelled = ("lmbridge_turns_total", (("agent", "scripted"), ("front", "http"), ("outcome", "cancelled")))
        with trio.fail_after(HANG):
            while True:  # polling: the daemon sees carol's client go away and ends her held turn
                status, after = await trio.to_thread.run_sync(_scrape, daemon, keys["grafana"])
                assert status == 200
                if after.get(cancelled):
                    break
                await trio.sleep(0.05)
        # Who may read it: a key with the metrics scope (above); not a chat key, not without a key.
        assert (await trio.to_thread.run_sync(_scrape, daemon, keys["alice"]))[0] == 403
        assert (await trio.to_thread.run_sync(_scrape, daemon, None))[0] == 401
    assert daemon.process.returncode == 0, daemon.stderr[-2000:]
    assert processes_with_marker(marker) == []

    http_turns = 2 * per_key
    assert len(scrapes) >= 1
    assert _value(after, "lmbridge_turns_total", agent="scripted", front="http", outcome="tool_calls") == http_turns
    assert _value(after, "lmbridge_turns_total", agent="scripted", front="http", outcome="end_turn") == http_turns
    assert _value(after, "lmbridge_turns_total", agent="scripted", front="editor", outcome="end_turn") == editor_turns
    assert _value(after, "lmbridge_turns_total", agent="scripted", front="http", outcome="refused") == 1
    assert _value(after, "lmbridge_refused_total", limit="concurrent_turns") == 1
    assert _value(after, "lmbridge_tool_calls_total", agent="scripted") == http_turns
    assert _value(after, "lmbridge_turns_total", agent="scripted", front="http", outcome="cancelled") == 1
    assert _value(after, "lmbridge_turn_seconds_count", agent="scripted", front="http") == 2 * http_turns + 1
    assert _value(after, "lmbridge_first_part_seconds_count", agent="scripted", front="editor") == editor_turns
    # bob's editor turns reported 100 in and 1 out each; the HTTP turns reported nothing: estimated.
    assert _value(after, "lmbridge_tokens_total", key="bob", agent="scripted", kind="input") == 100 * editor_turns
    assert _value(after, "lmbridge_tokens_total", key="alice", agent="scripted", kind="input") == 0
    assert _value(after, "lmbridge_tokens_total", key="alice", agent="scripted", kind="estimated") > 0
    assert _value(after, "lmbridge_sessions", agent="scripted") >= 1
    assert _value(after, "lmbridge_agent_processes", agent="scripted") >= 1
    assert _value(after, "lmbridge_draining") == 0
    # The counters never went backwards between scrapes, and the last scrape during the load saw part of it.
    totals = [_value(s, "lmbridge_tool_calls_total", agent="scripted") for s in [*scrapes, after]]
    assert totals == sorted(totals)
    assert json.dumps(keys["alice"]) not in daemon.stderr


async def test_open_metrics_answers_loopback_clients_without_a_key(
    tmp_path: Path, agents_toml: Path, marker: str
) -> None:
    async with serving(
        tmp_path, agents_toml, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--open-metrics"
    ) as daemon:
        status, samples = await trio.to_thread.run_sync(_scrape, daemon, None)
    assert status == 200 and ("lmbridge_draining", ()) in samples
    assert processes_with_marker(marker) == []


def _record(**fields: Any) -> Any:
    from bridge.service.usage import TurnRecord

    row: dict[str, Any] = dict.fromkeys(TurnRecord._fields)
    row.update(time=0.0, principal="id-a", key="alice", front="http", agent="claude", model="claude", session="s")
    row.update(estimated=False, seconds=2.0, outcome="end_turn", tool_calls=0, limit="")
    row.update(fields)
    return TurnRecord(**row)


def test_the_dashboard_asks_only_for_what_the_daemon_exports() -> None:
    from bridge.config import parse_config
    from bridge.daemon.metrics import DaemonMetrics
    from bridge.service.composition import BridgeService
    from wire.observe.logs import get_logger

    metrics = DaemonMetrics(BridgeService(parse_config(""), log=get_logger()))
    metrics.observe(_record(input_tokens=10, output_tokens=5, total_tokens=15, first_part_seconds=0.5, tool_calls=2))
    metrics.observe(_record(outcome="error", error_code=-32002, total_tokens=40, estimated=True))
    metrics.observe(_record(outcome="refused", limit="daily_tokens", seconds=0.0))
    families = list(text_string_to_metric_families(metrics.exposition().decode()))
    exported = {sample.name: sample.labels for family in families for sample in family.samples}
    exported.update({family.name: {} for family in families if family.type == "gauge"})  # with no sample yet
    assert exported["lmbridge_refused_total"] == {"limit": "daily_tokens"}
    assert exported["lmbridge_errors_total"] == {"code": "-32002"}
    dashboard = json.loads((Path(__file__).parent.parent / "docs" / "grafana" / "lmbridge-dashboard.json").read_text())
    asked = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\blmbridge_[a-z_]+", target["expr"])
    }
    assert len(asked) >= 10 and asked <= set(exported), asked - set(exported)
