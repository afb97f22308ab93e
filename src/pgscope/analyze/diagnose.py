"""The diagnosis: facts and the account of active time -> ranked findings. The causes of the
catalogue (causes.toml, analyze/catalogue.py) that facts trigger (rules) judge each cell's
facts; the heavy paths of the account (analyze/paths.py) are findings too, interpreted by the
causes paths trigger (mechanisms), and a path a cause with both triggers interprets joins the
finding its facts make (its title then names the statement, node, relation or holder, and its
share is the path's). Each finding carries its confidence, the facts behind it (with their
collector), what would refute it, and what to try. Weak or contradictory evidence is said as
such, and so is what the account could not follow.

Ranking, in a run with variants: findings specific to some variants (or about the variants
against each other) before those every variant shares, since in a comparison the shared ones
are the background, not the answer; then findings on variants clearly slower than the fastest
(they explain a loss; the fastest one's explain its ceiling); then causes before symptoms (a
full scan or a spilling sort explains a CPU that is busy: "CPU-bound" alone does not say
why); then confidence; then, among
equally confident findings, the narrower one, which fewer variants show, since it is what sets
the variants apart (in the syncrep recipe commits flush WAL in five variants but wait for a
standby in four); then the share of active time it explains (its path's, where the account
measured one); then the score. A heavy path no mechanism interprets is a cause where its
node is time to cut (planning, JIT, a function, a trigger, a wait, a wasteful plan node); one
whose node shows no waste (an index lookup of one row) says where the time goes, after every
cause and symptom.
"""

from __future__ import annotations

import dataclasses
import operator
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pgscope.analyze import catalogue, paths
from pgscope.analyze.absence import Absence
from pgscope.analyze.account import Account, account_of
from pgscope.analyze.capacity import CapacityAnalysis, RateCell
from pgscope.analyze.catalogue import Advice, Rule
from pgscope.analyze.facts import kind
from pgscope.analyze.facts.account import (
    PATH_NODE_SHARE,
    PATH_SAMPLES,
    PATH_SHARE,
    PATH_STATEMENT_SHARE,
)
from pgscope.analyze.facts.cell import OBSERVED, TPS
from pgscope.analyze.facts.host import CLIENT_CPU, SERVER_CPU, SERVER_CPUS_BUSY
from pgscope.analyze.facts.scaling import BEST_CLIENTS, GROWTH_SHOWN
from pgscope.analyze.facts.variants import LOSS
from pgscope.analyze.facts.waits import AAS_PER_CLIENT, IDLE_IN_TRANSACTION, SHARE
from pgscope.analyze.facts.work import TOP_SHARE
from pgscope.analyze.model import (
    Diagnosis,
    Fact,
    FactSheet,
    Finding,
    KneeJudgement,
    NotAssessed,
    WindowJudgement,
)
from pgscope.words import n_clients

__all__ = [
    "Diagnosis",
    "Finding",
    "NotAssessed",
    "Rule",
    "diagnose",
    "evaluate",
    "judge_knee",
    "judge_window",
    "load_rules",
    "with_capacity",
]

LEVELS = ("low", "medium", "high")
# A variant this much below the fastest counts as slower: above the step-to-step spread of
# tps we measure on shared 2-core hosts (a few %), below every effect the field cases show.
LOSS_THRESHOLD = 0.10
OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    ">": operator.gt,
    "<=": operator.le,
    "<": operator.lt,
}


def load_rules(path: Path | None = None) -> tuple[list[Rule], Advice]:
    """The causes facts trigger, and the advice per name their titles take, from the
    catalogue (causes.toml, checked as it loads: analyze/catalogue.py); `path`: a catalogue
    of one's own in its place."""
    found = catalogue.bundled() if path is None else catalogue.parse(path.read_text())
    return list(found.rules), dict(found.advice)


def _resolve(sheet: FactSheet, name: str) -> Fact | None:
    """A fact by name; `prefix.*` picks the largest fact under that prefix."""
    if name.endswith(".*"):
        prefix = name[:-1]
        matches = [f for n, f in sheet.facts.items() if n.startswith(prefix)]
        return max(matches, key=lambda f: f.value) if matches else None
    return sheet.get(name)


def _holds(sheet: FactSheet, name: str, op: str, threshold: Any) -> Fact | None:
    """The fact `name`, when the run measured it and `op threshold` holds on it."""
    fact = _resolve(sheet, name)
    return fact if fact is not None and OPS[op](fact.value, float(threshold)) else None


