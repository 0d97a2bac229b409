"""Keys for a shared daemon: one per person (or per tool), each a principal of its own.

Owns the keys file (beside the token file; 0600, JSON, rewritten atomically under a lock; it holds each key's
SHA-256 digest, never the key), the sidecar where the daemon records when each key was last used, what
``lmbridge keys add|list|revoke`` do to them, and ``KeyRing``: how the daemon recognises the principal behind a
presented credential (the owner's token, or a key), compared in constant time, and which principals a change of the
file (a key revoked) or the clock (a key expired) has just ended. Pure files and values; no sockets.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bridge.service.principals import SCOPES, Principal

from .security import Refusal, ServeError, check_private

__all__ = [
    "DEFAULT_SCOPES",
    "OWNER",
    "KeyRecord",
    "KeyRing",
    "KeysFile",
    "keys_path_for",
    "parse_expiry",
    "parse_scopes",
]

DEFAULT_SCOPES = ("chat", "models")
OWNER = Principal("owner", "owner")  # the token file's holder, on a daemon: every scope, every agent
KEY_PREFIX = "lmb_"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
_VERSION = 1


def keys_path_for(token_path: Path) -> Path:
    """Where the keys live: beside the token file."""
    return token_path.with_name("keys.json")


def digest(key: str | bytes) -> str:
    raw = key.encode() if isinstance(key, str) else key
    return hashlib.sha256(raw).hexdigest()


@dataclass(frozen=True, slots=True)
class KeyRecord:
    id: str  # never reused: scopes the key's conversations
    name: str
    digest: str  # hex SHA-256 of the key
    scopes: tuple[str, ...]
    created: float  # seconds since the epoch
    expires: float | None = None
    agents: tuple[str, ...] | None = None  # the agents it may use (None: all)

    def expired(self, now: float) -> bool:
        return self.expires is not None and now >= self.expires

    def principal(self) -> Principal:
        agents = frozenset(self.agents) if self.agents is not None else None
        return Principal(f"key:{self.id}", self.name, frozenset(self.scopes), agents)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "name": self.name,
            "sha256": self.digest,
            "scopes": list(self.scopes),
            "created": self.created,
        }
        if self.expires is not None:
            out["expires"] = self.expires
        if self.agents is not None:
            out["agents"] = list(self.agents)
        return out

    @classmethod
    def from_json(cls, data: Any, where: str) -> KeyRecord:
        if not isinstance(data, dict):
            raise ServeError(f"{where}: not an object")
        try:
            record = cls(
                id=_text(data["id"]),
                name=_text(data["name"]),
                digest=_text(data["sha256"]),
                scopes=tuple(_text(scope) for scope in data["scopes"]),
                created=float(data["created"]),
                expires=float(data["expires"]) if data.get("expires") is not None else None,
                agents=tuple(_text(a) for a in data["agents"]) if data.get("agents") is not None else None,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ServeError(f"{where}: malformed key entry ({exc!r}); fix or delete it") from None
        if not re.fullmatch(r"[0-9a-f]{64}", record.digest):
            raise ServeError(f"{where}: sha256 is not a SHA-256 hex digest")
        return record


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


class KeysFile:
    """The keys file and its last-used sidecar (``<file>.used``, written by the daemon only)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.used_path = path.with_name(path.name + ".used")

    def load(self) -> list[KeyRecord]:
        """The keys; none when the file does not exist. ``ServeError`` for a file others may read or one that is
        not a keys file (the message says what to do)."""
        try:
            text = _read_private(self.path)
        except FileNotFoundError:
            return []
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ServeError(f"keys file {self.path} is not JSON ({exc}); fix it or move it away") from None
        if not isinstance(data, dict) or data.get("version") != _VERSION or not isinstance(data.get("keys"), list):
            raise ServeError(f"keys file {self.path} is not an lmbridge keys file (version {_VERSION})")
        return [KeyRecord.from_json(entry, f"keys file {self.path}, key {i}") for i, entry in enumerate(data["keys"])]

    def signature(self) -> tuple[int, int, int] | None:
        """What changes when the file is rewritten (it is replaced, never edited in place)."""
        try:
            info = self.path.stat()
        except FileNotFoundError:
            return None
        return (info.st_ino, info.st_mtime_ns, info.st_size)

    def add(
        self,
        name: str,
        *,
        scopes: Iterable[str] = DEFAULT_SCOPES,
        expires: float | None = None,
        agents: Iterable[str] | None = None,
        now: float | None = None,
    ) -> tuple[KeyRecord, str]:
        """A new key: its record (stored) and the key itself (shown once, stored nowhere)."""
        if not _NAME.match(name):
            raise ServeError(
                f"key name {name!r}: use 1 to 64 letters, digits, '.', '_', '@' or '-', starting with a letter or digit"
            )
        if name == OWNER.name:
            raise ServeError(f"{name!r} is the token file's holder (logs and [limits.keys] name it so); choose another")
        scopes = tuple(dict.fromkeys(scopes))
        unknown = [scope for scope in scopes if scope not in SCOPES]
        if unknown or not scopes:
            raise ServeError(f"unknown scope {', '.join(unknown) or '(none given)'}; scopes are: {', '.join(SCOPES)}")
        created = time.time() if now is None else now
        if expires is not None and expires <= created:
            raise ServeError("--expires is in the past")
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        record = KeyRecord(
            id=secrets.token_hex(8),
            name=name,
            digest=digest(key),
            scopes=scopes,
            created=created,
            expires=expires,
            agents=tuple(agents) if agents is not None else None,
        )
        with self._locked():
            records = self.load()
            if any(existing.name == name for existing in records):
                raise ServeError(f"a key named {name!r} exists; revoke it first (lmbridge keys revoke {name})")
            self._write([*records, record])
        return record, key

    def revoke(self, name: str) -> KeyRecord:
        with self._locked():
            records = self.load()
            found = next((record for record in records if record.name == name), None)
            if found is None:
                known = ", ".join(record.name for record in records) or "none"
                raise ServeError(f"no key named {name!r} (keys: {known})")
            self._write([record for record in records if record is not found])
        return found

    def last_used(self) -> dict[str, float]:
        """When each key (by id) was last used, as the daemon last recorded it."""
        try:
            data = json.loads(_read_private(self.used_path))
        except (FileNotFoundError, ValueError, ServeError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {key: float(value) for key, value in data.items() if isinstance(value, (int, float))}

    def record_used(self, used: dict[str, float]) -> None:
        _write_private(self.used_path, json.dumps(used, sort_keys=True))

    def _write(self, records: list[KeyRecord]) -> None:
        body = {"version": _VERSION, "keys": [record.to_json() for record in records]}
        _write_private(self.path, json.dumps(body, indent=2) + "\n")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """One writer at a time (two ``keys add`` at once both land)."""
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock = os.open(self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield
        finally:
            os.close(lock)


def _read_private(path: Path) -> str:
    check_private(path, path.stat())
    return path.read_text()


def _write_private(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` at once: a reader sees the old file or the new one, never half of either."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # created 0600
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def parse_scopes(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


_DURATION = re.compile(r"^(\d+)([mhdw])$")
_UNITS = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_expiry(text: str, now: float | None = None) -> float:
    """``30d``, ``12h``, ``90m``, ``2w`` from now, or a date / date and time (ISO 8601; UTC unless it says)."""
    return _moment(text, now, later=True, option="--expires")


def parse_since(text: str, now: float | None = None) -> float:
    """``30d``, ``12h``, ``90m``, ``2w`` ago, or a date / date and time (ISO 8601; UTC unless it says)."""
    return _moment(text, now, later=False, option="--since")


def _moment(text: str, now: float | None, *, later: bool, option: str) -> float:
    now = time.time() if now is None else now
    match = _DURATION.match(text.strip())
    if match:
        seconds = int(match.group(1)) * _UNITS[match.group(2)]
        return now + seconds if later else now - seconds
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ServeError(
            f"{option} {text!r}: give a duration (90m, 12h, 30d, 2w) or a date (2027-01-31, 2027-01-31T12:00)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def when(seconds: float | None) -> str:
    """A time for people (UTC, to the minute)."""
    if seconds is None:
        return "-"
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M")


@dataclass(frozen=True)
class KeyChanges:
    """What ``KeyRing.refresh`` found changed in the keys file."""

    added: list[KeyRecord]
    revoked: list[KeyRecord]  # no longer in the file
    expired: list[KeyRecord]  # still in the file, past its expiry


class KeyRing:
    """The daemon's view of who may connect: the owner's token and the keys file, read again whenever it changed
    (a ``stat`` per request: a revoked key is refused from the next request on). ``refresh``, called every second,
    also says which principals have just ended (revoked or expired), so their running work can be stopped."""

    def __init__(self, token: str, keys: KeysFile | None, *, owner: Principal = OWNER) -> None:
        self._token = token.encode()
        self._owner = owner
        self._file = keys
        self._records: list[KeyRecord] = []
        self._signature: tuple[int, int, int] | None = None
        self._used: dict[str, float] = {}
        self._used_dirty = False
        self._broken = ""  # why the keys file cannot be read now
        if keys is not None:
            self._records = keys.load()
            self._signature = keys.signature()
            self._used = keys.last_used()
        now = time.time()
        self._in_force = {record.id: record for record in self._records if not record.expired(now)}

    def name_of(self, principal_id: str) -> str:
        """What logs call a principal: its key's name, ``owner``, or ``local`` (a process with one user)."""
        if principal_id == self._owner.id:
            return self._owner.name
        record_id = principal_id.removeprefix("key:")
        found = next((record.name for record in self._records if record.id == record_id), None)
        return found or principal_id or "local"

    def authenticate(self, presented: bytes | None, now: float | None = None) -> Principal:
        """The principal behind ``presented`` (the bearer token or API key, without its scheme). ``Refusal`` 401
        for none, a wrong one, or an expired key."""
        if not presented:
            raise Refusal(
                401,
                "missing token: send the header 'Authorization: Bearer <token>' (the token file's, or a key from "
                "lmbridge keys add)",
            )
        try:
            self._reload()
        except ServeError:
            pass  # every key is refused until the file is mended; ``refresh`` logs why
        owner = hmac.compare_digest(presented, self._token)
        presented_digest = digest(presented).encode()
        found: KeyRecord | None = None
        for record in self._records:  # every one compared: the time taken says nothing of which matched
            if hmac.compare_digest(presented_digest, record.digest.encode()):
                found = record
        if owner:
            return self._owner
        if found is None:
            raise Refusal(401, "wrong token or key (a revoked key is refused too)")
        now = time.time() if now is None else now
        if found.expired(now):
            expired = when(found.expires)
            raise Refusal(401, f"key {found.name!r} expired at {expired} UTC; ask the operator for a new one")
        self._used[found.id] = now
        self._used_dirty = True
        return found.principal()

    def refresh(self, now: float | None = None) -> KeyChanges:
        """Read the keys file again if it changed; returns the keys added, revoked and expired since the last call.
        ``ServeError``: the file became unreadable (then every key is refused, the owner's token still works, until
        it is mended)."""
        now = time.time() if now is None else now
        self._reload()  # a broken file raises: what was in force stays the reference until it is mended
        in_force = {record.id: record for record in self._records if not record.expired(now)}
        present = {record.id for record in self._records}
        gone = [record for record_id, record in self._in_force.items() if record_id not in in_force]
        changes = KeyChanges(
            added=[record for record_id, record in in_force.items() if record_id not in self._in_force],
            revoked=[record for record in gone if record.id not in present],
            expired=[record for record in gone if record.id in present],
        )
        self._in_force = in_force
        return changes

    def valid(self, principal: Principal, now: float | None = None, *, reload: bool = True) -> bool:
        """Whether ``principal``'s credential still holds (the owner's always does): what was let in before a key
        was revoked or expired is checked again with this. ``reload``: look at the keys file first (not needed
        right after ``refresh``)."""
        if not principal.id.startswith("key:"):
            return True
        try:
            if reload:
                self._reload()
        except ServeError:
            pass  # every key is refused until the file is mended
        now = time.time() if now is None else now
        record_id = principal.id.removeprefix("key:")
        return any(record.id == record_id and not record.expired(now) for record in self._records)

    def flush_used(self) -> None:
        """Write when each key was last used to the sidecar (``keys list`` shows it), if anything changed."""
        if self._file is not None and self._used_dirty:
            self._used_dirty = False
            self._file.record_used(dict(self._used))

    def _reload(self) -> None:
        if self._file is None:
            return
        signature = self._file.signature()
        if signature != self._signature:
            self._signature = signature
            try:
                self._records = self._file.load()
                self._broken = ""
            except ServeError as exc:
                self._records = []  # fail closed: a key removed by hand must not live on because the file broke
                self._broken = str(exc)
        if self._broken:
            raise ServeError(self._broken)
