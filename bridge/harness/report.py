"""Reports of ``lmbridge test``: the console (one line per scenario, then each failure as expected / got / where),
JUnit XML (a testsuite per scenario, a testcase per turn and per check) and JSON (everything, including what the
editor saw in each round).

Owns the result of a scenario run (``ScenarioResult``, which ``runner`` fills) and its presentation.
"""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import IO, Any

from .checks import CheckResult
from .driver import AgentUnderTest, TurnResult
from .expect import Failure
from .scenario import Scenario

__all__ = ["ConsoleReport", "ScenarioResult", "write_json", "write_junit"]

_MARK = {"passed": "ok", "failed": "FAILED", "skipped": "skipped"}


@dataclass
class ScenarioResult:
    scenario: Scenario
    agent: AgentUnderTest | None
    turns: list[TurnResult] = field(default_factory=list)
    turn_failures: dict[int, list[Failure]] = field(default_factory=dict)
    not_run: list[int] = field(default_factory=list)  # turns skipped after a timeout or a driver error
    checks: list[CheckResult] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)  # about the scenario as a whole
    seconds: float = 0.0
    transcript: str | None = None
    artifacts: str | None = None

    @property
    def all_failures(self) -> list[Failure]:
        out = list(self.failures)
        for number in sorted(self.turn_failures):
            out.extend(self.turn_failures[number])
        for check in self.checks:
            out.extend(check.failures)
        return out

    @property
    def passed(self) -> bool:
        return not self.all_failures

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.scenario.file,
            "name": self.scenario.name,
            "passed": self.passed,
            "agent": self.agent.describe() if self.agent else None,
            "seconds": round(self.seconds, 3),
            "turns": [
                {
                    **t.to_json(),
                    "passed": not self.turn_failures.get(t.number),
                    "failures": [f.to_json() for f in self.turn_failures.get(t.number, [])],
                }
                for t in self.turns
            ],
            "notRun": self.not_run,
            "checks": [c.to_json() for c in self.checks],
            "failures": [f.to_json() for f in self.all_failures],
            "transcript": self.transcript,
            "artifacts": self.artifacts,
        }


class ConsoleReport:
    def __init__(self, out: IO[str], *, verbose: bool = False) -> None:
        self.out = out
        self.verbose = verbose
        self._agent_shown: str | None = None

    def _line(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def scenario(self, result: ScenarioResult) -> None:
        agent = result.agent.describe() if result.agent else "?"
        if agent != self._agent_shown:
            self._line(f"agent: {agent}")
            self._agent_shown = agent
        checks = [c for c in result.checks if c.status != "skipped"]
        self._line(
            f"{'PASS' if result.passed else 'FAIL'}  {result.scenario.file} — {result.scenario.name} "
            f"({len(result.turns)} turn(s), {len(checks)} check(s), {result.seconds:.1f} s)"
        )
        if self.verbose:
            for turn in result.turns:
                failures = result.turn_failures.get(turn.number, [])
                label = next((t.label for t in result.scenario.turns if t.number == turn.number), f"turn {turn.number}")
                ending = f"error {turn.error['code']}" if turn.error else turn.stop_reason
                self._line(
                    f"      {'ok' if not failures else 'FAILED':6} {label}: {len(turn.rounds)} round(s), "
                    f"{ending}, {turn.seconds:.2f} s"
                )
            for check in result.checks:
                self._line(
                    f"      {_MARK[check.status]:6} check {check.name}" + (f": {check.note}" if check.note else "")
                )
        for number in result.not_run:
            self._line(f"      not run: turn {number}")
        for failure in result.all_failures:
            self._line(f"    ✗ {failure.file}: {failure.where}: {failure.what}")
            self._line(f"        expected: {failure.expected}")
            self._line(f"        got:      {failure.got}")
        if not result.passed and result.artifacts:
            self._line(f"      traces and lmbridge log: {result.artifacts}")
        if result.transcript:
            self._line(f"      transcript: {result.transcript}")

    def summary(self, results: list[ScenarioResult], seconds: float) -> None:
        passed = sum(r.passed for r in results)
        failed = len(results) - passed
        self._line(f"{len(results)} scenario(s): {passed} passed, {failed} failed ({seconds:.1f} s)")
        if failed and not any(r.artifacts for r in results):
            self._line("(run with --artifacts DIR to keep the wire traces and lmbridge's log of each scenario)")


class _CaseWriter:
    """Adds ``<testcase>`` elements to one ``<testsuite>``, counting them by outcome."""

    def __init__(self, suite: ET.Element, classname: str, counts: dict[str, int]) -> None:
        self._suite = suite
        self._classname = classname
        self._counts = counts

    def __call__(self, name: str, time_: float, failures: list[Any], skipped: str | None = None) -> None:
        element = ET.SubElement(self._suite, "testcase", classname=self._classname, name=name, time=f"{time_:.3f}")
        self._counts["tests"] += 1
        if failures:
            self._counts["failures"] += 1
            failure = ET.SubElement(element, "failure", message=failures[0].message()[:500])
            failure.text = "\n".join(f.message() for f in failures)
        elif skipped is not None:
            self._counts["skipped"] += 1
            ET.SubElement(element, "skipped", message=skipped)


def write_junit(results: list[ScenarioResult], path: str, seconds: float) -> None:
    root = ET.Element("testsuites", name="lmbridge test", time=f"{seconds:.3f}")
    totals = {"tests": 0, "failures": 0, "skipped": 0}
    for result in results:
        suite = ET.SubElement(
            root, "testsuite", name=result.scenario.name, file=result.scenario.file, time=f"{result.seconds:.3f}"
        )
        counts = {"tests": 0, "failures": 0, "skipped": 0}
        case = _CaseWriter(suite, os.path.splitext(os.path.basename(result.scenario.file))[0], counts)

        if result.failures:
            case("scenario", 0.0, result.failures)
        labels = {t.number: t.label for t in result.scenario.turns}
        for turn in result.turns:
            case(
                labels.get(turn.number, f"turn {turn.number}"), turn.seconds, result.turn_failures.get(turn.number, [])
            )
        for number in result.not_run:
            case(labels.get(number, f"turn {number}"), 0.0, [], skipped="not run")
        for check in result.checks:
            case(f"check {check.name}", 0.0, check.failures, skipped=check.note if check.status == "skipped" else None)
        for key, value in counts.items():
            suite.set(key, str(value))
            totals[key] += value
        out = ET.SubElement(suite, "system-out")
        out.text = "\n".join(
            filter(
                None,
                [
                    f"agent: {result.agent.describe() if result.agent else '?'}",
                    f"transcript: {result.transcript}" if result.transcript else "",
                    f"artifacts: {result.artifacts}" if result.artifacts else "",
                ],
            )
        )
    for key, value in totals.items():
        root.set(key, str(value))
    ET.indent(root)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def write_json(results: list[ScenarioResult], path: str, seconds: float) -> None:
    report = {
        "passed": all(r.passed for r in results),
        "seconds": round(seconds, 3),
        "scenarios": [r.to_json() for r in results],
    }
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=2, ensure_ascii=False)
        handle.write("\n")
