"""Counts in words, for every text pgscope writes: "1 client", "8 clients"; and text from
the database made inert before a terminal shows it."""

from __future__ import annotations

import math
import re

# What a terminal acts on instead of showing: the C0 controls but line feed and tab (ESC
# starts a sequence that can recolour, move the cursor, retitle the window or write a
# hyperlink; BEL, backspace and carriage return rewrite what is shown), DEL, the C1 controls
# (0x9b is CSI, ESC [ in one character), and the marks that reorder text right to left.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def inert(text: str) -> str:
    """`text` with every character a terminal would act on written as its escape (`\\x1b`,
    `\\u202e`): a query, an application name or a server's message shows, and does nothing."""
    return _CONTROL.sub(_escape, text)


def _escape(found: re.Match[str]) -> str:
    code = ord(found.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def counted(n: float, noun: str, plural: str | None = None) -> str:
    """`n` and the noun that agrees with it; a whole float shows without its ".0"."""
    shown = f"{n:.0f}" if float(n).is_integer() else f"{n:g}"
    return f"{shown} {noun if shown == '1' else (plural or noun + 's')}"


def n_clients(n: float | None) -> str:
    """None is the run's own fact sheet, which spans every cell."""
    return "every client count" if n is None else counted(n, "client")


def plain(value: float, digits: int = 4) -> str:
    """`value` to `digits` significant digits as people write numbers: never an exponent
    (30,260, not 3.026e+04; 0.0007691, not 7.691e-04), thousands separated, no trailing
    zeros."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    magnitude = math.floor(math.log10(abs(value)))
    decimals = max(0, digits - 1 - magnitude)
    rounded = round(value, decimals)
    if rounded and math.floor(math.log10(abs(rounded))) > magnitude:  # 9.9996 -> 10.00
        decimals = max(0, decimals - 1)
    shown = f"{value:,.{decimals}f}"
    return shown.rstrip("0").rstrip(".") if "." in shown else shown


def human_bytes(n: float) -> str:
    """A size in binary units to 3 significant digits: 25276510208 is "23.5 GiB"."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1000 or unit == "TiB":  # 1,000 to 1,023 read better as 0.98 of the next
            return f"{plain(n, 3)} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
