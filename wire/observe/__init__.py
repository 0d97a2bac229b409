"""Seeing what lmbridge does: the logger every layer is handed (``logger``, a Protocol), structlog set-up (``logs``),
secret redaction (``redact``) and wire traces (``trace``).

May import: nothing of lmbridge.
"""
