"""The plans auto_explain wrote to the server log, read back: each a statement's actual plan
(rows, loops, time and buffers per node, its triggers' time, its JIT timing), with the
top-level statement it ran under.

The server logs a plan as one message: a line `<prefix>LOG:  duration: 1.234 ms  plan:` then
the JSON plan on lines that begin with a tab, then, for a statement nested in another (in a
function, a trigger, a foreign key's check), `CONTEXT:` lines naming where it ran. One
`write()` carries the whole message, so another process's lines never fall inside it. The
embedded cluster's `log_line_prefix` ends with `%Q`, the query id of the top-level statement
the backend is running, so a nested plan names the statement it belongs to; a backend logs a
nested statement's plan before the plan of the statement that ran it.

Pure text parsing: nothing here talks to a server.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

# '%m [%p] %q%u@%d %Q ': time, pid, then (session processes only) user@db and the query id.
_HEAD = re.compile(
    r"^(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) (?P<tz>\S+) \[(?P<pid>\d+)\] "
    r"(?:\S*@\S* (?P<qid>-?\d+) )?(?P<level>[A-Z]+):  (?P<text>.*)$"
)
_PLAN = re.compile(r"^duration: (?P<ms>[\d.]+) ms  plan:$")
_CONTEXT_STATEMENT = re.compile(r'^SQL statement "(?P<sql>.*)"$', re.S)
_FUNCTION = re.compile(r"(?:PL/pgSQL )?function (?P<name>[\w.\"]+)\(")


@dataclass(frozen=True)
class LoggedPlan:
    ts_us: int
    pid: int
    query_id: int | None  # the top-level statement the backend was running (%Q), if known
    nested: bool  # run inside another statement (a CONTEXT names where)
    duration_ms: float
    query_text: str
    context: str  # the CONTEXT lines, one per line ('' for a top-level statement)
    plan: dict[str, Any]  # auto_explain's JSON document: Query Text, Plan, Triggers, JIT

    @property
    def function(self) -> str | None:
        """The function the statement ran in, where the context names one."""
        found = _FUNCTION.search(self.context)
        return found["name"] if found else None


def _epoch_us(ts: str) -> int:
    return round(datetime.fromisoformat(ts + "+00:00").timestamp() * 1_000_000)


def _messages(lines: list[str]) -> Iterator[tuple[re.Match[str], list[str]]]:
    """Each message's head line and its continuation lines (those starting with a tab)."""
    head: re.Match[str] | None = None
    body: list[str] = []
    for line in lines:
        if line.startswith("\t"):
            if head is not None:
                body.append(line[1:])
            continue
        if head is not None:
            yield head, body
        head, body = _HEAD.match(line), []
    if head is not None:
        yield head, body


def parse_plans(text: str) -> list[LoggedPlan]:
    """The plans in a piece of server log (whole messages; a message cut at the end is left
    out). Times are UTC, as pgscope's clusters log; other lines are passed over."""
    plans: list[LoggedPlan] = []
    pending: dict[int, LoggedPlan] = {}  # per pid: the last plan, until its context is known
    lines = text.split("\n")
    if lines and lines[-1] != "":
        lines = lines[:-1]  # the last line may still be being written
    for head, body in _messages(lines):
        pid = int(head["pid"])
        if head["level"] == "CONTEXT" and pid in pending:
            logged = pending.pop(pid)
            context = "\n".join([head["text"], *body])
            plans.append(_with_context(logged, context))
            continue
        if pid in pending:
            plans.append(pending.pop(pid))
        if head["level"] != "LOG" or head["tz"] not in ("UTC", "Etc/UTC", "GMT"):
            continue
        found = _PLAN.match(head["text"])
        if found is None:
            continue
        try:
            document = json.loads("\n".join(body))
        except json.JSONDecodeError:
            continue  # not a JSON plan (auto_explain.log_format other than json)
        if not isinstance(document, dict) or "Plan" not in document:
            continue
        qid = int(head["qid"]) if head["qid"] not in (None, "0") else None
        pending[pid] = LoggedPlan(
            _epoch_us(head["ts"]),
            pid,
            qid,
            False,
            float(found["ms"]),
            str(document.get("Query Text", "")),
            "",
            document,
        )
    plans.extend(pending.values())
    return sorted(plans, key=lambda p: p.ts_us)


def _with_context(plan: LoggedPlan, context: str) -> LoggedPlan:
    return LoggedPlan(
        plan.ts_us,
        plan.pid,
        plan.query_id,
        True,
        plan.duration_ms,
        plan.query_text,
        context,
        plan.plan,
    )
