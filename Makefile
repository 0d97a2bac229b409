# make demo | make check | make test | make lint | make bench | make interop | make scale | make conform-sweep — each
# creates .venv on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: demo check test test-plan lint pytest haproxy scale vscode-test vscode-e2e vscode-package bench bench-agents \
	interop conform-sweep clean

$(STAMP): pyproject.toml constraints.txt Makefile
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "lmbridge needs Python 3.11 or newer; run: make PYTHON=python3.11 ..." >&2; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt \
		--config-settings editable_mode=compat -e '.[test]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/lmbridge demo

test: test-plan lint pytest vscode-test vscode-e2e

# What `make test` is about to do and roughly how long each part takes on 2 cores, so that a new user knows why it
# takes a quarter of an hour (the parts that install something say whether that is already done).
test-plan:
	@echo "make test: what runs, and roughly how long on 2 cores"
	@echo "  1. lint (ruff, mypy)                                                ~10 s (first: mypy's cache, ~40 s)"
	@echo "  2. pytest: unit, property-based and real-wire tests                 ~5 min"
	@printf '     and the real agents (Claude Code, Codex, Gemini CLI, OpenCode)   ~5 min; from npm once, ~950 MB, ~3 min: %s\n' \
		"$$(test -d .interop-cache && echo 'installed' || echo 'not yet installed')"
	@printf '     with HAProxy for the scale-out test; from Debian once, ~10 s: %s\n' \
		"$$(command -v haproxy >/dev/null 2>&1 || test -x /usr/sbin/haproxy && echo 'installed' || echo 'not yet installed')"
	@echo "  3. the VS Code extension's tests against the real lmbridge          ~1 min (npm ci first)"
	@printf '  4. the extension inside a real VS Code, headless                    ~1 min; Node 24, code-server, Chromium once, ~3 min: %s\n' \
		"$$(test -e "$${LMBRIDGE_VSCODE_CACHE:-$${XDG_CACHE_HOME:-$$HOME/.cache}/lmbridge/vscode-e2e}" && echo 'installed' || echo 'not yet installed')"
	@echo "  The fast inner loop is make check: lint and the tests that need no real agent, VS Code or benchmark."

# ruff (lint and format) and mypy (strict for the sans-IO cores, session/, mcp_synthetic/ and the JSON-RPC engine;
# see pyproject.toml). `make test` runs it first.
LINT_PATHS := wire session mcp_synthetic bridge tests bench examples editors/vscode/e2e
lint: $(STAMP)
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/mypy

# The fast inner loop: lint, the in-process tests, and one wire test per front and feature (marked smoke); about a
# minute on 2 cores. `make test` runs everything.
check: lint
	$(BIN)/python -m pytest -q -m "not interop and (not wire or smoke)" $(PYTEST_ARGS)

# The real-agent interop suite (tests/interop) runs too: it installs pinned Claude Code, Codex, Gemini CLI and OpenCode
# from npm into .interop-cache/ once (about 950 MB) and skips loudly when npm is missing.
pytest: $(STAMP) haproxy
	LMBRIDGE_INTEROP=1 $(BIN)/python -m pytest $(PYTEST_ARGS)

# HAProxy from Debian's packages, for the scale-out test (tests/test_scale.py, docs/scale.md): installed once when
# missing (apt needs root or sudo); the test fails, never skips, without it.
haproxy:
	@command -v haproxy >/dev/null 2>&1 || test -x /usr/sbin/haproxy || { \
		echo "installing HAProxy from Debian's packages, for the scale-out test (once)"; \
		sudo=$$(test "$$(id -u)" = 0 || echo "sudo -n"); \
		export DEBIAN_FRONTEND=noninteractive; \
		$$sudo apt-get install -y -q --no-install-recommends haproxy >/dev/null 2>&1 || \
		{ $$sudo apt-get update -q >/dev/null && $$sudo apt-get install -y -q --no-install-recommends haproxy >/dev/null; } || \
		echo "!!!!!!!! could not install HAProxy (apt-get install haproxy): tests/test_scale.py will fail !!!!!!!!" >&2; }

