"""The bridge's core, shared by every front: the agent pool, the session router and the editor-tools wiring,
composed in ``service.BridgeService``, and what a front asks of them (models, a chat turn, status, shutdown).

May import: ``session``, ``mcp_synthetic``, ``bridge.acp``, ``bridge.config``, ``bridge.errors``,
``bridge.observe``. Nothing here knows a front's wire format; fronts call it, it never calls them.
"""