_FACT_IN_TEXT = catalogue.FACT_IN_TEXT


def _advice(entries: Sequence[str | dict[str, Any]], sheet: FactSheet) -> list[str]:
    """The rule's advice as this run reads it: what the run already does left out, the
    facts it names given their measured values."""

    def measured(match: re.Match[str]) -> str:
        fact = _resolve(sheet, match.group(1))
        return f"{fact.shown()} here" if fact is not None else "not measured here"

    kept = []
    for entry in entries:
        text = entry if isinstance(entry, str) else entry["text"]
        conditions = [] if isinstance(entry, str) else entry.get("unless", [])
        if any(
            _holds(sheet, name, op, threshold) is not None for name, op, threshold in conditions
        ):
            continue
        kept.append(_FACT_IN_TEXT.sub(measured, text))
    return kept


def _needs(missing: list[str]) -> list[str]:
    """What the run would need to measure the missing facts (each kind says)."""
    needs = []
    for name in missing:
        declared = kind(name)
        source = declared.needs if declared is not None else "a measurement this run lacks"
        if source not in needs:
            needs.append(source)
    return needs


def evaluate(
    rule: Rule, sheet: FactSheet, advice: Advice, absence: Absence | None = None
) -> Finding | NotAssessed | None:
    """A finding (confidence at least medium), a rule that could not be assessed (and why,
    where `absence` knows), or None."""
    scored = [_resolve(sheet, name) for name in rule.score]
    missing = [name for name, fact in zip(rule.score, scored, strict=True) if fact is None]
    missing += [cond[0] for cond in rule.require if _resolve(sheet, cond[0]) is None]
    if missing and (
        len(missing) >= len(rule.score) or any(cond[0] in missing for cond in rule.require)
    ):
        needs = _needs(missing)
        why = [r for need in needs for r in (absence or Absence()).why(need)]
        return NotAssessed(rule.id, sheet.variant, missing, needs, list(dict.fromkeys(why)))
    for name, op, threshold, *_ in rule.require:
        fact = _resolve(sheet, name)
        assert fact is not None
        if not OPS[op](fact.value, float(threshold)):
            return None
    for name, op, threshold, *_ in rule.unless:
        if _holds(sheet, name, op, threshold) is not None:
            return None  # measured, and it rules the finding out
    score = sum(f.value for f in scored if f is not None)
    if score < rule.medium:
        return None
    level = 2 if score >= rule.high else 1
    weakened = []
    for name, op, threshold, reason in rule.weaken:
        if (fact := _holds(sheet, name, op, threshold)) is not None:
            weakened.append(f"{reason} ({fact.label}: {fact.shown()})")
            level -= 1
    title = rule.title
    recommendations = _advice(rule.recommendations, sheet)
    if rule.name_from:
        source = _resolve(sheet, rule.name_from)
        suffix = ""
        if source is not None:
            suffix = (
                source.name.rsplit(".", 1)[-1] if rule.name_from.endswith(".*") else source.shown()
            )
        title = title.replace("{name}", suffix or "?")
        recommendations = _advice(advice.get(suffix, []), sheet) + recommendations
    elif rule.quote_from:
        quoted = _resolve(sheet, rule.quote_from)
        title = title.replace("{name}", quoted.label if quoted is not None else "?")
        if quoted is not None:
            cause = quoted.name.rsplit(".", 1)[-1]
            recommendations = _advice(advice.get(cause, []), sheet) + recommendations
    evidence = [fact for name in rule.evidence if (fact := _resolve(sheet, name)) is not None]
    observed = rule.refute_observed is not None and sheet.value(OBSERVED.name)
    return Finding(
        rule.id,
        title,
        LEVELS[max(0, level)],
        score,
        sheet.variant,
        sheet.clients,
        evidence,
        rule.refute_observed if observed and rule.refute_observed else rule.refute,
        recommendations,
        weakened,
    )


