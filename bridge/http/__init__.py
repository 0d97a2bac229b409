"""The HTTP API front: OpenAI Chat Completions, OpenAI Responses and Anthropic Messages (JSON and server-sent
events), so the clients people already use — the official SDKs, VS Code's custom endpoints, Continue, Zed, Aider —
can use any ACP agent as a model.

- ``turns``: what every API shares — the parsed request, the turn on the session path (the same
  ``BridgeService.chat`` the editor front calls), permission requests asked in words, API errors
- ``openai_chat``, ``openai_responses``, ``anthropic_messages``: each API's request models (pydantic: they give the
  400s), its translation to and from editor-protocol messages, and its response and event shapes
- ``app``: the ASGI application — routes, the token, body limits, turn limits, streaming with disconnect watching

May import: ``bridge.core``, ``session``, ``bridge.errors``, ``bridge.config``, ``bridge.observe``. Knows no
socket: ``bridge.daemon`` serves the application (with ``bridge.rpc.asgi``) and decides who may connect.
The contract is docs/http.md; keep the two in step.
"""
