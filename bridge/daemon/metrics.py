"""The daemon's metrics, in the Prometheus text format (the ``prometheus_client`` library): ``GET /metrics`` on the
HTTP API, for a key with the ``metrics`` scope (or, when configured, for anyone on loopback).

Owns the registry: counters and histograms fed by the record every turn leaves (``bridge.service.usage``: turns by
agent, front and outcome, their durations and time to the first part, tool calls, tokens by key and agent, errors by
code, requests refused by limit), by what the service tells an audit log (permission decisions by who decided,
agent processes that exited), and the state read at each scrape (sessions by agent, agent processes, editor
connections, HTTP turns running, draining). Nothing of a conversation's content, and no label that grows with use
but the keys' names (a label per key, agent, front and outcome).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from bridge.service.composition import BridgeService
from bridge.service.usage import TurnRecord

__all__ = ["CONTENT_TYPE", "DaemonMetrics"]

CONTENT_TYPE = prometheus_client.CONTENT_TYPE_LATEST
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]  # *_created: noise for counters here

# Seconds: a turn from a tenth of a second (a cached answer) to ten minutes (an agent at work).
TURN_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
FIRST_PART_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class DaemonMetrics:
    """``observe`` is a ``Recorder`` (every turn's record); ``exposition()`` is what ``/metrics`` answers."""

    def __init__(self, service: BridgeService, *, http_running: Callable[[], int] = lambda: 0) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        self.turns = Counter(
            "lmbridge_turns", "Turns, by agent, front and outcome (a stop reason, cancelled, error, refused)",
            ["agent", "front", "outcome"], registry=registry,
        )  # fmt: skip
        self.turn_seconds = Histogram(
            "lmbridge_turn_seconds", "How long turns took, from the request to the last part",
            ["agent", "front"], buckets=TURN_BUCKETS, registry=registry,
        )  # fmt: skip
        self.first_part_seconds = Histogram(
            "lmbridge_first_part_seconds", "Time from a turn's request to its first part",
            ["agent", "front"], buckets=FIRST_PART_BUCKETS, registry=registry,
        )  # fmt: skip
        self.tool_calls = Counter(
            "lmbridge_tool_calls", "Calls of the client's tools handed to it, by agent", ["agent"], registry=registry
        )
        self.tokens = Counter(
            "lmbridge_tokens",
            "Tokens turns used, by key, agent and kind (input, output, cached; total includes estimated)",
            ["key", "agent", "kind"],
            registry=registry,
        )
        self.errors = Counter("lmbridge_errors", "Turns that failed, by error code", ["code"], registry=registry)
        self.refused = Counter(
            "lmbridge_refused", "Requests refused by a key's limit, by limit", ["limit"], registry=registry
        )
        self.permissions = Counter(
            "lmbridge_permissions",
            "Permission requests answered, by agent, decision (the option's kind, or cancelled) and who decided "
            "(client, policy, lmbridge)",
            ["agent", "decision", "decided_by"],
            registry=registry,
        )
        self.agent_exits = Counter(
            "lmbridge_agent_exits",
            "Agent processes that exited, by agent; crashed: under their sessions",
            ["agent", "crashed"],
            registry=registry,
        )
        registry.register(_State(service, http_running))

    def event(self, name: str, fields: dict[str, Any]) -> None:
        """What the service tells an audit log, counted: permission decisions and agent processes that exited."""
        if name == "permission":
            self.permissions.labels(fields["agent"], fields["decision"], fields["decided_by"]).inc()
        elif name == "agent_exited":
            self.agent_exits.labels(fields["agent"], "true" if fields.get("sessions_lost") else "false").inc()

    def observe(self, record: TurnRecord) -> None:
        agent, front = record.agent, record.front or "other"
        self.turns.labels(agent, front, record.outcome).inc()
        if record.outcome == "refused":
            self.refused.labels(record.limit or "other").inc()
            return
        self.turn_seconds.labels(agent, front).observe(record.seconds)
        if record.first_part_seconds is not None:
            self.first_part_seconds.labels(agent, front).observe(record.first_part_seconds)
        if record.tool_calls:
            self.tool_calls.labels(agent).inc(record.tool_calls)
        if record.error_code is not None:
            self.errors.labels(str(record.error_code)).inc()
        for kind, count in (
            ("input", record.input_tokens),
            ("output", record.output_tokens),
            ("cached", record.cached_tokens),
            ("total", record.total_tokens),
        ):
            if count:
                self.tokens.labels(record.key, agent, kind).inc(count)
        if record.estimated and record.total_tokens:
            self.tokens.labels(record.key, agent, "estimated").inc(record.total_tokens)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _State(Collector):
    """What is true at the moment of the scrape."""

    def __init__(self, service: BridgeService, http_running: Callable[[], int]) -> None:
        self._service = service
        self._http_running = http_running

    def collect(self) -> Iterator[Any]:
        service = self._service
        yield _by_agent("lmbridge_sessions", "Open ACP sessions", [s.agent_id for s in service.router.sessions])
        yield _by_agent("lmbridge_agent_processes", "Agent processes running", [p.id for p in service.pool.processes])
        yield GaugeMetricFamily("lmbridge_editor_connections", "Editors connected", value=service.connection_count())
        yield GaugeMetricFamily("lmbridge_http_turns_running", "HTTP API turns running", value=self._http_running())
        yield GaugeMetricFamily(
            "lmbridge_conversations_owing", "Conversations in the middle of something", value=service.owing
        )
        yield GaugeMetricFamily("lmbridge_draining", "1 while the daemon drains", value=int(service.draining))


def _by_agent(name: str, documentation: str, agents: list[str]) -> GaugeMetricFamily:
    """A gauge with one sample per agent: how many times it appears in ``agents``."""
    gauge = GaugeMetricFamily(name, f"{documentation}, by agent", labels=["agent"])
    for agent in sorted(set(agents)):
        gauge.add_metric([agent], agents.count(agent))
    return gauge
