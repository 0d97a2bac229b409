"""The ACP client: agent processes and what lmbridge says to them.

- ``handshake``: ``initialize`` and ``authenticate``, written once for everyone who starts an agent
- ``process``: one agent process: process group, connection, routing its traffic to sessions, stopping it
- ``pool``: one process per agent id, started on demand, stopped when idle
- ``spawn``: starting an agent without Trio (a first chat's agent, while the rest of lmbridge is still imported)
- ``watchdog``: a process of its own that stops the agents' process groups if lmbridge is killed

May import: ``bridge.config``, ``wire``. Decides nothing about turns or history (that is ``session``).
"""