def diagnose(
    sheets: list[FactSheet],
    rules: list[Rule] | None = None,
    advice: Advice | None = None,
    absence: Absence | None = None,
    accounts: list[Account] | None = None,
) -> Diagnosis:
    if rules is None or advice is None:
        rules, advice = load_rules()
    findings: list[Finding] = []
    not_assessed: list[NotAssessed] = []
    # Each variant's peak cell: where a bottleneck shows most (sheets of other cells are
    # evidence for the report, not separate findings).
    variant_sheets = [s for s in sheets if s.variant is not None and s.peak]
    run_sheets = [s for s in sheets if s.variant is None]
    found: dict[str, list[Finding]] = {}
    for rule in rules:
        targets = run_sheets if rule.scope == "run" else variant_sheets
        outcomes = [evaluate(rule, sheet, advice, absence) for sheet in targets]
        found[rule.id] = [o for o in outcomes if isinstance(o, Finding)]
        not_assessed += [o for o in outcomes if isinstance(o, NotAssessed)]
    _drop_superseded(rules, found)
    from_paths = _path_findings(accounts or [], variant_sheets, found)
    # A rule firing, or a path's mechanism, on every variant is the background of a
    # comparison, not what sets one variant apart (a heavy CPU-bound statement on each CPU
    # count of the cpus recipe ranked above the CPU saturation it is the detail of).
    # (A run's finding is of the one run sheet: specific, its breadth 1, as made.)
    for rule in rules:
        if rule.scope != "run":
            _mark_breadth(found[rule.id], len(variant_sheets))
        findings += found[rule.id]
    _mark_breadth(from_paths, len(variant_sheets))
    findings += from_paths
    _bounded_by_session_time(findings, variant_sheets)
    slower_variants = _clearly_slower(sheets, variant_sheets)
    symptoms = {r.id for r in rules if r.symptom}
    lost = {r.id for r in rules if r.lost_work}

    def rank(f: Finding) -> tuple[bool, bool, bool, bool, int, bool, float, float, float]:
        slower = f.variant in slower_variants
        level = LEVELS.index(f.confidence)
        # Then the one explaining more of the active time (its path's share, where the
        # account measured it), not the larger score of a rule.
        share = f.share if f.share is not None else min(1.0, f.score)
        cause = f.id not in symptoms
        # A plain path (where the time goes, no waste to cut) after every cause and symptom,
        # however specific to one variant: the cpus recipe's index lookup, busy on fewer CPU
        # counts than the CPU saturation it details, ranked above it.
        return (
            not f.plain,
            f.specific,
            slower,
            cause,
            level,
            f.id in lost,
            -f.breadth,
            share,
            f.score,
        )

    findings.sort(key=rank, reverse=True)
    reported = [f for f in findings if f.confidence != "low"] or findings[:3]
    weak = not any(f.confidence != "low" and not f.plain for f in findings)
    verdict = _verdict(reported, variant_sheets, weak, symptoms)
    if not reported or weak or reported[0].id in symptoms or reported[0].plain:
        verdict += _where_time_goes(variant_sheets)
    verdict += _unsure(accounts or [], variant_sheets)
    return Diagnosis(verdict, reported, not_assessed, weak)


def _clearly_slower(sheets: list[FactSheet], variant_sheets: list[FactSheet]) -> set[str]:
    """The variants clearly slower than the fastest: at their peak cell 10% or more below a
    variant that is never 10% or more below them at another client count. One repeat of each
    cell cannot say more, and a loss that changes sides with the client count is the host's
    noise, not a slower variant (partition-locks, live: the control 19% below the generic
    plan at 8 clients, 29% above it at 4; its "throughput falls" ranked above the lock
    manager's 36% of active time)."""
    tps = {
        (s.variant, s.clients): t
        for s in sheets
        if s.variant is not None and (t := s.value(TPS.name))
    }
    slower: set[str] = set()
    for peak in variant_sheets:
        if peak.variant is None or (peak.value(LOSS.name) or 0.0) < LOSS_THRESHOLD:
            continue
        mine = tps.get((peak.variant, peak.clients))
        ahead = [
            other
            for (other, clients), theirs in tps.items()
            if mine is not None
            and clients == peak.clients
            and mine <= (1 - LOSS_THRESHOLD) * theirs
        ]
        behind_elsewhere = any(
            theirs <= (1 - LOSS_THRESHOLD) * own
            for (variant, clients), own in tps.items()
            if variant == peak.variant
            for other in ahead
            if (theirs := tps.get((other, clients))) is not None
        )
        if not behind_elsewhere:
            slower.add(peak.variant)
    return slower


