"""The ACP registry's agents, as lmbridge knows them: a snapshot shipped with lmbridge (``registry.json``), replaced
by a newer copy in the user's cache once ``lmbridge agents update`` could fetch one. For each agent: how it is
distributed (``npx`` or ``uvx`` package with its version and the arguments that start ACP, or a binary), and so the
``[agents.<id>]`` table that starts it.

Reads both the snapshot's shape and the registry's own (``registry.json``: ``{"agents": [{"id", "name",
"distribution": {"npx": {"package", "args"}, ...}}]}``).
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "REGISTRY_URL",
    "NotInstallable",
    "RegistryAgent",
    "RegistryError",
    "cache_path",
    "fetch_registry",
    "load_registry",
    "parse_registry",
]

REGISTRY_URL = "https://cdn.agentclientprotocol.com/registry/v1/latest/registry.json"
SNAPSHOT = Path(__file__).with_name("registry.json")
MAX_BYTES = 8 * 1024 * 1024


class RegistryError(Exception):
    """The registry could not be read or fetched; the message says why and what stays in use."""


class NotInstallable(Exception):
    """The agent cannot be started from a package: the message says what to do instead."""


@dataclass(frozen=True)
class RegistryAgent:
    id: str
    name: str
    website: str
    kind: str  # npx | uvx | binary | unknown
    package: str = ""  # with its version: "pkg@1.2.3" (npx), "pkg==1.2.3" (uvx)
    command: str = ""  # uvx: the package's executable, when not its default
    args: tuple[str, ...] = ()
    note: str = ""

    def launch(self) -> tuple[str, list[str]]:
        """The command and arguments that start the agent (npx or uvx), or ``NotInstallable``."""
        if self.kind == "npx":
            return "npx", ["-y", self.package, *self.args]
        if self.kind == "uvx":
            if self.command:
                return "uvx", ["--from", self.package, self.command, *self.args]
            return "uvx", [self.package, *self.args]
        where = f" ({self.website})" if self.website else ""
        if self.kind == "binary":
            raise NotInstallable(
                f"{self.name} is distributed as a binary: download it from its release page{where}, then set "
                f'[agents.{self.id}] command = "/path/to/it" (and args) in the config file yourself'
            )
        raise NotInstallable(f"the registry names no package for {self.name}{where}: see its documentation")

    def installable_here(self) -> str | None:
        """None when its launcher is on PATH; else what is missing."""
        launcher = {"npx": "npx", "uvx": "uvx"}.get(self.kind)
        if launcher is None:
            return "a binary" if self.kind == "binary" else "no package known"
        if shutil.which(launcher) is None:
            return f"{launcher} not found (install {'Node.js' if launcher == 'npx' else 'uv'})"
        return None


def parse_registry(document: Any) -> list[RegistryAgent]:
    """The agents of a snapshot or of the registry's own ``registry.json``; ``RegistryError`` when it is neither."""
    agents = document.get("agents") if isinstance(document, dict) else None
    if not isinstance(agents, list):
        raise RegistryError('not a registry: expected an object with an "agents" list')
    parsed = []
    for entry in agents:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            continue
        distribution = entry.get("distribution") or {}
        kind, package, command = "unknown", "", ""
        args: tuple[str, ...] = ()
        for candidate in ("npx", "uvx", "binary"):
            spec = distribution.get(candidate) if isinstance(distribution, dict) else None
            if isinstance(spec, dict):
                kind = candidate
                package = str(spec.get("package", ""))
                command = str(spec.get("command", ""))
                args = tuple(str(a) for a in spec.get("args") or ())
                break
        if kind in ("npx", "uvx") and not package:
            kind = "unknown"
        website = str(entry.get("website") or entry.get("repository") or "")
        parsed.append(
            RegistryAgent(
                entry["id"], str(entry.get("name", entry["id"])), website, kind, package, command, args,
                str(entry.get("note", "")),
            )
        )  # fmt: skip
    return parsed


def cache_path(environ: dict[str, str] | None = None) -> Path:
    environ = dict(os.environ) if environ is None else environ
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lmbridge" / "registry.json"


def load_registry(cache: Path | None = None) -> tuple[list[RegistryAgent], str]:
    """The agents, and where they come from: the fetched copy in the cache when there is a readable one, else the
    snapshot shipped with lmbridge."""
    cache = cache or cache_path()
    if cache.exists():
        try:
            return parse_registry(json.loads(cache.read_text(encoding="utf-8"))), f"fetched copy {cache}"
        except (OSError, ValueError, RegistryError):
            pass  # a damaged copy: the snapshot is still good
    document = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    return parse_registry(document), f"snapshot of {document.get('snapshot', '?')} shipped with lmbridge"


def fetch_registry(url: str = REGISTRY_URL, cache: Path | None = None, timeout: float = 15.0) -> int:
    """Fetch the registry into the cache (0600); the number of agents. ``RegistryError`` when it cannot."""
    cache = cache or cache_path()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            data = response.read(MAX_BYTES + 1)
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise RegistryError(f"cannot fetch {url}: {reason}; the registry lmbridge had stays in use") from exc
    if len(data) > MAX_BYTES:
        raise RegistryError(f"{url}: larger than {MAX_BYTES // 1024 // 1024} MiB; not used")
    try:
        agents = parse_registry(json.loads(data))
    except ValueError as exc:
        raise RegistryError(f"{url}: not JSON ({exc}); not used") from exc
    cache.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temporary = cache.with_suffix(".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(temporary, cache)
    return len(agents)
