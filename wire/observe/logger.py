"""The logger every layer is handed, as a Protocol: importing it costs nothing (``logs`` sets up structlog, which
provides it).

Imports nothing of lmbridge.
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["Logger"]


class Logger(Protocol):
    """What lmbridge asks of a logger (structlog's bound logger; a test's quiet one): lines with fields, and loggers
    that carry fields on every line (``bind``)."""

    def bind(self, **fields: Any) -> Logger: ...

    def debug(self, event: str, *args: Any, **fields: Any) -> Any: ...

    def info(self, event: str, *args: Any, **fields: Any) -> Any: ...

    def warning(self, event: str, *args: Any, **fields: Any) -> Any: ...

    def error(self, event: str, *args: Any, **fields: Any) -> Any: ...

    def exception(self, event: str, *args: Any, **fields: Any) -> Any: ...
