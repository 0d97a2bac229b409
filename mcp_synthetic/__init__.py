"""The synthetic MCP server: a client's tools, offered to one ACP session's agent.

- ``server``: the tool list of a session and the MCP server offering it (official SDK, low-level ``Server``)
- ``validation``: checking arguments against the tools' JSON Schemas
- ``names``: tool names agents accept, mapped reversibly to the client's
- ``wiring``: plugging it into sessions: the per-session socket and token, the ``mcpServers`` entry
- ``shim``: the stdio relay an agent starts (standard library only)
- ``http``: the same server over streamable HTTP, for agents that speak it
- ``early`` and ``stdio``: the common messages of either transport answered without the SDK (its import is slow)

May import: ``wire.errors``, ``wire.observe``, ``wire.h11_server`` (the HTTP transport's server) and
``wire.http_server`` (its helpers), the line framing of ``wire.rpc.protocol``, ``wire.cancel`` (the signal a call of
lmbridge's own tools is withdrawn on). A call waits on the session actor through the ``invoke`` callable it is given; it
never imports the session layer.
"""
