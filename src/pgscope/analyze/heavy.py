"""The heavy paths of an account of active time: from each statement, down through every
child that holds a good part of its parent, to the node where the evidence stops being one
thing (analyze/paths.py interprets them; analyze/facts/account.py says how much the heaviest
explains).

From each statement of the account, a path goes down through every child that holds a good
part of its parent (BRANCH of it, and MIN_SHARE of the active time): a statement whose time is
half planning and half JIT has two paths. A path ends at a node none of whose children hold
that much. The same deepest node reached under several waits (a scan's CPU and its reads) is
one path, their shares added.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pgscope.analyze.account import Account, Node

# A child is followed when it holds this much of its parent...
BRANCH = 0.3
# ... and this much of the active time; a path below it names nothing worth the reader's time.
MIN_SHARE = 0.05
# Waits that are not the server's work, whatever the state beside them says: a session in a
# statement waiting for its client's next message (COPY data, a message of the extended
# protocol) waits for the client; and in short statements such a sample is mostly one read at
# two instants, the state while the statement ran and the wait after it ended (the same runs
# show sessions 'idle' with no wait or with an LWLock wait, the tear the other way: 598 and 23
# samples beside 211 'active' ones on Client:ClientRead in the partition-locks case). The
# account keeps their time; no path follows it.
NOT_THE_SERVERS = frozenset({"Client:ClientRead"})


@dataclass(frozen=True)
class Path:
    nodes: tuple[Node, ...]  # from the root of the account to the deepest node
    share: float  # the deepest node's, over every wait it was reached under
    events: tuple[str, ...]

    @property
    def deepest(self) -> Node:
        return self.nodes[-1]

    def nearest(self, kind: str) -> Node | None:
        """The path's deepest node of this kind."""
        return next((n for n in reversed(self.nodes) if n.kind == kind), None)

    @property
    def statement(self) -> Node | None:
        return self.nearest("statement")


def heavy_paths(account: Account) -> list[Path]:
    """Every path worth naming, heaviest first."""
    merged: dict[tuple[Any, ...], Path] = {}
    for klass in account.root.children:
        for event in klass.children:
            if event.name in NOT_THE_SERVERS:
                continue
            for statement in event.children:
                if statement.share < MIN_SHARE:
                    continue
                for nodes in _descend((account.root, klass, event, statement)):
                    deepest = nodes[-1]
                    # A statement's own waits stay apart (its commit's, its locks').
                    key: tuple[Any, ...] = (
                        statement.detail.get("query_id") or statement.name,
                        deepest.kind,
                        deepest.name,
                        event.name if deepest.kind == "statement" else None,
                    )
                    was = merged.get(key)
                    if was is None:
                        merged[key] = Path(nodes, deepest.share, (event.name,))
                    else:
                        heavier = nodes if deepest.share > was.deepest.share else was.nodes
                        merged[key] = Path(
                            heavier, was.share + deepest.share, (*was.events, event.name)
                        )
    return sorted(merged.values(), key=lambda p: (-p.share, p.deepest.name))


def _descend(nodes: tuple[Node, ...]) -> list[tuple[Node, ...]]:
    node = nodes[-1]
    followed = [c for c in node.children if c.share >= max(BRANCH * node.share, MIN_SHARE)]
    if not followed:
        return [nodes]
    return [p for c in followed for p in _descend((*nodes, c))]
