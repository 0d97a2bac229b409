"""The bridge service every front shares — the composition root: the agent pool, the session router and the
editor-tools wiring, composed once, and what a front asks of them (models, a turn request and its run, status,
shutdown).

- ``composition``: ``BridgeService``, built once per process; the order of shutdown
- ``models``: the model list every front shows (an entry per agent and per model it offers), and resolving a name
- ``view``: how a client shows the agent's activity (``ClientView``)
- ``principals``: who asks (``Principal``): the scope of its conversations, what it may do and use
- ``limits``: what each key may use (turns at once, requests a minute, tokens a day), admitted or refused
- ``usage``: what one turn used (``Meter``) and the record it leaves (``TurnRecord``)

May import: ``session``, ``mcp_synthetic``, ``bridge.acp``, ``bridge.config``, ``wire``. Nothing here knows a
front's wire format; fronts call it, it never calls them.
"""
