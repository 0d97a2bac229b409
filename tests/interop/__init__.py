"""Real agents (Claude Code, Codex, Gemini CLI) driven through lmbridge against a fake model server."""