def _mark_breadth(findings: list[Finding], sheets: int) -> None:
    """Each finding's breadth, the share of the `sheets` (one per variant) whose variant shows
    its id, and whether it is specific: not shown by every one of several."""
    variants_with: dict[str, set[str | None]] = {}
    for finding in findings:
        variants_with.setdefault(finding.id, set()).add(finding.variant)
    for finding in findings:
        shown = len(variants_with[finding.id])
        finding.specific = not (sheets > 1 and shown == sheets)
        finding.breadth = shown / max(1, sheets)


# What a finding about active time can win back is its share of active time times the share
# of the sessions' time they are active: a cause of 60% of the active time of sessions active
# a quarter of their time wins back 15% at most. High confidence needs this much of it,
# medium this much.
WON_BACK = {"high": 0.25, "medium": 0.1}
# Unless the CPUs the server runs on are this busy (the client-bound rule's line too): then a
# session's time between statements is largely spent queued for a CPU, not in its client's
# own work, and a closed loop's throughput is the CPUs over the CPU each transaction takes.
# What a cause can win back is then bounded by the server's part of that CPU (the rest is the
# load generator's), not by how long sessions are active: on 2 saturated cores the partition
# lock case's sessions were active a third of their time or less, its lock manager 45-59% of
# active time, and the finding fell to medium or low, under the CPU saturation it causes.
CPU_SATURATED = 0.85


def _bounded_by_session_time(findings: list[Finding], sheets: list[FactSheet]) -> None:
    """No finding about active time claims more confidence than the share of the sessions'
    time (or, on saturated CPUs, of the CPU) it could win back allows."""
    bound = {s.variant: _winnable(s) for s in sheets}
    for f in findings:
        fraction, what = bound.get(f.variant, (None, ""))
        if f.share is None or fraction is None or fraction >= 1:
            continue
        won = f.share * fraction
        level = LEVELS.index(f.confidence)
        allowed = 2 if won >= WON_BACK["high"] else 1 if won >= WON_BACK["medium"] else 0
        if allowed < level:
            f.confidence = LEVELS[allowed]
            f.weakened_by.append(
                f"it holds {f.share:.0%} of the active time, but {what.format(fraction)}: "
                f"removing it wins back at most {won:.0%} of it"
            )


def _winnable(sheet: FactSheet) -> tuple[float | None, str]:
    """The share of a transaction's time that cutting the server's active time can shorten,
    and what it is, in words ("{}" for the share)."""
    busy = sheet.value(SERVER_CPUS_BUSY.name)
    server = sheet.value(SERVER_CPU.name)
    if busy is not None and busy >= CPU_SATURATED and server:
        part = server / (server + (sheet.value(CLIENT_CPU.name) or 0.0))
        return part, "the CPUs are saturated and the server uses {:.0%} of the CPU"
    return sheet.value(AAS_PER_CLIENT.name), "the sessions are active {:.0%} of their time"


def _account_of(accounts: list[Account], sheet: FactSheet) -> Account | None:
    return account_of(accounts, sheet.variant, sheet.clients, sheet.rate)


def _path_findings(
    accounts: list[Account], sheets: list[FactSheet], found: dict[str, list[Finding]]
) -> list[Finding]:
    """Each variant's heavy paths as findings. A path a rule's mechanism interprets joins that
    rule's finding on the variant (its title then names the path, its share is the path's);
    the others stand as findings of their own. A mechanism's finding drops the findings it
    supersedes on its variant (a foreign key's check scan says more than 'sequential scans')."""
    out: list[Finding] = []
    for sheet in sheets:
        account = _account_of(accounts, sheet)
        if account is None or account.samples < paths.MIN_SAMPLES:
            continue
        for group in _grouped(paths.readings(account, limit=8)):
            reading = next((r for r in group if r.mechanism is not None), group[0])
            share = sum(r.path.share for r in group)
            mechanism = reading.mechanism
            rule_id = mechanism.rule if mechanism is not None else None
            mine = [f for f in found.get(rule_id or "", []) if f.variant == sheet.variant]
            named = paths.describe(reading.path, share) + (
                f" (and {len(group) - 1} more path(s) like it)" if len(group) > 1 else ""
            )
            names = [n.name for n in reading.path.nodes[1:]]
            if mine:
                merged = mine[0]
                merged.title = f"{merged.title}: {named}"
                merged.share = share
                merged.named, merged.path = named, names
                merged.evidence = [*_path_evidence(reading, share), *merged.evidence]
                merged.recommendations = [*reading.recommendations, *merged.recommendations]
                if LEVELS.index(reading.confidence) > LEVELS.index(merged.confidence):
                    merged.confidence = reading.confidence
                continue
            plain = mechanism is None and not _wasteful(reading.path.deepest)
            out.append(
                Finding(
                    mechanism.id if mechanism is not None else "heavy-path",
                    f"{reading.title}: {named}",
                    reading.confidence,
                    share,
                    sheet.variant,
                    sheet.clients,
                    _path_evidence(reading, share),
                    reading.refute,
                    reading.recommendations,
                    share=share,
                    path=names,
                    named=named,
                    plain=plain,
                )
            )
            if mechanism is not None:
                _drop(found, mechanism.supersedes, sheet.variant, share)
        # A rule's finding no path joined: the account says how much time its mechanism's
        # nodes hold (perhaps none), where the account has such nodes at all.
        for rule_id, ids in _linked().items():
            for finding in found.get(rule_id, []):
                if finding.variant == sheet.variant and finding.share is None:
                    finding.share = paths.matched_share(account, ids)
    return out


