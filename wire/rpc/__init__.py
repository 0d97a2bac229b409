"""JSON-RPC 2.0, the wire of every connection lmbridge has (editors, agents).

- ``protocol``: sans-IO: newline framing, message classification, id bookkeeping, encoding
- ``connection``: the Trio shell: reader, writer, a task per incoming request, cancellation both ways
- ``websocket``: the same over a WebSocket (one message per text frame), and the client-side connect

May import: ``wire.errors``, ``wire.cancel``, ``wire.observe``. Knows no method of any protocol: the editor front and
the ACP client register their handlers.
"""
