"""Seeing what lmbridge does: structlog set-up (``logs``) and wire traces (``trace``). Imports nothing of lmbridge."""
