"""Everything a run folder carries besides the store, written from one analysed run: the JSON
document, the console summary as text, and the HTML report."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from pathlib import Path

from pgscope.analyze.model import RunAnalysis
from pgscope.files import write_atomic
from pgscope.render.console import print_summary
from pgscope.render.html import write_report
from pgscope.render.inert import InertConsole
from pgscope.render.json_doc import run_document


def write_outputs(
    analysis: RunAnalysis, offered: Mapping[str, str] | None = None
) -> dict[str, Path]:
    """summary.json, summary.txt and report.html in the run folder; `offered` names the
    collectors this pgscope has (the report lists those the run did not select)."""
    folder = analysis.folder
    # Compact: json's C encoder serves no indent (a 3-step run's 5 MB indented took 0.38 s in
    # Python's encoder, compact 1.2 MB 0.04 s); `--json` prints the same document indented.
    document = json.dumps(run_document(analysis), default=str, separators=(",", ":"))
    write_atomic(folder / "summary.json", document)
    write_atomic(folder / "summary.txt", summary_text(analysis))
    return {
        "summary.json": folder / "summary.json",
        "summary.txt": folder / "summary.txt",
        "report.html": write_report(analysis, folder, offered),
    }


def summary_text(analysis: RunAnalysis) -> str:
    """The console summary as a file: each paragraph one line, for the reader's editor or pager
    to wrap (a hard wrap at 110 columns cut phrases and left the padding as trailing spaces);
    the tables keep their columns, without trailing spaces."""
    recorder = InertConsole(record=True, width=110, soft_wrap=True, file=io.StringIO())
    print_summary(recorder, analysis)
    return "".join(line.rstrip() + "\n" for line in recorder.export_text().splitlines())
