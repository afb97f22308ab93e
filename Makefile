# The two commands of the README. Both install what is missing first (scripts/setup.sh).
#   make run    a scalability sweep on a throw-away cluster; the report lands in results/
#   make test   the whole test suite against real PostgreSQL, pgbench, bpftrace and perf
#   make test-fast  the tests that need no server and no tracing
RUN_ARGS ?= scaling --quick
PYTEST_ARGS ?=

.PHONY: setup run test test-fast lint typecheck bench clean

setup:
	./scripts/setup.sh

run: setup
	.venv/bin/pgscope run $(RUN_ARGS)

# Two passes: what measures no load runs on both cores at once (a test file per worker, so a
# module's cluster starts once); the tests marked `load` then run alone, since every finding
# reads the host's CPU.
test: setup
	.venv/bin/python -m pytest -m "not load" -n 2 --dist loadfile $(PYTEST_ARGS)
	.venv/bin/python -m pytest -m load $(PYTEST_ARGS)

# No test here may start PostgreSQL, pgbench, bpftrace or perf: tests/suite.py makes them
# fail when the selection has no test marked for them. With no load to measure, they run on
# every core (pytest-xdist).
test-fast: setup
	.venv/bin/python -m pytest -m "not server and not tracing" -n auto $(PYTEST_ARGS)

lint: setup
	.venv/bin/ruff check src tests bench
	.venv/bin/ruff format --check src tests bench
	.venv/bin/lint-imports

typecheck: setup
	.venv/bin/mypy

clean:
	rm -rf .venv .tools .pytest_cache .mypy_cache .ruff_cache
