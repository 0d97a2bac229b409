"""lmbridge: makes any ACP agent usable as an editor language model.

The ``bridge`` package is the top floor, standing on ``session`` and ``mcp_synthetic`` (and all of them on
``wire``): the command line (``cli``), the process shells (``daemon``), the fronts (``editor``, ``http``), the bridge
service they share (``service``), the ACP client (``acp``), the demo agent (``demo``) and the test harness
(``harness``), one subpackage per concern; ``config`` (the TOML file) and ``__version__`` at its root.

May import: ``bridge.cli`` (``python -m bridge``).
"""

__version__ = "0.1.0"
