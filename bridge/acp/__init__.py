"""The ACP client: agent processes and what lmbridge says to them.

- ``vocabulary``: the ACP words lmbridge relies on (protocol version, stop reasons), without importing the SDK
- ``handshake``: ``initialize`` and ``authenticate``, written once for everyone who starts an agent
- ``process``: one agent process: process group, connection, routing its traffic to sessions, stopping it
- ``pool``: one process per agent id, started on demand, stopped when idle

May import: ``bridge.rpc``, ``bridge.config``, ``bridge.errors``, ``bridge.observe``. Decides nothing about turns
or history (that is ``session``).
"""
