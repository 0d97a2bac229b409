"""The editor front: editor protocol v1 (docs/protocol.md), over any JSON-RPC connection.

- ``initialize``: checking ``initialize`` and building its answer, free of Trio (``lmbridge stdio`` answers it
  early)
- ``connection``: one editor's connection: ``lm/*`` methods, checks, streaming parts, errors
- ``history_parse``: parsing re-sent histories without parsing the repeated part again
- ``client``: the editor side of the protocol (the demo, ``lmbridge chat``, the harness and the tests use it)

May import: ``bridge.service``, ``bridge.config``, ``session``, ``wire``. Only the shells (``bridge.daemon``,
``bridge.cli``) and the harness (the client) import a front.
"""