# The scale-out test at full size: three nodes behind HAProxy, 30 conversations x 4 turns with tool calls, one node
# killed halfway, and a node drained; prints the numbers (about half a minute). `make test` runs it with 6.
SCALE_CONVERSATIONS ?= 30
scale: $(STAMP) haproxy
	LMBRIDGE_SCALE_CONVERSATIONS=$(SCALE_CONVERSATIONS) $(BIN)/python -m pytest -q -s tests/test_scale.py $(PYTEST_ARGS)

# The ACP registry's agents that install from npm or PyPI, pinned, through `lmbridge conform --model fake`; writes
# the matrix into docs/conformance.md. Not part of `make test`: it installs about 3 GB into .conform-cache/ and takes
# about half an hour. `tests/conform_sweep.py qwen cline` runs a few.
conform-sweep: $(STAMP)
	$(BIN)/python tests/conform_sweep.py

interop: $(STAMP)
	$(BIN)/python -m pytest -m interop tests/interop $(PYTEST_ARGS)

# The reference VS Code extension, tested against the real lmbridge stdio, then built into a .vsix (needs Node.js
# 20+ and npm).
VSCODE_DIR := editors/vscode
HAVE_NODE := command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 && \
	node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)'

vscode-test: $(STAMP)
	@if $(HAVE_NODE); then \
		cd $(VSCODE_DIR) && npm ci --no-audit --no-fund && LMBRIDGE_BIN="$(CURDIR)/$(BIN)/lmbridge" npm test \
			&& npm run package; \
	else \
		echo "!!!!!!!! SKIPPED: the VS Code extension tests ($(VSCODE_DIR)) need Node.js 20+ and npm, not found !!!!!!!!" >&2; \
	fi

# The extension's integration tests inside a real VS Code (editors/vscode/e2e/README.md): the packaged .vsix installed
# as a user would, driven through vscode.lm by another extension, VS Code headless in Chromium on 127.0.0.1. The first
# run installs Node 24, code-server (VS Code 1.139) and Chromium into ~/.cache/lmbridge/vscode-e2e (about two
# minutes; apt needs root or sudo); later runs ~15 s (~35 s with the build). It fails, never skips, when that cannot
# be installed.
vscode-e2e: vscode-test
	@$(HAVE_NODE) || { echo "vscode-e2e: the VS Code integration tests need Node.js 20+ and npm, not found" >&2; exit 1; }
	cd $(VSCODE_DIR) && npm run compile:e2e
	$(BIN)/python $(VSCODE_DIR)/e2e/run.py --lmbridge "$(CURDIR)/$(BIN)/lmbridge"

vscode-package: $(STAMP)
	cd $(VSCODE_DIR) && npm ci --no-audit --no-fund && npm run package

# The benchmarks (docs/performance.md): about 3 minutes on 2 cores; results in bench/results/latest.json.
# BENCH_ARGS=--quick for a ~20 s smoke run; --only NAME,...; --check exits 1 when a goal is missed.
BENCH_ARGS ?=
bench: $(STAMP)
	$(BIN)/python -m bench $(BENCH_ARGS)

# The real agents (Claude Code, Codex, Gemini CLI, OpenCode; installed as for `make interop`) driven directly, through
# lmbridge and through the floor (bench/bare_floor.py: a bridge of the standard library alone, no lmbridge code;
# --floor bare,parts adds bench/tool_floor.py, lmbridge's transports alone), offline against a local fake model: about
# 15 minutes; results in bench/results/agents.json. BENCH_AGENTS_ARGS=--reps 3 for a quicker run;
# --agents codex,gemini to choose; `python -m bench.agents` without --floor for direct and lmbridge only (~9 minutes).
# Then the agents on the editor's models (bench/agents_on_editor.py: Claude Code, Codex, OpenCode, their model served
# directly vs by the editor through lmbridge, in their turns and each agent's request alone; ~7 minutes):
# bench/results/agents_on_editor.json.
BENCH_AGENTS_ARGS ?=
bench-agents: $(STAMP)
	$(BIN)/python -m bench.agents --floor $(BENCH_AGENTS_ARGS)
	$(BIN)/python -m bench.agents_on_editor

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache .ruff_cache *.egg-info
