"""The HTTP API front: OpenAI Chat Completions, OpenAI Responses and Anthropic Messages (JSON and server-sent
events), so the clients people already use — the official SDKs, VS Code's custom endpoints, Continue, Zed, Aider —
can use any ACP agent as a model.

- ``api``: what every API is, declared (``HttpApi``, ``ApiStream``), the parsed request, API errors, server-sent
  event framing and the pieces the translations share
- ``turns``: the turn on the session path (the same ``BridgeService.turn_request`` and ``chat`` the editor front
  calls), permission requests asked in words
- ``openai_chat``, ``openai_responses``, ``anthropic_messages``: each API's request body (pydantic: they give the
  400s), its translation to and from editor-protocol messages, and its response and event shapes
- ``app``: the ASGI application — routes, the token, body limits, turn limits, streaming with disconnect watching

May import: ``bridge.service``, ``bridge.config``, ``session``, ``wire``. Knows no socket: ``bridge.daemon`` serves
the application (with ``wire.http_server``) and decides who may connect. The contract is docs/http.md; keep the two
in step.
"""
