"""``python -m bridge.demo`` runs the demo agent on stdin/stdout (what the built-in ``demo`` agent entry starts)."""

from .agent import main

main()
