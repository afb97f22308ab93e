"""`run --plan` lists what the run would do: on a user's server, no collector that runs only
on clusters pgscope starts (issue 30: it listed waldevice, which the run then called
unavailable). No server: --plan connects to nothing."""

from __future__ import annotations

import json

from pgscope.collect import registry
from tests.cli import pgscope


def _collectors(*args: str) -> list[str]:
    result = pgscope("run", "--plan", "--json", *args)
    assert result.returncode == 0, result.stderr
    collectors: list[str] = json.loads(result.stdout)["collectors"]
    return collectors


def test_the_plan_for_a_users_server_lists_only_what_can_run_there() -> None:
    embedded_only = {name for name, cls in registry().items() if cls.embedded_only}
    assert "waldevice" in embedded_only
    assert embedded_only <= set(_collectors())  # on a cluster pgscope starts: listed
    on_server = _collectors("--dsn", "host=/nonexistent dbname=app")
    assert not embedded_only & set(on_server), on_server
    assert {"activity", "pgstats", "statements"} <= set(on_server)