def _drop(
    found: dict[str, list[Finding]],
    targets: list[str],
    variant: str | None,
    share: float | None = None,
) -> None:
    """Drop, on `variant`, the findings `targets` name: a rule's id, or `id:name` for its
    finding about that name only (`lwlock-hotspot:SubtransSLRU`, the tranche in its title).

    With `share` (a path's), only those that explain no more of the active time than it does:
    a deeper reading of part of a finding's time does not replace the finding. Sessions
    queued for a hot row, a quarter of that wait on holders idle between two statements of a
    loaded host, are still a hot row's queue."""
    for target in targets:
        other, _, name = target.partition(":")
        found[other] = [
            f
            for f in found.get(other, [])
            if f.variant != variant
            or (name and f": {name}:" not in f"{f.title}:")
            or (share is not None and f.share is not None and f.share > share)
        ]


def _linked() -> dict[str, set[str]]:
    """Per rule, the mechanisms that interpret paths as its cause."""
    out: dict[str, set[str]] = {}
    for m in paths.mechanisms()[0]:
        if m.rule is not None:
            out.setdefault(m.rule, set()).add(m.id)
    return out


def _grouped(readings: list[paths.Reading]) -> list[list[paths.Reading]]:
    """Readings of one cause together: the same mechanism on the same table (or, for a
    statement's waits, the same mechanism), heaviest first. A plan node no mechanism
    interprets, in a statement where another node's mechanism names the cause (the hash join
    above a join's whole-table scan, the count above a whole-table scan), is that cause's
    time too."""
    groups: dict[tuple[str, object], list[paths.Reading]] = {}
    # The first plan cause of each plan: a statement's own, or one it ran nested (in a
    # trigger, a function).
    named_plan: dict[object, tuple[str, object]] = {}
    for r in readings:
        if r.mechanism is not None and r.interpreted.kind == "plan":
            named_plan.setdefault(_plan_of(r), _key(r))
    for r in readings:
        key = _key(r)
        # A node of that plan that no mechanism reads as itself (none did, or one read a node
        # above it: the trigger that ran the count above a whole-table scan).
        if r.path.deepest.kind == "plan" and (
            r.mechanism is None or r.interpreted is not r.path.deepest
        ):
            key = named_plan.get(_plan_of(r), key)
        groups.setdefault(key, []).append(r)
    return [sorted(g, key=lambda r: -r.path.share) for g in groups.values()]


def _key(r: paths.Reading) -> tuple[str, object]:
    if r.mechanism is not None and r.mechanism.group is not None:
        return r.mechanism.group, _statement_of(r)
    mechanism = r.mechanism.id if r.mechanism is not None else r.path.deepest.name
    return mechanism, r.interpreted.detail.get("table") or r.interpreted.detail.get("relation")


def _plan_of(r: paths.Reading) -> object:
    nested = r.path.nearest("nested")
    return _statement_of(r), nested.name if nested is not None else None


def _statement_of(r: paths.Reading) -> object:
    statement = r.path.statement
    return statement.detail.get("query_id") if statement is not None else None


