"""Logging: structlog to stderr, console or JSON, with secrets masked.

Owns the process-wide logging configuration. stdout is never touched here: in `lmbridge stdio` it carries the
editor protocol and nothing else.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

from .redact import SECRET_NAME

__all__ = ["LEVELS", "configure", "get_logger"]

LEVELS = ("debug", "info", "warning", "error")


def _mask_secrets(_logger: Any, _method: str, event: dict[str, Any]) -> dict[str, Any]:
    for key, value in event.items():
        if key == "env" and isinstance(value, dict):
            event[key] = dict.fromkeys(value, "***")
        elif SECRET_NAME.search(key) and value is not None:
            event[key] = "***"
    return event


def configure(level: str = "info", fmt: str = "console", stream: Any = None) -> None:
    """Configure structlog for the whole process. ``fmt`` is ``console`` (one readable line per event) or
    ``json`` (one JSON object per line)."""
    if level not in LEVELS:
        raise ValueError(f"unknown log level {level!r}; choose one of {', '.join(LEVELS)}")
    stream = stream if stream is not None else sys.stderr
    renderer: Any
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer()
    elif fmt == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=False, exception_formatter=structlog.dev.plain_traceback)
    else:
        raise ValueError(f"unknown log format {fmt!r}; choose console or json")
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _mask_secrets,
    ]
    if fmt == "json":
        processors.append(structlog.processors.dict_tracebacks)
    processors.append(renderer)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )


def get_logger(**context: Any) -> Any:
    return structlog.get_logger("lmbridge", **context)
