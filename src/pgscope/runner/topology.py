"""Every server a run uses, and their teardown on every way out of the run.

The embedded cluster, its streaming standbys and the extra instances beside it are started
here and torn down when the `with` block ends, whether it returns or raises (an exception,
Ctrl-C, SIGTERM). An existing server given by DSN is used, never stopped.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from pgscope.proc import RunAs
from pgscope.store import RunStore
from pgscope.target.conn import ConnParams
from pgscope.target.embedded import EmbeddedCluster
from pgscope.target.pgbin import PgBinaries
from pgscope.target.server import ExistingServer


class Topology:
    """The servers of one run: an embedded cluster with its standbys and instances, or an
    existing server. Use it as a context manager; leaving it tears down what was started."""

    def __init__(
        self, say: Callable[[str], None], store: RunStore, server: ExistingServer | None = None
    ) -> None:
        self.say = say
        self.store = store
        self.server = server
        self.cluster: EmbeddedCluster | None = None
        self.standbys: list[EmbeddedCluster] = []
        self.instances: list[EmbeddedCluster] = []  # beyond the first

    def __enter__(self) -> Topology:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Last registered runs first: instances and standbys before the cluster they were
        # copied from. Each runs even if one before it raised: every server must stop.
        with contextlib.ExitStack() as cleanup:
            if self.cluster is not None:
                cleanup.callback(self.cluster.teardown)
                cleanup.callback(self.say, "stopping the embedded cluster")
            for other in [*self.standbys, *self.instances]:
                cleanup.callback(other.teardown)

    def start_embedded(
        self,
        pg: PgBinaries,
        account: RunAs,
        startup: dict[str, str],
        work_dir: Path | None,
        standbys: int,
    ) -> EmbeddedCluster:
        """Start the embedded cluster with `startup` in its configuration, then `standbys`
        streaming standbys of it (s1, s2, ...), streaming when this returns."""
        cluster = EmbeddedCluster(pg, account, self.store.run_dir / "server.log", startup, work_dir)
        self.cluster = cluster  # so that teardown happens even if start fails half-way
        self.say(f"starting an embedded PostgreSQL cluster as {account.name}")
        cluster.start()
        if standbys:
            names = [f"s{i}" for i in range(1, standbys + 1)]
            self.say(f"starting {len(names)} streaming standbys ({', '.join(names)})")
            for name in names:
                standby = EmbeddedCluster.standby_of(cluster, name)
                self.standbys.append(standby)  # before start: teardown must find it either way
                standby.start()
            cluster.wait_streaming(names)
            self.store.add_event("standbys", f"{', '.join(names)} streaming")
        return cluster

    def start_instance(self, number: int) -> EmbeddedCluster:
        """Instance `number` (2, 3, ...) beside the embedded cluster, started, its data not
        yet initialised."""
        assert self.cluster is not None, "instances are siblings of the embedded cluster"
        self.say(f"starting instance {number} beside the first")
        instance = self.cluster.sibling(self.store.run_dir / f"server-{number}.log")
        self.instances.append(instance)  # before start: teardown must find it either way
        instance.start()
        return instance

    def wait_standbys(self) -> None:
        """After the primary restarted: synchronous commits would wait for the standbys to
        reconnect, on the next step's time."""
        if self.cluster is not None and self.standbys:
            self.cluster.wait_streaming([s.standby_name for s in self.standbys])

    @property
    def conn(self) -> ConnParams:
        """The target's connection: the embedded cluster's, else the existing server's."""
        if self.cluster is not None:
            return self.cluster.conn
        assert self.server is not None, "no target is up"
        return self.server.conn

    def target_alive(self) -> bool:
        if self.cluster is not None:
            return self.cluster.is_alive()
        return self.server is None or self.server.is_alive()
