"""An observation's accounts read by window in one pass (account.Steps) are the accounts each
scope reads on its own: every window's, and the whole's summed from its windows."""

from __future__ import annotations

from pathlib import Path

from pgscope.analyze import account
from pgscope.analyze.statements import Statements
from pgscope.duck import connect
from pgscope.store import RunStore
from tests.stores import busy_observation

T0 = 1_790_000_000_000_000
SECOND = 1_000_000


def test_windows_read_in_one_pass_are_the_windows_read_one_by_one(tmp_path: Path) -> None:
    run_dir = busy_observation(tmp_path / "observe", T0, seconds=60, sessions=6, hz=10)
    # Readings of who blocks whom, some in a window's first second (10, 40): 1000 waits for
    # 1001, idle in its transaction; 1002 for 1003, active.
    db = connect(str(run_dir / "run.duckdb"))
    for second in (3, 9, 10, 17, 31, 40, 52):
        for waiter, holder, state in ((1000, 1001, "idle in transaction"), (1002, 1003, "active")):
            db.execute(
                "INSERT INTO activity_blockers (ts_us, pid, blocked_by, locktype, relation, "
                "mode, blocker_state, blocker_xact_s, blocker_state_s, blocker_query, "
                "blocker_application) VALUES (?, ?, ?, 'transactionid', NULL, 'ShareLock', ?, "
                "?, ?, 'update counters set n = n + 1 where id = 1', 'app')",
                [T0 + second * SECOND + 450_000, waiter, holder, state, 0.1 * second, 0.07],
            )
    db.close()
    store = RunStore.open(run_dir)
    try:
        steps = [
            int(s) for (s,) in store.db.execute("SELECT step_id FROM steps ORDER BY 1").fetchall()
        ]
        assert len(steps) == 6
        read = account.Steps.read(store.db, steps)
        assert any(read.blockers.get(s) for s in steps), "the planted readings are matched"
        section = Statements()
        for scope in [[s] for s in steps] + [steps]:
            alone = account.build(store.db, scope, section, {}, "window", "observed", 0)
            together = account.build(
                store.db, scope, section, {}, "window", "observed", 0, None, None, None, read
            )
            assert together == alone, scope
            assert alone.samples > 0
    finally:
        store.close()
