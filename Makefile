# The two ways in: `make demo` and `make test`. Each builds .venv by itself on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

NODE_STAMP := tests/conformance/node_modules/.installed

.PHONY: demo test lint bench

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m approver.demo

# The third-party MCP servers and clients the conformance tests run, pinned in their lockfile. Without npm
# (a laptop without Node) those tests skip and say so; CI installs Node, so there they always run.
$(NODE_STAMP): tests/conformance/package-lock.json
	@if command -v npm >/dev/null; then \
		npm ci --prefix tests/conformance --no-audit --no-fund --loglevel=error && touch $(NODE_STAMP); \
	else echo "npm not found: the tests that need Node's MCP servers will skip"; fi

# Tests keep their database, broker folder and keys apart from the demo's, so a running demo never
# picks up a test's tasks.
test: $(STAMP) $(NODE_STAMP)
	VAR_DIR=$(CURDIR)/var/test $(PY) -m pytest $(PYTEST_ARGS)
	VAR_DIR=$(CURDIR)/var/test-pg $(PY) tests/on_postgres.py $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(PY) bench/recorder_latency.py
