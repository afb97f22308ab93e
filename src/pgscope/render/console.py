"""The run's summary on the console (and in summary.txt): the verdict first, then the
scalability table, the model, variants, waits and collectors. Renders the analysis only."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pgscope.analyze.model import RunAnalysis, Step
from pgscope.render.account import print_account
from pgscope.render.capacity import print_capacity
from pgscope.render.observation import print_observation
from pgscope.render.variants import print_variants
from pgscope.render.waits import print_waits
from pgscope.words import human_bytes


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def step_problem(step: Step) -> str:
    """What happened to a step that is not ok, in words (the console and the report)."""
    if step.status == "errors" and step.workload_error:
        quoted = f'"{step.workload_error}"'
        return f"errors: the workload's SQL failed: {quoted} (pgbench aborted its clients)"
    return f"{step.status}: {step.error or ''}"


def print_collectors(console: Console, result: RunAnalysis) -> None:
    """Which collectors ran, which could not and why, and where they have gaps."""
    collectors = result.environment.collectors
    if not collectors:
        return
    ran = [c["name"] for c in collectors if c["available"] and c["status"] != "failed"]
    console.print(f"\ncollectors: {', '.join(ran) or 'none ran'}", highlight=False)
    for c in collectors:
        if not c["available"]:
            console.print(
                f"[yellow]collector {c['name']} unavailable:[/yellow] {escape(c['reason'] or '')}",
                highlight=False,
            )
        elif c["status"] == "failed":
            console.print(
                f"[red]collector {c['name']} failed:[/red] {escape(c['error'] or '')}",
                highlight=False,
            )
    for gap in result.environment.gaps:
        seconds = (gap["end_us"] - gap["start_us"]) / 1e6
        console.print(
            f"[yellow]gap[/yellow] in {gap['name']}: {seconds:.1f} s, {gap['reason']}",
            highlight=False,
        )


def print_findings(console: Console, result: RunAnalysis) -> None:
    """The verdict first: it is the answer; the rest is the evidence."""
    diagnosis = result.diagnosis
    if diagnosis is None:
        return
    colour = "yellow" if diagnosis.weak else "bold"
    console.print(f"\n[{colour}]verdict:[/{colour}] {escape(diagnosis.verdict)}", highlight=False)
    for i, finding in enumerate(diagnosis.findings[:5], start=1):
        where = f" [{finding.variant}]" if finding.variant else ""
        # A path's finding says its numbers in its title; a rule's shows its first facts.
        facts = (
            ""
            if finding.named
            else ": " + "; ".join(f"{e.label} {e.shown()}" for e in finding.evidence[:2])
        )
        console.print(
            f"  {i}. {finding.title}{where} ({finding.confidence}){facts}",
            highlight=False,
            markup=False,
        )
        if finding.recommendations:
            console.print(f"     try: {finding.recommendations[0]}", highlight=False, markup=False)
    # Rules this run could not judge for a reason it knows, one line per reason (the report
    # lists every rule not assessed).
    unjudged: dict[str, list[str]] = {}
    for item in diagnosis.not_assessed:
        for reason in item.why:
            if item.id not in unjudged.setdefault(reason, []):
                unjudged[reason].append(item.id)
    for reason, rules in unjudged.items():
        console.print(
            f"  not assessed ({', '.join(rules)}): {reason}", highlight=False, markup=False
        )


def print_summary(console: Console, result: RunAnalysis) -> None:
    status = result.status
    colour = {"complete": "green", "partial": "yellow"}.get(status, "red")
    console.print(
        f"[bold]pgscope {result.command} {result.run_id}[/bold]  [{colour}]{status}[/{colour}]"
        + (f" ({result.status_reason})" if result.status_reason else ""),
        highlight=False,
    )
    host = result.environment.host
    server = (result.target.server_version or "server version unknown").split(" on ")[0]
    console.print(server, highlight=False)
    console.print(
        f"host: {host.get('usable_cpus')} usable CPUs ({host.get('cpu_model')}), "
        f"{human_bytes(host.get('memory_bytes') or 0)}; "
        f"target: {result.target.kind}",
        highlight=False,
    )
    print_findings(console, result)
    print_account(console, result)
    if result.observation is not None:
        judged = result.diagnosis.worst_window if result.diagnosis else None
        print_observation(console, result.observation, result.started_us, judged)
    for variant in result.scalability.variants():
        table = Table(title=f"variant {variant}", title_justify="left", show_edge=False)
        for name in ("clients", "repeats", "tps", "95% CI", "p50 ms", "p95 ms", "p99 ms"):
            table.add_column(name, justify="right")
        for cell in (c for c in result.scalability.cells if c.variant == variant):
            ci = (
                f"{cell.tps_ci95[0]:,.0f} – {cell.tps_ci95[1]:,.0f}"
                if cell.tps_ci95
                else "n/a (1 repeat)"
                if cell.repeats == 1
                else "-"
            )
            notes = [
                f"{cell.failed_steps} failed" if cell.failed_steps else "",
                f"{cell.errored_steps} errored" if cell.errored_steps else "",
            ]
            repeats = str(cell.repeats) + (
                f" ({', '.join(n for n in notes if n)})" if any(notes) else ""
            )
            table.add_row(
                str(cell.clients),
                repeats,
                f"{cell.tps_mean:,.0f}" if cell.tps_mean is not None else "-",
                ci,
                _ms(cell.p50_ms),
                _ms(cell.p95_ms),
                _ms(cell.p99_ms),
            )
        console.print()
        console.print(table)
        fit = result.scalability.fits.get(variant)
        if fit is not None:
            console.print(f"[bold]model:[/bold] {escape(fit.describe())}", highlight=False)
            for warning in fit.warnings:
                console.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False)
        elif (
            variant in result.scalability.fit_errors
            and len({c.clients for c in result.scalability.cells if c.variant == variant}) > 1
        ):  # one client count is a comparison recipe, not a scalability sweep
            console.print(
                f"[yellow]no model:[/yellow] {result.scalability.fit_errors[variant]}",
                highlight=False,
            )
    print_capacity(console, result)
    print_variants(console, result)
    if result.xids is not None:
        console.print(f"\n{result.xids.describe()}", highlight=False, markup=False)
        many = result.xids.warning()
        if many:
            console.print(f"[yellow]warning:[/yellow] {escape(many)}", highlight=False)
    if result.waits is not None:
        print_waits(console, result.waits, result.scalability.variants())
    print_collectors(console, result)
    # An observation's idle, mixed and short windows are results (its windows table says
    # which); a window it could not close is not.
    failed = [s for s in result.steps if s.status not in ("ok", "idle", "mixed", "short")]
    for step in failed[:5]:
        console.print(
            f"[{'yellow' if step.status == 'errors' else 'red'}]step {step.step_id} "
            f"({step.variant}, clients={step.clients}): {escape(step_problem(step))}[/]",
            highlight=False,
        )
    if len(failed) > 5:
        console.print(
            f"[red]and {len(failed) - 5} more steps not ok[/] (report.html lists every one)",
            highlight=False,
        )
    console.print(f"\nrun folder: {result.run_dir}", highlight=False)
