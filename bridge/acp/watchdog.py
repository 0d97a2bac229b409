"""Nothing an agent started outlives lmbridge, even when lmbridge is killed with SIGKILL.

Owns a small watchdog process, started with the first agent: lmbridge tells it each agent's process group as it
starts and ends, over the watchdog's stdin. If lmbridge dies without stopping its agents (SIGKILL, a crash),
the watchdog reads end-of-file and stops those groups (SIGTERM, then SIGKILL after two seconds). An agent's own
EOF on stdin is not enough: launchers such as ``npx`` or ``sh -c '... &'`` leave children that never read it.
"""

from __future__ import annotations

import subprocess
import sys
import threading

__all__ = ["forget_group", "watch_group"]

_WATCHDOG = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
groups = set()
for line in sys.stdin:
    sign, pgid = line[:1], int(line[1:])
    (groups.add if sign == "+" else groups.discard)(pgid)
for sig in (signal.SIGTERM, signal.SIGKILL):
    alive = False
    for pgid in groups:
        try:
            os.killpg(pgid, sig)
            alive = True
        except OSError:
            pass
    if not alive:
        break
    time.sleep(2)
"""

_lock = threading.Lock()
_process: subprocess.Popen[bytes] | None = None


def _send(line: str) -> None:
    global _process
    with _lock:
        if _process is None or _process.poll() is not None:
            if line.startswith("-"):
                return
            _process = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _WATCHDOG],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # not in the terminal's group: Ctrl-C is lmbridge's to handle
                close_fds=True,
            )
        assert _process.stdin is not None
        try:
            _process.stdin.write(line.encode() + b"\n")
            _process.stdin.flush()
        except OSError:
            _process = None


def watch_group(pgid: int) -> None:
    """An agent's process group to stop if lmbridge dies first."""
    _send(f"+{pgid}")


def forget_group(pgid: int) -> None:
    """The group was stopped by lmbridge (its id may now be reused: the watchdog must not touch it)."""
    _send(f"-{pgid}")
