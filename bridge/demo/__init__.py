"""The built-in ``demo`` agent: a real ACP agent (the official SDK's asyncio agent side), scripted by directives in
the prompt, with no model behind it. ``python -m bridge.demo`` runs it.

- ``directives``: the directive language (``/say``, ``/tool``, ``/permission``, …): its table, parser and reference
- ``agent``: the agent: sessions, carrying out directives, ``session/load`` and ``session/resume``
- ``tools``: its MCP client side (how ``/tool`` reaches the MCP servers given in ``session/new``)

May import: ``session.transcript`` (the context marker), ``wire.vocabulary``. Besides those, the ACP and MCP SDKs:
it runs in a process of its own and nothing of lmbridge imports it.
"""
