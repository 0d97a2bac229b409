"""The audit log as a file: JSON lines, every rotated file private, secrets masked, refusals counted."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from bridge.daemon.audit import AuditLog
from bridge.daemon.security import ServeError
from wire.observe.redact import add_secret, remove_secret


def test_lines_are_json_rotated_into_private_files_with_secrets_masked(tmp_path: Path) -> None:
    secret = "s3cr3t-value-for-the-audit-test"
    add_secret(secret)
    try:
        audit = AuditLog(tmp_path / "state" / "audit.log", max_bytes=400, backups=2)
        for n in range(20):
            audit.event("permission", key="alice", title=f"deploy {n} with {secret}", decision="allow_once")
        audit.close()
    finally:
        remove_secret(secret)
    files = sorted((tmp_path / "state").iterdir())
    assert [path.name for path in files] == ["audit.log", "audit.log.1", "audit.log.2"]  # the oldest dropped
    assert all(stat.S_IMODE(path.stat().st_mode) == 0o600 for path in files)
    lines = [json.loads(line) for path in reversed(files) for line in path.read_text().splitlines()]
    assert [line["title"] for line in lines][-1] == "deploy 19 with ***"
    assert all(secret not in path.read_text() for path in files)
    assert {line["event"] for line in lines} == {"permission"} and all("time" in line for line in lines)


def test_refusals_are_counted_per_reason_and_peer_until_flushed(tmp_path: Path) -> None:
    audit = AuditLog(tmp_path / "audit.log")
    for _ in range(1000):
        audit.refused("wrong token or key", "10.0.0.7")
    audit.refused("wrong token or key", "10.0.0.8")
    audit.flush()
    audit.flush()  # nothing new: nothing written
    audit.close()
    lines = [json.loads(line) for line in (tmp_path / "audit.log").read_text().splitlines()]
    assert [(line["peer"], line["count"]) for line in lines] == [("10.0.0.7", 1000), ("10.0.0.8", 1)]


def test_an_audit_log_others_can_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    path.write_text("")
    path.chmod(0o644)
    with pytest.raises(ServeError, match="accessible by other users"):
        AuditLog(path)
