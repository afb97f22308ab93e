"""An observation's windows, scalability note and layers on the console (`pgscope observe`,
`report` of an observe run). Formatting only: the figures come from analyze.observation."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pgscope.analyze.model import WindowJudgement
from pgscope.analyze.observation import Observation

MAX_ROWS = 30  # beyond, the outliers, the worst window and the first and last windows


def _num(value: float | None, fmt: str = ",.0f") -> str:
    return "-" if value is None else format(value, fmt)


def _short(text: str | None, width: int = 48) -> str:
    if not text:
        return "-"
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def print_observation(
    console: Console,
    observation: Observation,
    t0_us: int | None,
    judged: WindowJudgement | None = None,
) -> None:
    windows = observation.windows
    shown = windows
    if len(windows) > MAX_ROWS:
        keep = {w.step_id for w in windows[:5] + windows[-5:]}
        keep |= set(observation.outliers) | {observation.worst_window or -1}
        shown = [w for w in windows if w.step_id in keep]
    title = f"windows ({len(windows)}"
    title += f" of {observation.window_s:g} s)" if observation.window_s else ")"
    if len(shown) < len(windows):
        title += f", {len(shown)} shown: first, last, outlying and worst"
    table = Table(title=title, title_justify="left", show_edge=False)
    for name, justify in (
        ("#", "right"),
        ("at s", "right"),
        ("sessions", "right"),
        ("commits/s", "right"),
        ("AAS", "right"),
        ("top wait", "left"),
        ("top query", "left"),
        ("note", "left"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for w in shown:
        at = (w.start_us - t0_us) / 1e6 if w.start_us is not None and t0_us else None
        wait = (
            f"{w.top_wait} {100 * w.top_wait_share:.0f}%"
            if w.top_wait and w.top_wait_share is not None
            else "-"
        )
        notes = []
        if w.status != "ok":
            notes.append(w.status)
        if w.step_id == observation.worst_window:
            notes.append("worst")
        if w.outlier:
            notes.append(f"outlier: {w.outlier}")
        table.add_row(
            str(w.step_id),
            _num(at, ".0f"),
            _num(w.concurrency, ".1f"),
            _num(w.tps),
            _num(w.aas, ".2f"),
            wait,
            escape(_short(w.top_query)),
            escape("; ".join(notes)),
        )
    console.print()
    console.print(table)
    if judged is not None:
        console.print(f"worst window: {escape(judged.note)}", highlight=False)
    console.print(f"scalability: {escape(observation.scalability_note)}", highlight=False)
    console.print("layers:", highlight=False)
    for layer in observation.layers:
        colour = {"seen": "green", "partial": "yellow", "not asked": "dim"}.get(layer.status, "red")
        detail = f": {layer.detail}" if layer.detail else ""
        if layer.cost:
            detail += f" (cost: {layer.cost})"
        console.print(
            f"  [{colour}]{layer.name}: {layer.status}[/{colour}]{escape(detail)}",
            highlight=False,
        )
    if observation.own_cpu_share is not None:
        console.print(
            f"  pgscope's own CPU while observing (with any tracer it ran): "
            f"{100 * observation.own_cpu_share:.1f}% of the host",
            highlight=False,
        )
