"""lmbridge's benchmark suite: the bridge's overhead against the raw pipe and direct clients (``python -m bench``;
see docs/performance.md)."""
