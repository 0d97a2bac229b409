"""lmbridge: makes any ACP agent usable as an editor language model.

The ``bridge`` package is the daemon shell: CLI, configuration, the JSON-RPC engine, the ACP client, the editor
protocol on stdio and WebSocket, logs and traces, the demo agent and the test harness.
"""

__version__ = "0.1.0"
