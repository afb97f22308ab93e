"""Counts in words, for every text pgscope writes: "1 client", "8 clients"."""

from __future__ import annotations


def counted(n: float, noun: str, plural: str | None = None) -> str:
    """`n` and the noun that agrees with it; a whole float shows without its ".0"."""
    shown = f"{n:.0f}" if float(n).is_integer() else f"{n:g}"
    return f"{shown} {noun if shown == '1' else (plural or noun + 's')}"


def n_clients(n: float | None) -> str:
    """None is the run's own fact sheet, which spans every cell."""
    return "every client count" if n is None else counted(n, "client")
