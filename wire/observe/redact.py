"""Secrets kept out of the agent stderr lmbridge logs and passes on to editors, and out of its log fields.

Owns the rules: values registered as secret (the daemon's token, also registered with the trace writer; the values
of environment variables with secret-like names that an agent is given), the shapes of well-known keys (``sk-…``,
``ghp_…``, ``AIza…``, ``xox…-``) and ``token=…``-style assignments; what matches becomes ``***``. ``SECRET_NAME``
is also what the log processor masks by field name. Traces mask the registered values only: they hold protocol
messages, and matching shapes in every message would cost the streaming path.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["SECRET_NAME", "add_secret", "add_secrets_from_env", "redact", "remove_secret"]

SECRET_NAME = re.compile(r"(token|secret|password|passwd|authorization|api[_-]?key|credential)", re.IGNORECASE)
_KEY_SHAPES = re.compile(
    r"\b(?:sk-(?:ant-|proj-)?[A-Za-z0-9_\-]{16,}|gh[opsru]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|AIza[0-9A-Za-z_\-]{30,}|xox[abpr]-[A-Za-z0-9\-]{10,})"
)
# "Bearer X", or a secret-named key with ":" or "=" (not the word alone: "token refreshing" is not a secret).
_ASSIGNED = re.compile(
    r"(?i)\b(bearer\s+|(?:token|api[_-]?key|password|secret|authorization)[\"']?\s*[:=]\s*[\"']?)([^\s\"',;]{8,})"
)
_MIN_SECRET_LENGTH = 6  # shorter values would mask ordinary words
_values: set[str] = set()


def add_secret(value: str) -> None:
    if len(value) >= _MIN_SECRET_LENGTH:
        _values.add(value)


def remove_secret(value: str) -> None:
    """A secret that is no longer valid anywhere (a token that died with its process): no longer searched for."""
    _values.discard(value)


def add_secrets_from_env(env: Mapping[str, str]) -> None:
    """The values of the variables whose names look secret (``ANTHROPIC_API_KEY``, ``GITHUB_TOKEN``, ...)."""
    for name, value in env.items():
        if SECRET_NAME.search(name):
            add_secret(value)


def redact(text: str) -> str:
    for value in _values:
        if value in text:
            text = text.replace(value, "***")
    text = _KEY_SHAPES.sub("***", text)
    return _ASSIGNED.sub(lambda m: m.group(1) + "***", text)
