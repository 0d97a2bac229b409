"""``lmbridge test``: scenario files run against an ACP agent through a real ``lmbridge stdio``.

Owns the run: one fresh bridge (and agent process) per scenario, its turns in order, the turn expectations, the
conformance checks over the agent's wire once the bridge has shut down, ``--record`` transcripts, and the exit
status (0 only when every scenario passed; 1 when one failed; 2 for unusable arguments or scenario files).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import trio

from .checks import ProbeResult, probe_negotiation, run_checks
from .driver import AgentUnderTest, DriverError, open_driver, resolve_agent
from .expect import Failure, check_turn
from .report import ConsoleReport, ScenarioResult, write_json, write_junit
from .scenario import CHECK_NAMES, Scenario, ScenarioError, load_scenario, parse_checks
from .validation import JsonSchema, load_json_schema

__all__ = ["RunOptions", "ScenarioResult", "collect_scenarios", "main", "run_scenario", "run_scenarios"]


@dataclass
class RunOptions:
    agent_id: str | None = None
    agent_cmd: str | None = None
    config: str | None = None
    checks: tuple[str, ...] | None = None  # overrides the scenarios' own
    schema: JsonSchema | None = None
    record: str | None = None
    artifacts: str | None = None
    log_level: str = "info"
    workspace: str | None = None  # overrides the scenarios' [editor] workspace


async def run_scenario(
    scenario: Scenario, options: RunOptions, probes: dict[str, ProbeResult] | None = None, *, slug: str | None = None
) -> ScenarioResult:
    """Run one scenario. ``slug`` names its transcript and artifacts directory (default: the file's stem)."""
    started = time.monotonic()
    slug = slug or _slug(scenario)
    file = scenario.file
    result = ScenarioResult(scenario, None)
    try:
        agent = _agent_for(scenario, options)
    except (DriverError, ScenarioError) as exc:
        result.failures.append(Failure(file, "scenario", "agent", "an agent to test", str(exc)))
        return result
    except Exception as exc:  # a configuration error, most likely
        result.failures.append(Failure(file, "scenario", "agent", "an agent to test", f"{type(exc).__name__}: {exc}"))
        return result
    result.agent = agent
    if options.artifacts:
        work = Path(options.artifacts) / slug
        if work.exists():
            shutil.rmtree(work)
        work.mkdir(parents=True)
        result.artifacts = str(work)
        await _run_in(work, scenario, options, result, probes, slug)
    else:
        with tempfile.TemporaryDirectory(prefix="lmbridge-test-") as tmp:
            await _run_in(Path(tmp), scenario, options, result, probes, slug)
    result.seconds = time.monotonic() - started
    return result


async def _run_in(
    work: Path,
    scenario: Scenario,
    options: RunOptions,
    result: ScenarioResult,
    probes: dict[str, ProbeResult] | None,
    slug: str,
) -> None:
    file = scenario.file
    agent = result.agent
    assert agent is not None
    tools = {t.name: t for t in scenario.tools}
    workspace = options.workspace or scenario.workspace
    driver = None
    try:
        async with open_driver(
            agent,
            work,
            timeouts=scenario.timeouts,
            thinking=scenario.thinking,
            acp_updates=scenario.acp_updates,
            workspace=workspace,
            permission_policy=scenario.permission_policy,
            log_level=options.log_level,
        ) as driver:
            for index, turn in enumerate(scenario.turns):
                offered = [tools[n] for n in turn.tools] if turn.tools is not None else list(scenario.tools)
                outcome = await driver.turn(
                    turn.user,
                    tools=offered,
                    permission_tool=turn.permission_tool,
                    answer_permission=partial(scenario.permission_answer_for, turn),
                    cancel=turn.cancel,
                    new_conversation=turn.new_conversation,
                    max_rounds=turn.max_rounds,
                    reverse_results=turn.reverse_results,
                    number=turn.number,
                )
                result.turns.append(outcome)
                failures = check_turn(file, turn, outcome)
                if failures:
                    result.turn_failures[turn.number] = failures
                if outcome.timeout is not None:
                    result.not_run = [t.number for t in scenario.turns[index + 1 :]]
                    break
            for problem in await driver.settle():
                result.failures.append(
                    Failure(file, "after the last turn", "settle", "every cancelled prompt answered", problem)
                )
    except DriverError as exc:
        result.failures.append(Failure(file, "scenario", "lmbridge", "a working lmbridge stdio", str(exc)))
        done = {t.number for t in result.turns}
        result.not_run = [t.number for t in scenario.turns if t.number not in done]
    if driver is None:
        return
    checks = (
        options.checks
        if options.checks is not None
        else (scenario.checks if scenario.checks is not None else CHECK_NAMES)
    )
    probe = None
    if "initialize" in checks and probes is not None:
        key = agent.describe()
        if key not in probes:
            probes[key] = await probe_negotiation(agent, scenario.timeouts.initialize)
        probe = probes[key]
    labels = {t.number: t.label for t in scenario.turns}
    result.checks = run_checks(
        tuple(checks), driver.log, file=file, turn_labels=labels, schema=options.schema, probe=probe
    )
    if options.record:
        from .transcript import build_transcript, write_transcript

        path = Path(options.record) / f"{slug}.ndjson"
        secrets = dict(agent.config.env) if agent.config is not None else {}
        private = {
            str(work.resolve()): "<work>",
            str(Path(workspace).resolve() if workspace else (work / "workspace").resolve()): "<workspace>",
            # Where this lmbridge and its Python live differs between machines, not between runs of the agent.
            sys.executable: "<python>",
            str(Path(__file__).resolve().parents[2]): "<lmbridge>",
        }
        transcript = build_transcript(
            driver.follower.events, scenario=scenario.name, agent_conn=agent.conn, secrets=secrets, paths=private
        )
        write_transcript(transcript, path)
        result.transcript = str(path)


def _agent_for(scenario: Scenario, options: RunOptions) -> AgentUnderTest:
    if options.agent_cmd:
        return resolve_agent(command=options.agent_cmd, config_path=options.config)
    if options.agent_id:
        return resolve_agent(options.agent_id, config_path=options.config)
    ref = scenario.agent
    if ref is None:
        return resolve_agent("demo")
    if ref.command is not None:
        return resolve_agent(command=[ref.command, *ref.args], env=ref.env, cwd=ref.cwd, authenticate=ref.authenticate)
    return resolve_agent(ref.id, config_path=options.config)


def _slug(scenario: Scenario) -> str:
    base = scenario.path.stem if scenario.path is not None else scenario.name
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in base)


