"""The registry sweep: every agent of the ACP registry that can be installed here (npm, PyPI), pinned, installed
into ``.conform-cache/`` and run through ``lmbridge conform --model fake``; the matrix is written into
docs/conformance.md between its sweep markers. ``make conform-sweep`` runs it; it is not part of ``make test``
(it installs about 3 GB).

An agent is pointed at the fake model by its recipe where lmbridge has one, else by the usual variables
(``OPENAI_BASE_URL``, ``ANTHROPIC_BASE_URL``, …); whatever does not read them runs as far as it goes without a
login, and what blocked it is in its row. Run one or a few: ``python tests/conform_sweep.py qwen cline``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".conform-cache"
INTEROP = ROOT / ".interop-cache"
DOC = ROOT / "docs" / "conformance.md"
START, END = "<!-- sweep:start -->", "<!-- sweep:end -->"
NODE = INTEROP / "node" / "node_modules" / ".bin"  # Node 24, for packages that need node >= 22
PYTHON = "/root/.pyenv/versions/3.13.0/bin/python3"  # several PyPI agents need Python >= 3.12
RUN_TIMEOUT = 1200.0


@dataclass(frozen=True)
class Candidate:
    id: str  # the registry's name for it
    name: str
    installer: str  # npm | pip | interop (pinned by the interop suite)
    package: str  # with its version
    command: tuple[str, ...]  # the executable (found in the install) and the arguments that start ACP
    auth: str | None = None  # an auth method that works against the fake model
    env: tuple[str, ...] = ()  # more --agent-env NAME=VALUE ({model_url}: the fake model's)
    extra: tuple[str, ...] = ()  # npm packages it needs beside it (its executable on PATH)

    @property
    def version(self) -> str:
        return re.split(r"@|==", self.package)[-1]


CANDIDATES = (
    Candidate(
        "claude", "Claude Agent", "interop", "@agentclientprotocol/claude-agent-acp@0.101.0", ("claude-agent-acp",)
    ),
    Candidate("codex", "Codex", "interop", "@zed-industries/codex-acp@0.16.0", ("codex-acp",)),
    Candidate("gemini", "Gemini CLI", "interop", "@google/gemini-cli@0.61.0", ("gemini", "--acp")),
    Candidate("opencode", "OpenCode", "interop", "opencode-ai@1.18.33", ("opencode", "acp")),
    Candidate("auggie", "Auggie CLI", "npm", "@augmentcode/auggie@0.36.0", ("auggie", "--acp")),
    Candidate("cline", "Cline", "npm", "cline@3.0.65", ("cline", "--acp")),
    Candidate("copilot", "GitHub Copilot", "npm", "@github/copilot@1.0.102", ("copilot", "--acp")),
    # 7.8.1's Linux package is not on npm (nor 7.7.9's main one): the latest release with both.
    Candidate("kilo", "Kilo", "npm", "@kilocode/cli@7.7.7", ("kilo", "acp")),
    Candidate("pi-acp", "pi ACP", "npm", "pi-acp@0.0.34", ("pi-acp",), extra=("@mariozechner/pi-coding-agent@0.73.1",)),
    Candidate("qoder", "Qoder CLI", "npm", "@qoder-ai/qodercli@1.1.52", ("qodercli", "--acp")),
    Candidate(
        "qwen",
        "Qwen Code",
        "npm",
        "@qwen-code/qwen-code@0.24.4",
        ("qwen", "--acp"),
        "openai",
        ("OPENAI_MODEL=fake-model",),
    ),
    Candidate("cursor", "Cursor (adapter)", "npm", "@blowmage/cursor-agent-acp@0.7.1", ("cursor-agent-acp",)),
    Candidate("crow", "crow-cli", "pip", "crow-cli==0.1.48", ("crow-cli", "acp")),
    Candidate(
        "fast-agent",
        "fast-agent",
        "pip",
        "fast-agent-mcp==0.10.48",
        ("fast-agent-acp",),
        env=("FAST_AGENT_MODEL=generic.fake-model", "GENERIC_BASE_URL={model_url}/v1", "GENERIC_API_KEY=fake"),
    ),
    Candidate("harn", "Harn", "pip", "harn==0.1.7", ("harn", "--mode", "acp")),
    Candidate("kimi", "Kimi CLI", "pip", "kimi-cli==1.52.0", ("kimi", "acp")),
    Candidate("minion", "Minion Code", "pip", "minion-code==0.1.45", ("mcode", "acp")),
    Candidate("vibe", "Mistral Vibe", "pip", "mistral-vibe==3.0.3", ("vibe-acp",)),
)


def install(candidate: Candidate) -> Path:
    """Install (once) and return the executable; ``RuntimeError`` saying why when it cannot be had."""
    if candidate.installer == "interop":
        folder = INTEROP / candidate.id / "node_modules" / ".bin"
        if not (folder / candidate.command[0]).exists():
            subprocess.run([sys.executable, str(ROOT / "tests" / "interop" / "installs.py"), candidate.id], check=True)
        return folder / candidate.command[0]
    stamp = CACHE / candidate.installer / f"{candidate.id}.installed"
    if candidate.installer == "npm":
        prefix = CACHE / "npm" / candidate.id
        executable = prefix / "node_modules" / ".bin" / candidate.command[0]
        command = ["npm", "install", "--prefix", str(prefix), "--no-fund", "--no-audit", candidate.package]
        if candidate.id == "kilo":  # its platform package is an optional dependency npm may skip
            command.append(f"@kilocode/cli-linux-x64@{candidate.version}")
        command += list(candidate.extra)
    else:
        venv = CACHE / "pip" / candidate.id
        executable = venv / "bin" / candidate.command[0]
        if not venv.exists():
            subprocess.run([PYTHON, "-m", "venv", str(venv)], check=True)
        command = [str(venv / "bin" / "pip"), "install", "-q", candidate.package]
    installed = stamp.read_text().strip() if stamp.exists() else ""
    if installed != " ".join([candidate.package, *candidate.extra]):
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            lines = [line for line in (done.stderr or done.stdout).splitlines() if "complete log" not in line]
            raise RuntimeError(f"install failed: {' '.join(lines[-2:])[:240]}")
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text(" ".join([candidate.package, *candidate.extra]))
    if not executable.exists():
        raise RuntimeError(f"installed, but no {candidate.command[0]} in it")
    return executable


def judge(candidate: Candidate) -> dict[str, object]:
    row: dict[str, object] = {"id": candidate.id, "name": candidate.name, "package": candidate.package}
    try:
        executable = install(candidate)
    except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
        return {**row, "verdict": "not installable", "blocked": str(exc)}
    report = CACHE / "reports" / f"{candidate.id}.json"
    report.parent.mkdir(parents=True, exist_ok=True)
    report.unlink(missing_ok=True)
    # --logout: with --model fake each agent runs from a private HOME the kit removes afterwards; nobody's login.
    command = [sys.executable, "-m", "bridge", "conform", "--model", "fake", "--logout", "--timeout", "60"]
    command += ["--report-json", str(report)]
    if candidate.installer != "interop":  # (the recipes choose their agents' directories)
        scratch = CACHE / "work" / candidate.id  # where it runs: some write into their working directory
        scratch.mkdir(parents=True, exist_ok=True)
        command += ["--agent-cwd", str(scratch)]
    if candidate.auth:
        command += ["--auth-method", candidate.auth]
    for pair in candidate.env:
        command += ["--agent-env", pair]
    command += ["--", str(executable), *candidate.command[1:]]
    path = os.pathsep.join([str(NODE), str(executable.parent), os.environ.get("PATH", "")])
    env = {**os.environ, "PATH": path}
    begun = time.monotonic()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {**row, "verdict": "timed out", "blocked": f"the kit did not finish in {RUN_TIMEOUT:g} s"}
    row["seconds"] = round(time.monotonic() - begun, 1)
    if not report.exists():
        return {**row, "verdict": "kit error", "blocked": (done.stderr or done.stdout).strip()[-300:]}
    return {**row, **summary(json.loads(report.read_text()))}


def summary(report: dict[str, object]) -> dict[str, object]:
    """A matrix row from a JSON report."""
    requirements = report["requirements"]
    assert isinstance(requirements, list)
    verdict = report["verdict"]
    assert isinstance(verdict, dict)
    agent = report["agent"]
    assert isinstance(agent, dict)
    counts = {}
    for tier in ("MANDATORY", "CAPABILITY", "ADVISORY", "INFORMATIONAL"):
        chosen = [r for r in requirements if r["tier"] == tier]
        passed = sum(1 for r in chosen if r["status"] == "PASS")
        judged = sum(1 for r in chosen if r["status"] in ("PASS", "FAIL"))
        counts[tier] = f"{passed}/{judged}"
    failing = _failing(requirements)
    info = agent.get("info") or {}
    methods = [m.get("id") for m in agent.get("authMethods") or () if isinstance(m, dict)]
    return {
        "verdict": _verdict(verdict, requirements),
        "blocked": verdict["blocked"] or "",
        "reported": f"{info.get('name', '?')} {info.get('version', '')}".strip() if isinstance(info, dict) else "",
        "counts": counts,
        "failing": failing,
        "auth": methods,
    }


def _failing(requirements: list[dict[str, Any]]) -> list[str]:
    """What failed or was not tested, each reason once with the requirements it stands for: an agent that hung or
    exited leaves dozens NOT_TESTED for one reason ("not started: " marks those of groups that never began)."""
    by_reason: dict[tuple[str, str], list[str]] = {}
    for requirement in requirements:
        status = str(requirement["status"])
        if status in ("FAIL", "NOT_TESTED"):
            reason = str(requirement["detail"]).removeprefix("not started: ")[:160] or status
            by_reason.setdefault((status, reason), []).append(str(requirement["id"]))
    return [f"{_named(ids)}: {reason}" for (_status, reason), ids in by_reason.items()]


def _named(ids: list[str]) -> str:
    return ", ".join(ids) if len(ids) <= 3 else f"{ids[0]} and {len(ids) - 1} more"


def _verdict(verdict: dict[str, object], requirements: list[dict[str, object]]) -> str:
    """The kit's verdict, with "incomplete" for a run that failed nothing held against the agent but could not
    test what it must (the agent hung or exited): acp-tck's rule calls that not conformant too."""
    if verdict["conformant"]:
        return "conformant"
    if verdict["blocked"]:
        return "blocked"
    held = [r for r in requirements if r["tier"] in ("MANDATORY", "CAPABILITY") and r["status"] == "FAIL"]
    return "not conformant" if held else "incomplete"


