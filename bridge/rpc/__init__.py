"""JSON-RPC 2.0, the wire of every connection lmbridge has (editors, agents).

- ``protocol``: sans-IO: newline framing, message classification, id bookkeeping, encoding
- ``connection``: the Trio shell: reader, writer, a task per incoming request, cancellation both ways
- ``cancel``: a request's cancel, a one-shot signal that can also call back (no task needed to watch it)
- ``websocket``: the same over a WebSocket (one message per text frame), and the client-side connect
- ``asgi``: the project's one HTTP server (Hypercorn's Trio worker on sockets lmbridge opened), and reading a
  request body

May import: ``bridge.errors``, ``bridge.observe``. Knows no method of any protocol: the editor front and the ACP
client register their handlers.
"""
