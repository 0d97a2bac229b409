"""The shells that run lmbridge as a process: ``lmbridge stdio`` (one editor on stdin/stdout) and ``lmbridge serve``
(any number of editors over WebSocket, and HTTP API clients), with what stands before any method can run: token,
Origin, TLS, limits.

- ``stdio``: stdout reserved for the protocol, ``initialize`` answered before the rest is imported, the stop
  conditions
- ``security``: the token file, loopback and Origin rules, TLS contexts
- ``keys``: a key per person (``lmbridge keys``), the keys file, whose principal a credential is
- ``ledger``: the usage ledger (SQLite, a row per turn) and the reports of ``lmbridge usage``
- ``metrics``: ``/metrics`` in the Prometheus text format
- ``serve``: the listening sockets, one editor connection per WebSocket, the orderly stop
- ``http_listener``: the HTTP API front on its socket, under the same token, Origin and TLS rules

May import: ``bridge.editor``, ``bridge.http``, ``bridge.service``, ``bridge.acp.spawn`` (a first chat's agent),
``bridge.config``, ``session.permissions`` (the permission tool's schema), ``wire``.
"""
