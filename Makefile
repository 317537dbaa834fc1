# Everything runs inside .venv, created on first use (pip upgraded first: the system pip 23
# can spend many minutes resolving this dependency set).
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

.PHONY: venv system-deps sandbox-deps demo test test-fast test-durations bench bench-smoke lint stop run clean crash-kit

# Browser tests drive Debian's Chromium through Playwright (browser downloads do not work here); the
# pooled-connection tests start Debian's PgBouncer; local instances run in bubblewrap sandboxes.
SYSTEM_DEPS := chromium fonts-dejavu-core pgbouncer bubblewrap dovecot-imapd strace socat

$(VENV)/.installed: pyproject.toml examples/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	# CPU build of torch first (the embedding model's dependency); unpinned it would be a multi-GB CUDA build.
	$(VENV)/bin/pip install --quiet torch==2.13.0
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	# The example agents are a separate distribution, found by agent-host through its entry points.
	$(VENV)/bin/pip install --quiet -e ./examples
	touch $@

venv: $(VENV)/.installed

demo: venv sandbox-deps  ## onboard three customers on the embedded default and show their instances
	$(PY) scripts/demo.py

run: venv  ## web, worker, beat and the exit watcher under a supervisor that restarts a crashed one (logs in var/log)
	$(PY) scripts/services.py start

stop:  ## stop everything `make demo` / `make run` started, the embedded PostgreSQL too (KEEP_DB=1 keeps it up)
	@if [ -x $(PY) ]; then $(PY) scripts/services.py stop $(if $(filter-out 0,$(KEEP_DB)),--keep-db); fi

# One OS user and one bubblewrap sandbox per instance needs root and bwrap; without them instances still run,
# marked "isolation: degraded" (docs/security.md). socat: the relays of each instance's own network namespace
# (LOCAL_INSTANCE_NETWORK=auto isolates only where it is installed). PgBouncer: the demo's instances connect through
# it (pooled); without it they connect to PostgreSQL directly.
sandbox-deps:
	@if ! command -v bwrap >/dev/null 2>&1 || ! command -v socat >/dev/null 2>&1 || ! [ -x /usr/sbin/pgbouncer ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap socat pgbouncer; \
	  else echo "note: without root and bubblewrap every instance runs with degraded isolation and the machine's network; without pgbouncer, unpooled"; fi; \
	fi

system-deps:
	@if ! command -v chromium >/dev/null 2>&1 || ! [ -x /usr/sbin/pgbouncer ] || ! command -v bwrap >/dev/null 2>&1 || ! [ -x /usr/sbin/dovecot ] || ! command -v strace >/dev/null 2>&1 || ! command -v socat >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SYSTEM_DEPS); \
	  else echo "The browser, pooling and sandbox tests need Debian packages: sudo apt-get install $(SYSTEM_DEPS)"; exit 1; fi; \
	fi

# Test files run in TEST_WORKERS processes (pytest-xdist; one file stays in one process, so its module fixtures are
# made once). Most of the suite waits on processes it started (workers, agent-hosts, peers), so two processes on
# two cores take about half the time of one. Each process has its own test database, queue, names and uid block.
TEST_WORKERS ?= 2

test: venv system-deps  ## the test suite (real PostgreSQL: DATABASE_URL, or the embedded one), TEST_WORKERS at once
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=25  # the slowest 25 printed: where CI's minutes go

test-fast: venv  ## the fast tier: no browser, no processes of ours, nothing recorded as slow (tests/tiers.py)
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not slow and not e2e and not browser"

test-durations: venv system-deps  ## the full suite, recording each test's seconds in tests/durations.json (the slow tier)
	$(PY) -m pytest --record-durations tests/durations.json

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy  # the data plane and every control-plane app (pyproject [tool.mypy])
	$(PY) manage.py makemigrations --check --dry-run

bench: venv  ## benchmarks, each printing a ratio against an anchor measured in the same run (docs/benchmarks.md)
	$(VENV)/bin/pip install --quiet -e '.[dev,bench]'
	$(PY) bench/run_all.py
	# Issue 33's long runs (~15 min): a real instance on 30 s tokens SIGKILLed for 10 minutes; the refresher 20 times.
	$(PY) bench/bench_connections.py --soak

bench-smoke: venv  ## every benchmark at a tiny size, two at a time (~3 min): each still runs; its figures mean nothing
	$(VENV)/bin/pip install --quiet -e '.[dev,bench]'
	$(PY) bench/run_all.py --smoke

crash-kit: venv  ## the attacks and LangGraph's duplicate executions, ours and plain LangGraph side by side (docs/runtime.md)
	$(PY) scripts/crash_kit.py

clean:  ## stop everything, remove the agt-* users of this var/'s instances, delete var/ (CONTROLPLANE_VAR_DIR)
	@if [ -x $(PY) ]; then $(PY) scripts/services.py clean; else rm -rf "$${CONTROLPLANE_VAR_DIR:-var}"; fi
