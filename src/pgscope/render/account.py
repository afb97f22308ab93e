"""The account of active time on the console: each shown account's heaviest paths as an
indented tree (the report draws the whole tree as an icicle), and the branches it could not
follow. Renders the analysis only."""

from __future__ import annotations

from rich.console import Console

from pgscope.analyze.account import Account, Node
from pgscope.analyze.model import RunAnalysis
from pgscope.words import n_clients

# Nodes below this share of active time are left out of the console tree.
SHOWN_SHARE = 0.05
MAX_CHILDREN = 3


def tree_lines(account: Account) -> list[str]:
    """The heavy part of the account as lines: share, then the node, indented by depth. An
    event named as its class (CPU under CPU) is folded into it."""
    lines: list[str] = []

    def walk(node: Node, depth: int, parent: Node | None) -> None:
        folded = node.kind == "event" and parent is not None and node.name == parent.name
        if node.kind != "active" and not folded:
            seconds = f"{node.seconds:,.1f} s" if node.seconds >= 0.05 else ""
            lines.append(f"{node.share:5.0%} {seconds:>9}  {'  ' * depth}{node.name}")
            depth += 1
        shown = [c for c in node.children if c.share >= SHOWN_SHARE][:MAX_CHILDREN]
        for child in shown:
            walk(child, depth, node)

    walk(account.root, 0, None)
    return lines


def heading(account: Account) -> str:
    if account.scope == "whole":
        where = "the whole observation"
    elif account.scope == "window":
        where = f"window {account.step_id}"
    elif account.rate is not None:
        where = (
            f"{account.variant}, {account.rate:,.0f} tps offered by "
            f"{n_clients(account.clients or 0)}"
        )
    else:
        where = f"{account.variant}, {n_clients(account.clients or 0)}"
    return (
        f"where active time went ({where}; {account.samples:,} samples, "
        f"{account.aas:.1f} active sessions on average):"
    )


def print_account(console: Console, result: RunAnalysis) -> None:
    for account in result.peak_accounts():
        if not account.samples:
            continue
        console.print(f"\n{heading(account)}", highlight=False, markup=False)
        for line in tree_lines(account):
            console.print(f"  {line}", highlight=False, markup=False, soft_wrap=True)
        for closed in account.closed:
            console.print(
                f"  not followed: {closed.branch}: {closed.why} (opens with: {closed.opens})",
                highlight=False,
                markup=False,
            )