def _wasteful(node: object) -> bool:
    """Whether a node no mechanism interprets still shows work to cut: rows thrown away, a
    node run many times, a slow call, many rows; a lookup of a few rows is not."""
    detail = getattr(node, "detail", {})
    kind = getattr(node, "kind", "")
    if kind in ("trigger", "function", "nested", "lock", "holder"):
        return True
    if kind == "part":
        # Planning and JIT compilation are time around the statement's work, not the work:
        # all of it is there to cut.
        return detail.get("part") in ("planning", "jit")
    if kind != "plan":
        return kind == "statement" and detail.get("event") not in (None, "CPU")
    numbers = {k: v for k, v in detail.items() if isinstance(v, int | float)}
    return (
        numbers.get("removed_share", 0) >= 0.5
        or numbers.get("loops_per_execution", 0) >= 10
        or numbers.get("ms_per_execution", 0) >= 1.0
        or numbers.get("rows_per_execution", 0) >= 1000
        or numbers.get("temp_kb_per_execution", 0) > 0
    )


def _path_evidence(reading: paths.Reading, share: float) -> list[Fact]:
    path = reading.path
    statement = path.statement
    facts = [
        Fact(PATH_SHARE.name, share, PATH_SHARE.unit, "activity", PATH_SHARE.label),
        Fact(
            PATH_SAMPLES.name,
            float(path.deepest.samples),
            PATH_SAMPLES.unit,
            "activity",
            PATH_SAMPLES.label,
        ),
    ]
    if statement is not None:
        facts.append(
            Fact(
                PATH_STATEMENT_SHARE.name,
                statement.share,
                PATH_STATEMENT_SHARE.unit,
                "activity",
                f"{PATH_STATEMENT_SHARE.label}: {statement.name}",
            )
        )
        if statement.share > 0 and path.deepest is not statement:
            facts.append(
                Fact(
                    PATH_NODE_SHARE.name,
                    min(1.0, path.deepest.share / statement.share),
                    PATH_NODE_SHARE.unit,
                    path.deepest.source,
                    f"{path.deepest.name}: its share of the statement's time",
                )
            )
    return facts


def _unsure(accounts: list[Account], sheets: list[FactSheet]) -> str:
    """What the account could not say: too few samples, no path worth naming, branches it
    could not follow (and what would open them)."""
    peaks = [a for s in sheets if (a := _account_of(accounts, s)) is not None]
    if not peaks:
        return ""
    said = []
    thin = [a for a in peaks if a.samples < paths.MIN_SAMPLES]
    if thin:
        said.append(
            f"the account of active time rests on {thin[0].samples} samples (fewer than "
            f"{paths.MIN_SAMPLES}): measure longer steps or sample faster before trusting it"
        )
    elif all(not paths.heavy_paths(a) for a in peaks):
        said.append(
            "no single statement takes as much as "
            f"{paths.MIN_SHARE:.0%} of active time: the time is spread thin"
        )
    closed = peaks[0].closed
    if closed:
        said.append(
            "branches not followed: "
            + "; ".join(f"{c.branch} ({c.why}; {c.opens})" for c in closed)
        )
    return (" " + ". ".join(s[0].upper() + s[1:] for s in said) + ".") if said else ""


def judge_window(
    sheet: FactSheet,
    step_id: int,
    whole: Diagnosis,
    rules: list[Rule] | None = None,
    advice: Advice | None = None,
) -> WindowJudgement:
    """One window of an observation (its worst) judged by the rules that judge a cell, and
    said against the whole observation's findings: the same leading cause, another one, or
    none. Ranked as a cell's findings are: causes before symptoms, then confidence, score."""
    if rules is None or advice is None:
        rules, advice = load_rules()
    variant_rules = [r for r in rules if r.scope != "run"]
    found = {
        r.id: [o] if isinstance(o := evaluate(r, sheet, advice), Finding) else []
        for r in variant_rules
    }
    _drop_superseded(variant_rules, found)
    symptoms = {r.id for r in rules if r.symptom}
    findings = sorted(
        (f for mine in found.values() for f in mine if f.confidence != "low"),
        key=lambda f: (f.id not in symptoms, LEVELS.index(f.confidence), f.score),
        reverse=True,
    )
    where = f"window {step_id}"
    if not findings:
        note = f"{where}, the worst: no rule finds its evidence in it"
    elif whole.findings and not whole.weak and findings[0].title == whole.findings[0].title:
        note = f"{where}, the worst, shows the same leading cause: {findings[0].title}"
    elif any(f.title == findings[0].title for f in whole.findings if f.confidence != "low"):
        note = (
            f"{where}, the worst, is led by {findings[0].title}, which the whole observation "
            f"shows too, not first"
        )
    else:
        note = (
            f"{where}, the worst, shows a cause the whole observation does not: {findings[0].title}"
        )
    if findings:
        numbers = "; ".join(f"{f.label}: {f.shown()}" for f in findings[0].evidence[:2])
        note += f" ({numbers})" if numbers else ""
    return WindowJudgement(step_id, findings, note)


