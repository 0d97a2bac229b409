"""The base layer every other package stands on: what lmbridge's connections are made of, and nothing they carry.

- ``errors``: every error code and the exception types carrying them
- ``rpc``: JSON-RPC 2.0 — the sans-IO engine, its Trio shell, the WebSocket wire
- ``cancel``: a request's cancel, a one-shot signal that can also call back (no task needed to watch it)
- ``http_server``: the project's one HTTP server (Hypercorn's Trio worker on sockets lmbridge opened) and reading a
  request body
- ``vocabulary``: the ACP words lmbridge relies on (protocol version, stop reasons), without importing the SDK
- ``observe``: the Logger protocol, structlog set-up, secret redaction, wire traces

May import: nothing of lmbridge. The other packages stand on it (``session``, ``mcp_synthetic``, ``bridge``), never the
other way round.
"""