def render(rows: Sequence[dict[str, object]]) -> str:
    lines = [
        f"Swept {time.strftime('%Y-%m-%d')} with `make conform-sweep` (`lmbridge conform --model fake`). Counts"
        " are passed/judged per tier (MANDATORY, CAPABILITY, ADVISORY, INFORMATIONAL); skipped requirements are"
        " not counted.",
        "",
        "| agent | package | verdict | M | C | A | I | what failed or blocked it |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        counts = row.get("counts") or {}
        assert isinstance(counts, dict)
        cells = [counts.get(t, "") for t in ("MANDATORY", "CAPABILITY", "ADVISORY", "INFORMATIONAL")]
        failing = row.get("failing") or []
        assert isinstance(failing, list)
        why = "; ".join(str(f) for f in failing) or str(row.get("blocked") or "")
        if row.get("blocked") and failing:
            why = f"{row['blocked']} — " + why
        if row.get("auth"):
            why += f" (auth methods: {', '.join(str(a) for a in row['auth'])})"  # type: ignore[union-attr]
        why = why.replace("|", "\\|").replace("\n", " ")
        lines.append(
            f"| {row['name']} | `{row['package']}` | {row['verdict']} | {' | '.join(str(c) for c in cells)} | {why} |"
        )
    return "\n".join(lines)


def write(rows: Sequence[dict[str, object]]) -> None:
    text = DOC.read_text()
    before, _, rest = text.partition(START)
    _, _, after = rest.partition(END)
    DOC.write_text(f"{before}{START}\n{render(rows)}\n{END}{after}")


def main(argv: Sequence[str]) -> int:
    chosen = [c for c in CANDIDATES if not argv or c.id in argv]
    with ThreadPoolExecutor(max_workers=2) as pool:  # two cores: two agents at a time
        rows = list(pool.map(judge, chosen))
    previous = {}
    saved = CACHE / "reports" / "matrix.json"
    if saved.exists():
        previous = {row["id"]: row for row in json.loads(saved.read_text())}
        for agent, row in previous.items():  # earlier rows, judged again from their reports (the rules may be newer)
            report = CACHE / "reports" / f"{agent}.json"
            if report.exists() and row.get("counts"):
                row.update(summary(json.loads(report.read_text())))
    previous.update({row["id"]: row for row in rows})
    ordered = [previous[c.id] for c in CANDIDATES if c.id in previous]
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(ordered, indent=1))
    write(ordered)
    for row in rows:
        print(f"{row['id']:<12} {row['verdict']:<16} {row.get('blocked') or ''}"[:200])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