def judge_knee(
    sheet: FactSheet,
    cell: RateCell,
    beyond: bool,
    accounts: list[Account],
    absence: Absence | None = None,
) -> KneeJudgement:
    """An open-loop knee's cell judged as a variant's peak is: by every rule and by the
    heavy paths of its account, ranked the same way. `beyond`: the server did not keep up
    with the cell's rate (the lowest such), else it kept up with every rate and this is the
    highest."""
    judged = diagnose([dataclasses.replace(sheet, peak=True)], absence=absence, accounts=accounts)
    findings = judged.findings
    for finding in findings:
        finding.rate = cell.rate
    where = (
        f"{cell.variant}, {cell.rate:,.0f} tps offered by {n_clients(cell.clients)}, of which "
        f"it completed {cell.achieved_share:.1%}"
        if cell.achieved_share is not None
        else f"{cell.variant}, {cell.rate:,.0f} tps offered by {n_clients(cell.clients)}"
    )
    at = "At the knee" if beyond else "At the highest rate offered (the server kept up with all)"
    if not findings or judged.weak:
        note = f"{at} ({where}) no rule finds its evidence with confidence"
        if findings:
            note += f"; the strongest signal: {findings[0].title}"
        return KneeJudgement(cell.variant, cell.clients, cell.rate, findings, note + ".")
    top = findings[0]
    numbers = (
        "" if top.named else ": " + "; ".join(f"{f.label}: {f.shown()}" for f in top.evidence[:2])
    )
    note = f"{at} ({where}): {top.title}{numbers}."
    return KneeJudgement(cell.variant, cell.clients, cell.rate, findings, note)


def with_capacity(
    verdict: str, capacity: CapacityAnalysis | None, knees: list[KneeJudgement]
) -> str:
    """The verdict of a run with offered rates: the capacity at each objective first (the
    question the objective asked), then what limits the server at each variant's knee, then
    the sweep's verdict."""
    if capacity is None:
        return verdict
    several = len(capacity.variants) > 1
    first = []
    for variant in capacity.variants:
        for estimate in variant.capacities:
            who = f"{variant.variant}: " if several else ""
            first.append(f"Capacity ({who}{n_clients(variant.clients)}): {estimate.said}.")
    knee = [k.note for k in knees]
    return " ".join([*first, *knee, verdict])


def _drop_superseded(rules: list[Rule], found: dict[str, list[Finding]]) -> None:
    """Drop the findings a more specific finding on the same variant supersedes (the
    LockManager hot spot, where the lock-manager finding says why the tranche waits)."""
    by_id = {rule.id: rule for rule in rules}
    for rule in rules:
        for target in rule.supersedes:
            other_id, _, name = target.partition(":")
            other = by_id.get(other_id)
            if other is None:
                continue
            title = other.title.replace("{name}", name) if name else None
            variants = {f.variant for f in found[rule.id]}
            found[other_id] = [
                f
                for f in found[other_id]
                if f.variant not in variants or (title is not None and f.title != title)
            ]


def _where_time_goes(sheets: list[FactSheet]) -> str:
    """When no finding says why: the facts that show where the time went, for the reader to
    judge (the top statement, the most common wait), at the slowest variant's peak."""
    if not sheets:
        return ""
    sheet = min(sheets, key=lambda s: s.value(TPS.name) or 0.0)
    shown = []
    top = sheet.get(TOP_SHARE.name)
    if top is not None:
        statement = top.label.split(": its share")[0]
        shown.append(f"{statement} took {top.shown()} of the execution time")
    waits = [f for n, f in sheet.facts.items() if SHARE.matches(n)]
    if waits:
        wait = max(waits, key=lambda f: f.value)
        shown.append(
            f"the most common wait was {wait.name.removeprefix(SHARE.prefix)} "
            f"({wait.shown()} of active time)"
        )
    if not shown:
        return ""
    return " No rule explains why; where the time went: " + "; ".join(shown) + "."


