"""The suite's fixtures, each from the module of its concern. Tests run against real PostgreSQL,
started by pgscope's own embedded target.

- `suite.py`: the session's marker, TMPDIR and initdb templates (set before pgscope is
  imported), the tiers (`server`, `tracing`, `load`) and what a tier may start, leftovers;
- `cli.py`: the real CLI as a user runs it (`pgscope(...)`, `start`, `one_line_error`);
- `servers.py`: PostgreSQL binaries of each version, clusters, the load account, `tmpfs`;
- `runs.py`: the reference run and the diagnosis of a run's JSON document;
- `browser.py`, `poll.py`, `planted.py`, `stores.py`, `record.py`: what a few modules share.
"""

from __future__ import annotations

from tests import suite
from tests.runs import reference_run
from tests.servers import cluster, load_user, pg, pg_newer, pg_version, shared_cluster

pytest_collection_modifyitems = suite.pytest_collection_modifyitems
pytest_collection_finish = suite.pytest_collection_finish
no_leftovers = suite.no_leftovers

__all__ = [
    "cluster",
    "load_user",
    "no_leftovers",
    "pg",
    "pg_newer",
    "pg_version",
    "pytest_collection_finish",
    "pytest_collection_modifyitems",
    "reference_run",
    "shared_cluster",
]
