"""Running the kit: which requirements apply, the groups that decide them (one fresh agent process each, in
order, the initialize group first: its answer says what the agent advertises), the status of every selected
requirement, and the verdict. Produces a ``KitResult`` the reports render.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from bridge.config import AgentConfig, known_agent
from bridge.fakemodel.recipes import FOREIGN_ENV, point_at, read_call, shell_call
from bridge.fakemodel.server import Call, FakeModel, Turn, call, open_fake_model, say, stall

from .agent import AgentSpec
from .checks import GROUPS, PROBE_TOOL, GroupRun, Outcome, Settings, advertised, judge_transcripts, run_group
from .requirements import REQUIREMENTS, Requirement, Status, Tier

__all__ = ["KitResult", "Verdict", "run_kit", "select"]

TRANSCRIPT_LINES = 200  # of a failing requirement's group, the last lines kept in the report


@dataclass
class Verdict:
    conformant: bool
    summary: str
    blocked: str | None = None


@dataclass
class KitResult:
    settings: Settings
    requirements: list[Requirement]
    outcomes: dict[str, Outcome]
    groups: dict[str, GroupRun]
    started: float  # wall clock
    seconds: float
    initialize: dict[str, Any] = field(default_factory=dict)  # the agent's initialize result
    blocked: str | None = None

    def group_of(self, requirement: Requirement) -> GroupRun | None:
        return self.groups.get(requirement.group)

    def verdict(self) -> Verdict:
        failing: list[str] = []
        untested: list[str] = []
        for requirement in self.requirements:
            status = self.outcomes[requirement.id].status
            if requirement.tier in (Tier.MANDATORY, Tier.CAPABILITY) and status is Status.FAIL:
                failing.append(requirement.id)
            elif requirement.tier is Tier.MANDATORY and status is Status.NOT_TESTED:
                untested.append(requirement.id)
        if self.blocked:
            return Verdict(False, f"BLOCKED: {self.blocked}", self.blocked)
        if failing or untested:
            parts = []
            if failing:
                parts.append(f"{len(failing)} failed ({', '.join(failing)})")
            if untested:
                parts.append(f"{len(untested)} not tested ({', '.join(untested)})")
            return Verdict(False, "NOT CONFORMANT: " + "; ".join(parts))
        skipped = sum(1 for r in self.requirements if self.outcomes[r.id].status is Status.SKIPPED)
        tail = f" ({skipped} skipped: see each one's reason)" if skipped else ""
        return Verdict(True, f"CONFORMANT on {len(self.requirements) - skipped} requirement(s){tail}")


def select(patterns: list[str] | None, tiers: list[Tier] | None) -> list[Requirement]:
    """The requirements ``-k`` patterns (ids, glob or substring, any case) and ``--tier`` choose."""
    chosen = []
    for requirement in REQUIREMENTS:
        if tiers and requirement.tier not in tiers:
            continue
        if patterns and not any(_matches(requirement, pattern) for pattern in patterns):
            continue
        chosen.append(requirement)
    return chosen


def _matches(requirement: Requirement, pattern: str) -> bool:
    pattern = pattern.upper()
    return fnmatch.fnmatchcase(requirement.id, pattern) or fnmatch.fnmatchcase(requirement.id, f"*{pattern}*")


async def run_kit(settings: Settings, requirements: list[Requirement]) -> KitResult:
    """Run the groups the requirements need. With ``--model fake``, the fake model runs beside them, and the agent
    is pointed at it by its recipe, from a private HOME removed afterwards."""
    if settings.model is None or settings.model.name != "fake":
        return await _run(settings, requirements)
    home = Path(tempfile.mkdtemp(prefix="lmbridge-conform-home-"))
    try:
        async with open_fake_model(default=say("pong", 1)) as fake:
            return await _run(_pointed_at(settings, fake, home), requirements)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _pointed_at(settings: Settings, fake: FakeModel, home: Path) -> Settings:
    argv = settings.spec.argv
    agent = known_agent(AgentConfig(id="conform", name="conform", command=argv[0], args=tuple(argv[1:])))
    pointed = point_at(agent, model_url=fake.base_url, home=home, project=settings.workspace)
    env = {name: value for name, value in settings.spec.env.items() if not FOREIGN_ENV.match(name)}
    env.update(pointed.env)
    env.update({name: value.replace("{model_url}", fake.base_url) for name, value in settings.agent_env.items()})
    spec = AgentSpec((*argv, *pointed.args), env, settings.spec.cwd or pointed.cwd)

    def before(kind: str, values: Mapping[str, str]) -> None:
        fake.script[:] = _script(kind, values, agent)

    assert settings.model is not None
    model = dataclasses.replace(settings.model, before=before, requests=lambda: fake.requests)
    auth_method = settings.auth_method or pointed.authenticate
    mode = settings.session_mode or pointed.session_mode
    return dataclasses.replace(settings, spec=spec, model=model, auth_method=auth_method, session_mode=mode)


def _script(kind: str, values: Mapping[str, str], agent: str | None) -> list[Turn]:
    """The fake model's turns for one kind of prompt (after them, every request is answered "pong")."""
    if kind == "long":
        return [stall("counting: 1 2 3 ")]
    if kind == "tool":
        return [call(Call("", {"text": values["token"]}, offered=PROBE_TOOL)), say("done", 1)]
    if kind == "shell":
        return [call(shell_call(agent, values["command"])), say("done", 1)]
    if kind == "read":
        return [call(read_call(agent, values["path"])), say("done", 1)]
    return [say("pong", 1)]