def without_steps(command: str, where_time_went: list[tuple[str, float]]) -> str:
    """The verdict of a session that ran no load (`sample`, `trace`, `profile`): the rules
    judge steps, so it has nothing to judge, which is not the same as a run whose steps all
    failed; where the sampled active time went is what it has to say."""
    verdict = (
        f"No load steps to diagnose: `pgscope {command}` records what the server did, and the "
        f"rules judge the steps of `pgscope run` (or the windows of `pgscope observe`)."
    )
    if where_time_went:
        shares = ", ".join(f"{label} {share:.0%}" for label, share in where_time_went)
        verdict += f" Where active time went: {shares} (wait-event sampling)."
    return verdict


def _verdict(
    findings: list[Finding], sheets: list[FactSheet], weak: bool, symptoms: set[str]
) -> str:
    if not findings and not any(s.value(TPS.name) for s in sheets):
        return (
            "Nothing to diagnose: no step measured any throughput (see the run's status and "
            "the steps' errors)."
        )
    if not findings:
        return (
            "No bottleneck stands out: no rule found its evidence. The run may be too short "
            "or too quiet, or the collectors that would see the cause were off."
        )
    top = findings[0]
    where = f" ({top.variant}, {n_clients(top.clients)})" if top.variant else ""
    # A path's finding names its numbers in its title; a rule's shows its first evidence.
    numbers = "; ".join(f"{f.label}: {f.shown()}" for f in top.evidence[:2])
    sheet = next(
        (
            s
            for s in sheets
            if s.variant == (top.variant or (sheets[0].variant if sheets else None))
        ),
        None,
    )
    opening = ""
    if sheet is not None:
        best, tps = sheet.value(BEST_CLIENTS.name), sheet.value(TPS.name)
        shown = sheet.value(GROWTH_SHOWN.name)
        if best is not None and sheet.clients and best < sheet.clients:
            opening = (
                f"Throughput stops growing at {n_clients(best)}. "
                if shown
                else f"Throughput is highest at {n_clients(best)}, but the intervals of the "
                f"client counts up to it overlap: more repeats would tell where it stops "
                f"growing. "
                if shown is not None
                else f"Throughput is highest at {n_clients(best)} (one repeat per client "
                f"count: no interval to tell where it stops growing). "
            )
        elif tps is not None and sheet.clients and sheet.value(OBSERVED.name):
            # An observation: the server's commits at the concurrency its sessions had.
            sessions = f"{sheet.clients} session{'' if sheet.clients == 1 else 's'}"
            opening = f"{tps:,.0f} commits/s at {sessions}. "
        elif tps is not None and sheet.clients:
            opening = f"{tps:,.0f} tps at {n_clients(sheet.clients)}. "
    idle = sheet.value(IDLE_IN_TRANSACTION.name) if sheet is not None else None
    active = sheet.value(AAS_PER_CLIENT.name) if sheet is not None else None
    if idle is not None and idle >= 0.5:
        # Most of the sessions' time is the client's: every finding about the active time is
        # about the smaller part, and the verdict says so first.
        busy = f", and active {min(1.0, active):.0%}" if active is not None else ""
        opening = (
            f"Client sessions are idle inside their transactions {idle:.0%} of the time, "
            f"waiting for the client's next statement (round trips, or the application's own "
            f"work){busy}: what follows is about the active part. {opening}"
        )
    if weak:
        return (
            f'{opening}The evidence is weak: the strongest signal is "{top.title}"{where} '
            f"({numbers}), below the confidence the rules ask for; measure longer steps, "
            f"more repeats, or with more collectors before acting on it."
        )
    text = (
        f"{opening}{top.title}{where}." if top.named else f"{opening}{top.title}{where}: {numbers}."
    )
    # A symptom beside a cause is what the cause does (a full scan keeps the CPU busy).
    runner_up = next((f for f in findings[1:] if f.id != top.id and f.id not in symptoms), None)
    if (
        runner_up is not None
        and runner_up.confidence == top.confidence
        and runner_up.specific == top.specific
        and runner_up.score >= 0.8 * top.score
    ):
        text += (
            f" A second cause is as strong: {runner_up.title}"
            f"{f' ({runner_up.variant})' if runner_up.variant else ''}."
        )
    return text