def collect_scenarios(paths: list[str]) -> list[Path]:
    """Scenario files named, and the ``*.toml`` files of directories named (sorted)."""
    found: list[Path] = []
    for name in paths:
        path = Path(name)
        if path.is_dir():
            found.extend(sorted(p for p in path.glob("*.toml") if p.is_file()))
        else:
            found.append(path)
    return found


async def run_scenarios(
    scenarios: list[Scenario], options: RunOptions, *, on_result: Any = None
) -> list[ScenarioResult]:
    probes: dict[str, ProbeResult] = {}
    results = []
    used: set[str] = set()
    for scenario in scenarios:
        slug = base = _slug(scenario)
        number = 1
        while slug in used:  # two files of the same name in different directories
            number += 1
            slug = f"{base}-{number}"
        used.add(slug)
        outcome = await run_scenario(scenario, options, probes, slug=slug)
        results.append(outcome)
        if on_result is not None:
            on_result(outcome)
    return results


def main(args: argparse.Namespace) -> int:
    out = sys.stdout
    try:
        checks = parse_checks(args.check.split(","), None, "--check") if args.check is not None else None
        schema = load_json_schema(args.acp_schema)
        files = collect_scenarios(args.scenarios)
        if not files:
            print("lmbridge test: no scenario files found", file=sys.stderr)
            return 2
        scenarios = [load_scenario(f) for f in files]
    except ScenarioError as exc:
        print(f"lmbridge test: {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:
        print(f"lmbridge test: cannot read the ACP schema: {exc}", file=sys.stderr)
        return 2
    options = RunOptions(
        agent_id=args.agent,
        agent_cmd=args.agent_cmd,
        config=args.config,
        checks=checks,
        schema=schema,
        record=args.record,
        artifacts=args.artifacts,
        log_level=args.log_level,
        workspace=os.path.abspath(args.workspace) if args.workspace else None,
    )
    if args.record:
        os.makedirs(args.record, exist_ok=True)
    console = ConsoleReport(out, verbose=args.verbose)
    started = time.monotonic()
    try:
        results = trio.run(lambda: run_scenarios(scenarios, options, on_result=console.scenario))
    except KeyboardInterrupt:
        print("lmbridge test: interrupted", file=sys.stderr)
        return 130
    seconds = time.monotonic() - started
    console.summary(results, seconds)
    if args.junit:
        write_junit(results, args.junit, seconds)
    if args.json:
        write_json(results, args.json, seconds)
    return 0 if all(r.passed for r in results) else 1
