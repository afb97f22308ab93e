# The two commands of the README. Both install what is missing first (scripts/setup.sh).
#   make run    a scalability sweep on a throw-away cluster; the report lands in results/
#   make test   the whole test suite against real PostgreSQL, pgbench, bpftrace and perf
#   make test-fast  the tests that need no server and no tracing (under a minute)
RUN_ARGS ?= scaling --quick
PYTEST_ARGS ?=

.PHONY: setup run test test-fast lint typecheck bench clean

setup:
	./scripts/setup.sh

run: setup
	.venv/bin/pgscope run $(RUN_ARGS)

test: setup
	.venv/bin/python -m pytest $(PYTEST_ARGS)

# No test here may start PostgreSQL, pgbench, bpftrace or perf: tests/suite.py makes them
# fail when the selection has no test marked for them. With no load to measure, they run on
# every core (pytest-xdist); `make test` stays serial, since its runs measure the host's CPU.
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