async def _run(settings: Settings, requirements: list[Requirement]) -> KitResult:
    started_wall = time.time()
    started = trio.current_time()
    outcomes: dict[str, Outcome] = {}
    groups: dict[str, GroupRun] = {}
    wanted = {r.group for r in requirements}
    result = KitResult(settings, requirements, outcomes, groups, started_wall, 0.0)

    # The initialize group always runs: what the agent advertises decides what applies.
    first = await run_group("initialize", settings, {})
    groups["initialize"] = first
    capabilities = first.capabilities or {}
    result.blocked = first.blocked
    unusable = None if first.initialize is not None or first.blocked else (first.problem or "initialize failed")
    for requirement in requirements:
        if requirement.group in ("initialize", "all"):
            continue
        if unusable is not None:  # no process of it will get further: each would wait out the start-up timeout
            outcomes[requirement.id] = Outcome(requirement.id, Status.NOT_TESTED, f"not started: {unusable}")
            continue
        reason = _skip_reason(requirement, settings, capabilities, result.blocked)
        if reason:
            outcomes[requirement.id] = Outcome(requirement.id, Status.SKIPPED, reason)
    for name in GROUPS:  # in their order (initialize first, run above), shutdown last
        if name == "initialize":
            continue
        pending = [r for r in requirements if r.group == name and r.id not in outcomes]
        if name not in wanted or not pending:
            continue
        run = await run_group(name, settings, capabilities)
        groups[name] = run
        if run.blocked and not result.blocked:
            result.blocked = run.blocked
    for run in groups.values():
        for requirement_id, outcome in run.outcomes.items():
            outcomes.setdefault(requirement_id, outcome)
    if "all" in wanted:
        outcomes.update({k: v for k, v in judge_transcripts(list(groups.values())).items() if k not in outcomes})
    for requirement in requirements:
        if requirement.id in outcomes:
            continue
        decider = groups.get(requirement.group)
        if decider is not None and decider.blocked:
            outcomes[requirement.id] = Outcome(requirement.id, Status.SKIPPED, f"blocked: {decider.blocked}")
        else:
            why = (decider.problem if decider else None) or "not reached"
            outcomes[requirement.id] = Outcome(requirement.id, Status.NOT_TESTED, why)
    result.initialize = first.initialize or {}
    result.seconds = trio.current_time() - started
    return result


def _skip_reason(
    requirement: Requirement, settings: Settings, capabilities: dict[str, Any], blocked: str | None
) -> str | None:
    if blocked:
        return f"blocked: {blocked}"
    if requirement.needs_model and settings.model is None:
        return "needs the agent's model to act (run with --model fake or own; directives for the demo agent)"
    gate = requirement.capability or requirement.applies_if
    if gate and not advertised(capabilities, gate):
        return f"not advertised (agentCapabilities.{gate})"
    if requirement.group == "logout" and not settings.logout:
        return "logout ends the agent's login on this machine: run with --logout to test it"
    return None
