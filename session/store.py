"""The session store: a small state file mapping conversation fingerprints to ACP session ids, so a conversation
whose session is gone from memory (closed when idle, or a daemon restart) can be resumed with ``session/resume``
or ``session/load`` instead of re-told as a transcript.

Owns the file: JSON, written atomically (temporary file + rename), mode 0600 in a 0700 directory, bounded to the
most recent entries. With ``on_change`` the store only serialises (``snapshot``) and its owner writes (``write``)
when it suits it — lmbridge's service does so after the turn that changed the store was answered, in a worker
thread; without it every change is written at once. A fingerprint is the digest chain of a history
(``session.history``); two are stored per turn: the history the agent answered, and the same followed by the
answer the editor is expected to send back.

The file also keeps what each agent offers (``session.catalog``: its models, options and commands, as JSON), so a
restarted lmbridge lists them before the agent's first session; an offer is kept with the agent's command line and
dropped when that changes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wire.observe.logger import Logger

__all__ = ["SessionStore", "StoredSession", "default_state_path"]

_VERSION = 1


def default_state_path() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "lmbridge" / "sessions.json"


@dataclass(frozen=True, slots=True)
class StoredSession:
    agent: str
    session_id: str
    cwd: str
    updated: float


@functools.lru_cache(maxsize=256)
def _scope_prefix(scope: str) -> str:
    """What an entry's key starts with, before the fingerprint's hex: a digest of its scope (who asked: conversations
    of other clients or workspaces never resume each other's sessions). The shared scope "" has no prefix. Cached:
    a client asks in one scope turn after turn."""
    if not scope:
        return ""
    return hashlib.sha256(scope.encode("utf-8", "surrogatepass")).hexdigest()[:16] + "."


def _encode_entry(key: str, entry: StoredSession) -> bytes:
    """The entry as it stands in the file's ``entries`` object: ``"key":{...}``."""
    value = {"agent": entry.agent, "sessionId": entry.session_id, "cwd": entry.cwd, "updated": entry.updated}
    return json.dumps({key: value}, separators=(",", ":"))[1:-1].encode()


class SessionStore:
    """The entries in memory, least recently remembered first: the oldest go first when the store is full, and the
    file's content is kept encoded entry by entry, so that a snapshot encodes only the entries remembered since the
    last one (a full store is ~440 KB of JSON: 3 – 5 ms to encode whole, which the service's loop would wait for)."""

    def __init__(
        self,
        path: Path | None,
        *,
        max_entries: int = 2000,
        log: Logger | None = None,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        """``on_change``: called (instead of writing the file) whenever there is something to write."""
        self.path = path
        self._max_entries = max_entries
        self._log = log
        self._on_change = on_change
        self._dirty = False
        self._entries: dict[str, StoredSession] | None = None  # key → session, loaded on first use
        self._per_agent: Counter[str] = Counter()  # entries per agent id
        # key → _encode_entry, in _entries' order (b"" until the next snapshot encodes it); None: all to build
        self._encoded: dict[str, bytes] | None = None
        self._unencoded: list[str] = []  # keys remembered since the last snapshot
        self._offers: dict[str, Any] = {}  # agent id → {"command": [...], "offer": {...}}, loaded with the entries
        self._offers_encoded: bytes | None = None

    def _load(self) -> dict[str, StoredSession]:
        if self._entries is not None:
            return self._entries
        self._entries = {}
        if self.path is None or not self.path.exists():
            return self._entries
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if data.get("version") != _VERSION:
                raise ValueError(f"unknown version {data.get('version')!r}")
            loaded = [
                (key, StoredSession(raw["agent"], raw["sessionId"], raw["cwd"], float(raw["updated"])))
                for key, raw in data.get("entries", {}).items()
            ]
            offers = data.get("offers")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            if self._log is not None:
                self._log.warning("ignoring an unreadable session state file", path=str(self.path), error=str(exc))
            return self._entries
        loaded.sort(key=lambda item: item[1].updated)  # files of earlier versions kept another order
        self._entries.update(loaded)
        self._per_agent.update(entry.agent for entry in self._entries.values())
        self._offers = offers if isinstance(offers, dict) else {}
        return self._entries

    def offer(self, agent: str, command: list[str]) -> Any:
        """The offer stored for the agent when it was run by the same command line, else None."""
        self._load()
        stored = self._offers.get(agent)
        if isinstance(stored, dict) and stored.get("command") == command:
            return stored.get("offer")
        return None

    def remember_offer(self, agent: str, command: list[str], offer: Any) -> None:
        if self.path is None:
            return
        self._load()
        self._offers[agent] = {"command": command, "offer": offer}
        self._offers_encoded = None
        self._changed()

    def has_agent(self, agent: str) -> bool:
        self._load()
        return self._per_agent[agent] > 0

    def lookup(self, agent: str, chain: list[bytes], scope: str = "") -> tuple[int, StoredSession] | None:
        """The longest prefix of a history (given by its digest chain) that a stored session of this scope answered:
        ``(number of messages, session)``."""
        entries = self._load()
        prefix = _scope_prefix(scope)
        for length in range(len(chain), 0, -1):
            entry = entries.get(prefix + chain[length - 1].hex())
            if entry is not None and entry.agent == agent:
                return length, entry
        return None

    def remember(self, agent: str, session_id: str, cwd: str, fingerprints: list[bytes], scope: str = "") -> None:
        if self.path is None:
            return
        entries = self._load()
        encoded = self._encoded
        now = time.time()
        prefix = _scope_prefix(scope)
        for fingerprint in fingerprints:
            key = prefix + fingerprint.hex()
            self._drop(key)  # and in again at the end: the most recent
            entries[key] = StoredSession(agent, session_id, cwd, now)
            self._per_agent[agent] += 1
            if encoded is not None:
                encoded[key] = b""  # its place; encoded by the next snapshot, off the turn
                self._unencoded.append(key)
        while len(entries) > self._max_entries:
            self._drop(next(iter(entries)))
        self._changed()

    def forget(self, session_id: str) -> None:
        entries = self._load()
        stale = [key for key, entry in entries.items() if entry.session_id == session_id]
        for key in stale:
            self._drop(key)
        if stale:
            self._changed()

    def _drop(self, key: str) -> None:
        assert self._entries is not None
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        self._per_agent[entry.agent] -= 1
        if self._encoded is not None:
            del self._encoded[key]

    def _changed(self) -> None:
        if self.path is None:
            return
        self._dirty = True
        if self._on_change is not None:
            self._on_change()
            return
        data = self.snapshot()
        if data is not None:
            self.write(data)

    def snapshot(self) -> bytes | None:
        """The file's new content if something changed since the last snapshot, else None. Byte for byte what
        ``json.dumps(..., separators=(",", ":"))`` makes of the store."""
        if not self._dirty or self.path is None:
            return None
        self._dirty = False
        entries = self._load()
        if self._encoded is None:
            self._encoded = {key: _encode_entry(key, entry) for key, entry in entries.items()}
        else:
            for key in self._unencoded:
                if key in self._encoded:  # not dropped since
                    self._encoded[key] = _encode_entry(key, entries[key])
        self._unencoded.clear()
        if self._offers_encoded is None:
            self._offers_encoded = json.dumps(self._offers, separators=(",", ":")).encode()
        return b'{"version":%d,"entries":{%s},"offers":%s}' % (
            _VERSION,
            b",".join(self._encoded.values()),
            self._offers_encoded,
        )

    def write(self, content: bytes) -> None:
        """Replace the file with ``content`` (from ``snapshot``), atomically; a failure is logged. Safe to call from
        a worker thread (one call at a time)."""
        assert self.path is not None
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(content)
            os.replace(temporary, self.path)
        except OSError as exc:
            if self._log is not None:
                self._log.warning("cannot write the session state file", path=str(self.path), error=str(exc))
