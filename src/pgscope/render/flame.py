"""Profiles as files: folded text, speedscope JSON, and interactive HTML flame graphs.

Renderers compute nothing: the trees, shares and deltas come from `analyze/profile.py`.
The HTML views are self-contained (d3 and d3-flame-graph inlined from `render/vendor/`,
see its README for versions and licenses): they open offline, from a file or an archive.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from pgscope import __version__
from pgscope.analyze.profile import (
    Differential,
    FlameGraph,
    FunctionDelta,
    Profile,
    diff_flame_graph,
    flame_graph,
)
from pgscope.files import write_atomic

SPEEDSCOPE_SCHEMA_URL = "https://www.speedscope.app/file-format-schema.json"


def _asset(*parts: str) -> str:
    return (resources.files("pgscope") / "render").joinpath(*parts).read_text(encoding="utf-8")


@cache
def speedscope_schema() -> dict[str, Any]:
    """speedscope's published file-format schema (vendored, JSON Schema draft-07)."""
    schema: dict[str, Any] = json.loads(_asset("vendor", "speedscope", "file-format-schema.json"))
    return schema


def folded_text(profile: Profile) -> str:
    """The ecosystem's folded format: `frame;frame;frame value` per line, root first, the
    process role (and off-CPU state) as the first frames; largest first."""
    lines = sorted(profile.full_stacks(), key=lambda item: (-item[1], item[0]))
    return "".join(f"{';'.join(frames)} {value}\n" for frames, value in lines)


def speedscope_document(profiles: Sequence[Profile], name: str) -> dict[str, Any]:
    """A speedscope file: one "sampled" profile per input, frames shared between them."""
    frames: list[dict[str, str]] = []
    index: dict[str, int] = {}
    out = []
    for profile in profiles:
        samples: list[list[int]] = []
        weights: list[int] = []
        for stack, value in sorted(profile.full_stacks(), key=lambda item: item[0]):
            ids = []
            for frame in stack:
                if frame not in index:
                    index[frame] = len(frames)
                    frames.append({"name": frame})
                ids.append(index[frame])
            samples.append(ids)
            weights.append(value)
        out.append(
            {
                "type": "sampled",
                "name": profile.label or profile.kind,
                "unit": "none" if profile.kind == "cpu" else "microseconds",
                "startValue": 0,
                "endValue": profile.total,
                "samples": samples,
                "weights": weights,
            }
        )
    return {
        "$schema": SPEEDSCOPE_SCHEMA_URL,
        "shared": {"frames": frames},
        "profiles": out,
        "name": name,
        "activeProfileIndex": 0,
        "exporter": f"pgscope {__version__}",
    }


def _page(document: dict[str, Any]) -> str:
    # "</" inside a <script> would end it early; JSON allows the escaped form.
    data = json.dumps(document, separators=(",", ":")).replace("</", "<\\/")
    page = _asset("templates", "flame.html")
    for marker, text in (
        ("__FLAMEGRAPH_CSS__", _asset("vendor", "d3-flame-graph", "d3-flamegraph.css")),
        ("__D3_JS__", _asset("vendor", "d3", "d3.min.js")),
        ("__FLAMEGRAPH_JS__", _asset("vendor", "d3-flame-graph", "d3-flamegraph.umd.min.js")),
        ("__TITLE__", _escape(document["title"])),
        ("__DATA__", data),
    ):
        page = page.replace(marker, text, 1)
    return page


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def flame_page(graph: FlameGraph) -> str:
    """An interactive flame graph (zoom by click, search, hover counts) with its table below:
    the top functions by self share, or, for a differential (`b`'s shape coloured by the
    change from `a`: red grew, blue shrank, normalised per sample), what grew and shrank."""
    diff = graph.differential
    if diff is None:
        rows = [
            [
                f.name,
                f"{f.self_value:,}",
                f"{f.self_share:.2%}",
                f"{f.total_value:,}",
                f"{f.total_share:.2%}",
            ]
            for f in graph.top_self
        ]
        return _page(
            {
                "title": graph.title,
                "subtitle": f"{graph.total:,} {graph.unit}",
                "unit": graph.unit,
                "differential": False,
                "tree": graph.tree,
                "tables": [
                    {
                        "title": f"Top {len(rows)} functions by self share",
                        "columns": ["function", "self", "self %", "total", "total %"],
                        "rows": rows,
                    }
                ],
            }
        )

    def table(label: str, deltas: Sequence[FunctionDelta]) -> dict[str, Any]:
        return {
            "title": label,
            "columns": ["function", f"total % {diff.a}", f"total % {diff.b}", "change"],
            "rows": [
                [d.name, f"{d.total_a:.2%}", f"{d.total_b:.2%}", f"{d.total_delta:+.2%}"]
                for d in deltas
            ],
        }

    return _page(
        {
            "title": graph.title,
            "subtitle": f"{graph.base_label}: {graph.base_total or 0:,} {graph.unit} → "
            f"{graph.label}: {graph.total:,} {graph.unit}; colour = change in share of all "
            "samples",
            "unit": graph.unit,
            "differential": True,
            "tree": graph.tree,
            "tables": [table("Grew most", diff.grew), table("Shrank most", diff.shrank)],
        }
    )


def flame_html(profile: Profile, title: str, top: int = 25) -> str:
    """A profile's flame graph page (see flame_page)."""
    return flame_page(flame_graph(profile, title, top))


def diff_flame_html(a: Profile, b: Profile, diff: Differential, title: str) -> str:
    """A differential flame graph page from `a` to `b`, with `diff`'s tables (flame_page)."""
    return flame_page(replace(diff_flame_graph(a, b, title), differential=diff))


def write_profile_files(profile: Profile, directory: Path, stem: str, title: str) -> list[Path]:
    """`<stem>.folded`, `<stem>.speedscope.json` and `<stem>.html` in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    return [
        write_atomic(directory / f"{stem}.folded", folded_text(profile)),
        write_atomic(
            directory / f"{stem}.speedscope.json",
            json.dumps(speedscope_document([profile], title)),
        ),
        write_atomic(directory / f"{stem}.html", flame_html(profile, title)),
    ]
