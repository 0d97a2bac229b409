"""The kit's reports: the terminal table (grouped by tier), JSON (every requirement with its citation, status and
detail; a failure carries its group's wire transcript and the agent's stderr tail), JUnit XML (a testcase per
requirement) and Markdown (a table for a README or a pull request)."""

from __future__ import annotations

import json
from typing import Any
from xml.etree import ElementTree

from bridge import __version__

from .kit import TRANSCRIPT_LINES, KitResult
from .requirements import Requirement, Status, Tier

__all__ = ["junit", "markdown", "terminal", "to_json"]

_HELD_AGAINST = (Tier.MANDATORY, Tier.CAPABILITY)


def _agent_name(result: KitResult) -> str:
    info = result.initialize.get("agentInfo")
    if isinstance(info, dict) and info.get("name"):
        return f"{info.get('title') or info['name']} {info.get('version', '')}".strip()
    return result.settings.spec.describe()


def terminal(result: KitResult, *, verbose: bool = False) -> str:
    model = result.settings.model.name if result.settings.model else "none"
    lines = [f"lmbridge conform {__version__} — {_agent_name(result)} — model: {model} — {result.seconds:.1f} s"]
    for tier in Tier:
        chosen = [r for r in result.requirements if r.tier is tier]
        if not chosen:
            continue
        lines.append("")
        lines.append(tier.value)
        for requirement in chosen:
            outcome = result.outcomes[requirement.id]
            lines.append(f"  {outcome.status.value:<10} {requirement.id:<15} {requirement.title}")
            show = outcome.status is not Status.PASS or verbose or tier is Tier.INFORMATIONAL
            if outcome.detail and show:
                lines.append(f"  {'':<10} {'':<15} {outcome.detail}")
    verdict = result.verdict()
    lines += ["", f"Verdict: {verdict.summary}"]
    methods = [m.get("id") for m in result.initialize.get("authMethods") or () if isinstance(m, dict)]
    if verdict.blocked and methods:
        lines.append(f"         its auth methods: {', '.join(map(str, methods))}")
    return "\n".join(lines)


def _requirement_json(result: KitResult, requirement: Requirement) -> dict[str, Any]:
    outcome = result.outcomes[requirement.id]
    group = result.group_of(requirement)
    entry: dict[str, Any] = {
        "id": requirement.id,
        "tier": requirement.tier.value,
        "area": requirement.area,
        "title": requirement.title,
        "citations": [{"url": c.url, "text": c.text} for c in requirement.cites],
        "capability": requirement.capability,
        "needsModel": requirement.needs_model,
        "group": requirement.group,
        **outcome.to_json(),
        "groupSeconds": round(group.seconds, 3) if group else None,
    }
    if outcome.status in (Status.FAIL, Status.NOT_TESTED):
        runs = [group] if group else list(result.groups.values())
        entry["transcript"] = {
            f"{run.group}:{label}": [line.to_json() for line in lines[-TRANSCRIPT_LINES:]]
            for run in runs
            for label, lines in run.transcripts.items()
        }
        entry["stderrTail"] = {run.group: run.stderr_tail for run in runs}
        requests = {run.group: run.model_requests for run in runs if run.model_requests}
        if requests:
            entry["modelRequests"] = requests  # what the fake model was asked: API, path, the tools offered
    return entry


def to_json(result: KitResult) -> dict[str, Any]:
    verdict = result.verdict()
    counts: dict[str, dict[str, int]] = {}
    for requirement in result.requirements:
        tier = counts.setdefault(requirement.tier.value, {s.value: 0 for s in Status})
        tier[result.outcomes[requirement.id].status.value] += 1
    return {
        "lmbridgeConform": 1,
        "lmbridgeVersion": __version__,
        "agent": {
            "command": list(result.settings.spec.argv),
            "info": result.initialize.get("agentInfo"),
            "protocolVersion": result.initialize.get("protocolVersion"),
            "capabilities": result.initialize.get("agentCapabilities"),
            "authMethods": result.initialize.get("authMethods"),
        },
        "model": result.settings.model.name if result.settings.model else "none",
        "started": result.started,
        "seconds": round(result.seconds, 3),
        "verdict": {"conformant": verdict.conformant, "summary": verdict.summary, "blocked": verdict.blocked},
        "counts": counts,
        "groups": {
            name: {"seconds": round(run.seconds, 3), "problem": run.problem, "blocked": run.blocked}
            for name, run in result.groups.items()
        },
        "requirements": [_requirement_json(result, r) for r in result.requirements],
    }


def junit(result: KitResult) -> bytes:
    """A testsuite with a testcase per requirement. Only what the verdict holds against the agent is a failure;
    an ADVISORY or INFORMATIONAL finding is a skipped case whose message says so."""
    suite = ElementTree.Element("testsuite", name=f"lmbridge conform: {_agent_name(result)}")
    failures = skipped = 0
    for requirement in result.requirements:
        outcome = result.outcomes[requirement.id]
        case = ElementTree.SubElement(
            suite,
            "testcase",
            classname=f"conform.{requirement.tier.value.lower()}.{requirement.area.lower()}",
            name=f"{requirement.id} {requirement.title}",
            time=f"{(result.group_of(requirement) or _Zero).seconds:.3f}",
        )
        held = requirement.tier in _HELD_AGAINST
        if (outcome.status is Status.FAIL and held) or (
            outcome.status is Status.NOT_TESTED and requirement.tier is Tier.MANDATORY
        ):
            failures += 1
            failure = ElementTree.SubElement(case, "failure", message=f"{outcome.status.value}: {outcome.detail}")
            failure.text = "\n".join(f"{c.url}\n  {c.text}" for c in requirement.cites)
        elif outcome.status is not Status.PASS:
            skipped += 1
            label = outcome.status.value if held else f"{requirement.tier.value} {outcome.status.value}"
            ElementTree.SubElement(case, "skipped", message=f"{label}: {outcome.detail}")
    suite.set("tests", str(len(result.requirements)))
    suite.set("failures", str(failures))
    suite.set("skipped", str(skipped))
    suite.set("time", f"{result.seconds:.3f}")
    text: bytes = ElementTree.tostring(suite, encoding="utf-8", xml_declaration=True)
    return text


class _Zero:
    seconds = 0.0


def markdown(result: KitResult) -> str:
    verdict = result.verdict()
    model = result.settings.model.name if result.settings.model else "none"
    lines = [
        f"### ACP conformance: {_agent_name(result)}",
        "",
        f"**{verdict.summary}** — lmbridge conform {__version__}, model: {model}",
        "",
        "| requirement | tier | status | |",
        "|---|---|---|---|",
    ]
    for requirement in result.requirements:
        outcome = result.outcomes[requirement.id]
        detail = outcome.detail.replace("|", "\\|").replace("\n", " ")
        text = requirement.title + (f" — {detail}" if detail and outcome.status is not Status.PASS else "")
        lines.append(f"| {requirement.id} | {requirement.tier.value} | {outcome.status.value} | {text} |")
    return "\n".join(lines) + "\n"


def write_json(result: KitResult, path: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(to_json(result), handle, indent=2, ensure_ascii=False)
        handle.write("\n")
