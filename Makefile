# The two ways in: `make demo` and `make test`. Each builds .venv by itself on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

NODE_STAMP := tests/conformance/node_modules/.installed
# The MCP conformance suite and the Node 22 it runs on (an npm package: Debian's Node stays as it is).
SUITE_STAMP := tests/conformance-suite/node_modules/.installed
# The OpenID Connect provider the company sign-in tests run (panva's oidc-provider, pinned in its lockfile).
OIDC_STAMP := tests/oidc/node_modules/.installed
# The Python MCP clients (and the task server) the conformance tests run, each in an environment of its own
# (their pins differ from ours: LangChain's adapters are on the mcp SDK 1.x), pinned in tests/clients/*.txt.
CLIENTS := fastmcp langchain pydantic-ai openai-agents llamaindex autogen
CLIENT_STAMPS := $(foreach c,$(CLIENTS),tests/clients/envs/$(c)/.installed)
# Third-party Python MCP servers whose SDK pins differ from ours (mcp-server-sqlite is on the mcp SDK 1.x),
# each in an environment of its own, pinned in samples/third_party/*.txt: the demo runs them too.
SERVERS := mcp-server-sqlite
SERVER_STAMPS := $(foreach s,$(SERVERS),.servers/$(s)/.installed)

.PHONY: demo test lint bench docs

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

tests/clients/envs/%/.installed: tests/clients/%.txt
	test -x tests/clients/envs/$*/bin/python || $(PYTHON) -m venv tests/clients/envs/$*
	tests/clients/envs/$*/bin/python -m pip install --quiet --upgrade pip
	tests/clients/envs/$*/bin/python -m pip install --quiet -r $<
	touch $@

.servers/%/.installed: samples/third_party/%.txt
	test -x .servers/$*/bin/python || $(PYTHON) -m venv .servers/$*
	.servers/$*/bin/python -m pip install --quiet --upgrade pip
	.servers/$*/bin/python -m pip install --quiet -r $<
	touch $@

demo: $(STAMP) $(NODE_STAMP) $(SERVER_STAMPS) $(if $(DEMO_CUSTOMERS_DATABASE),$(SUITE_STAMP))
	$(PY) -m approver.demo

# The third-party MCP servers and clients the conformance tests run, pinned in their lockfile. Without npm
# (a laptop without Node) those tests skip and say so; CI installs Node, so there they always run.
$(NODE_STAMP): tests/conformance/package-lock.json
	@if command -v npm >/dev/null; then \
		npm ci --prefix tests/conformance --no-audit --no-fund --loglevel=error && touch $(NODE_STAMP); \
	else echo "npm not found: the tests that need Node's MCP servers will skip"; fi

$(OIDC_STAMP): tests/oidc/package-lock.json
	@if command -v npm >/dev/null; then \
		npm ci --prefix tests/oidc --no-audit --no-fund --loglevel=error && touch $(OIDC_STAMP); \
	else echo "npm not found: the company sign-in tests will skip"; fi

$(SUITE_STAMP): tests/conformance-suite/package-lock.json
	@if command -v npm >/dev/null; then \
		npm ci --prefix tests/conformance-suite --no-audit --no-fund --loglevel=error && touch $(SUITE_STAMP); \
	else echo "npm not found: the conformance suite's tests will skip"; fi

# Tests keep their database, broker folder and keys apart from the demo's, so a running demo never
# picks up a test's tasks.
#
# The suite runs as two halves at once, each with its own database, broker folder and keys: the tests spend
# much of their time waiting on servers and browsers, so two cores take about half the time. The second
# half's lines are printed as they come, marked "[second half]", and kept in var/test-second-half.log; its
# exit status counts as the first's does. With PYTEST_ARGS (one file, say), it is one run, as before.
SECOND_HALF := tests/journal/test_conformance.py tests/journal/test_pairings.py tests/journal/test_features.py \
	tests/journal/test_versions_pairings.py tests/journal/test_large_results.py tests/journal/upstream/test_sessions.py \
	tests/journal/test_recorder.py tests/journal/auth/test_oauth.py tests/journal/test_hostile.py tests/journal/test_agent_meta.py \
	tests/journal/test_python_clients.py tests/journal/test_task_calls.py tests/journal/test_conformance_suite.py \
	tests/browser
# The documentation site: a broken link or a missing page fails the build (and so the tests).
docs: $(STAMP)
	@mkdir -p var; NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict > var/docs.log 2>&1 \
		|| { cat var/docs.log; exit 1; }; echo "docs: built (mkdocs build --strict)"

test: $(STAMP) $(NODE_STAMP) $(SUITE_STAMP) $(OIDC_STAMP) $(CLIENT_STAMPS) $(SERVER_STAMPS) lint docs
ifeq ($(strip $(PYTEST_ARGS)),)
	@mkdir -p var; status=0; rm -f var/test-second-half.status; \
	{ VAR_DIR=$(CURDIR)/var/test-2 $(PY) -m pytest $(SECOND_HALF) 2>&1; echo $$? > var/test-second-half.status; } \
		| tee var/test-second-half.log | sed -u 's/^/[second half] /' & second=$$!; \
	VAR_DIR=$(CURDIR)/var/test $(PY) -m pytest $(addprefix --ignore=,$(SECOND_HALF)) || status=$$?; \
	wait $$second; half=$$(cat var/test-second-half.status 2>/dev/null || echo 1); \
	[ "$$half" = 0 ] || status=$$half; \
	echo "--- the second half ($(SECOND_HALF)) exited $$half; its whole output: var/test-second-half.log"; \
	tail -n 1 var/test-second-half.log; exit $$status
else
	VAR_DIR=$(CURDIR)/var/test $(PY) -m pytest $(PYTEST_ARGS)
endif
	VAR_DIR=$(CURDIR)/var/test-pg $(PY) tests/on_postgres.py $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(PY) bench/recorder_latency.py
