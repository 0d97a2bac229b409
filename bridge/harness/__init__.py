"""The ACP agent test harness: ``lmbridge test``, ``lmbridge replay`` and the ``acp_agent`` pytest fixture.

Owns nothing itself; it names the modules (each imported only when used, so ``lmbridge`` starts fast):

- ``scenario``: the TOML scenario format: loading, checking, clear errors naming file and key
- ``driver``: one live ``lmbridge stdio`` with the agent under test, driven like an editor: turns, tool rounds, fake
  tools, permission answers, cancel triggers, phase timeouts
- ``traces``: reading ``--trace-dir`` files (also while they grow) and the ACP facts in them
- ``validation``: ACP messages against the official SDK's models (and the JSON schema when given)
- ``expect``: a turn's expectations against what came
- ``checks``: the named conformance checks over a scenario's agent wire
- ``runner``: running scenario files: ``lmbridge test``
- ``report``: console, JUnit XML and JSON reports
- ``transcript``: ``--record``: merged, normalised, redacted transcripts
- ``replay``: ``lmbridge replay``: an ACP agent that replays a transcript's agent side
- ``pytest_plugin``: the ``acp_agent`` fixture (entry point ``pytest11``)

May import: ``bridge.acp``, ``bridge.editor.client``, ``bridge.config``, ``wire``. It drives lmbridge as a user does
(a process), never the bridge service in-process.
"""
