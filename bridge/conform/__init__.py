"""The ACP conformance kit: ``lmbridge conform`` checks an agent, spoken to directly over stdio (no lmbridge in
between), requirement by requirement, each citing the spec text it rests on.

- ``requirements``: the requirements as data (id, tier, citation, the capability that makes one apply)
- ``agent``: one agent process under test: its stdio, transcript, stderr tail; the client side it answers with
- ``terminals``: the client side's terminals (``terminal/*``), run and stopped for real
- ``checks``: the check groups (a fresh agent process each) and the judging of the whole run's wire
- ``kit``: which requirements apply, running the groups, statuses and the verdict
- ``report``: terminal, JSON, JUnit XML and Markdown reports
- ``command``: the ``lmbridge conform`` arguments and entry point
- ``mcp_probe``: the stdio MCP server given to the agent in ``session/new`` (standard library only, run by path)
- ``registry``: the ACP registry's agents (a shipped snapshot, a fetched copy) and how each is started
- ``doctor``: ``lmbridge agents doctor``: one configured agent's basics, in seconds

May import: ``bridge.acp``, ``bridge.harness.validation``, ``bridge.fakemodel``, ``bridge.config``, ``wire``. Like
the harness it drives agents as processes, never the bridge service in-process.
"""
