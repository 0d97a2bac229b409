"""The heart of lmbridge: one ACP session seen as request/response model turns.

- ``messages``: client messages: validation, normal form, digests (sans-IO)
- ``history``: history matching: which session a request continues, and what in it is new (sans-IO)
- ``machine``: the session state machine and its transition table (sans-IO)
- ``render``: ACP updates → client parts (sans-IO)
- ``permissions``, ``bridged``: permission policy and answers; the agent's reports about client tools (sans-IO)
- ``transcript``: what the agent is told: prompt blocks and the seeding transcript (sans-IO)
- ``store``: the state file: conversation fingerprints → ACP session ids, for resume after a restart
- ``actor``: the Trio actor that runs one ACP session and merges its events into one stream
- ``router``: client turns → sessions: opening, continuing, closing, idle TTL, LRU cap
- ``capacity``: the cap's rule (which sessions may be closed) and its thrash counts (sans-IO)

May import: ``wire.errors``, ``wire.vocabulary`` (words, not the client), ``wire.cancel`` (a turn's cancel
signal), ``wire.observe.logger``. Besides those, the ACP SDK's schema. It talks to agents through the
``AgentProvider``/``AgentHandle`` protocols and to the tools through ``SessionSetup``; it knows no front and no wire
format of a client.
"""
