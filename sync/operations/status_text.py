"""The status overview as the plain text ``scrapesync status`` prints, and its ages in words."""

from __future__ import annotations

from typing import Any


def changes_text(changes: dict[str, Any] | None, since: str | None) -> str:
    """A publication's change counts in words: ``3 added, 2 removed, 4 changed since R``
    (``since``: what they are counted from, see :func:`sync.operations.status._since`)."""
    if changes is None:
        return "change counts not kept"
    if changes["baseline"]:
        return f"first publication, a baseline of {changes['added']} entities"
    counts = f"{changes['added']} added, {changes['removed']} removed, {changes['changed']} changed"
    return f"{counts} since {since}" if since else counts


def duration(seconds: float | None) -> str:
    """An age in seconds as a person reads it: 45 s, 12 min, 3.5 h, 2.0 d."""
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def format_table(values: dict[str, Any]) -> str:
    """The overview as the plain-text report ``scrapesync status`` prints."""
    lines = _runs_table(values["runs"]) + _run_notes(values["runs"])
    if values["publications"] or values.get("baseline_resets"):
        lines.append("")
    for p in values["publications"]:
        state = "published" if p["current"] else "withdrawn"
        said = changes_text(p["changes"], p["since"])
        lines.append(f"{p['dataset']}: {state} {p['run_id']} ({said})")
    for r in values.get("baseline_resets") or []:
        lines.append(
            f"{r['dataset']}: baseline reset by the {r['decided_by']} at {r['decided_at']} "
            f"({r['reason'] or 'no reason given'}); history rules compare with later runs only"
        )
    lines.append("")
    lines += attention_lines(values.get("attention"))
    lines.append(_tasks_line(values["tasks"]))
    lines.append(_outbox_line(values["outbox"]))
    lines.extend(destination_lines(values.get("destinations") or []))
    lines.append(_reconcile_line(values["last_reconcile"]))
    lines.append(_maintenance_line(values["maintenance"]))
    lines.append(_budget_line(values["api_budget"]))
    return "\n".join(lines)


def _runs_table(runs: list[dict[str, Any]]) -> list[str]:
    """One aligned line per run under a header: records, coverage, failed pages, published."""
    header = ("RUN", "STATE", "RECORDS", "EXPECTED", "COVERAGE", "FAILED", "EMPTY", "PUBLISHED")
    rows: list[tuple[str, ...]] = [header]
    for run in runs:
        rows.append(
            (
                run["run_id"],
                run.get("standing", run["state"]),
                str(run["observations"]),
                str(run["expected_records"]),
                coverage_text(run),
                str(run["pages_failed"]),
                str(run["pages_empty"]),
                "yes" if run["published"] else "",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]
    if not runs:
        lines.append("(no runs yet)")
    return lines


def coverage_text(run: dict[str, Any]) -> str:
    """Coverage capped at 100%, with the raw ratio beside it when the run kept more records
    than Cloud counted: ``100% (raw 125%)``."""
    capped, raw = run["coverage_percent"], run.get("coverage_raw_percent")
    if capped is None:
        return "-"
    if raw is not None and raw != capped:
        return f"{capped:g}% (raw {raw:g}%)"
    return f"{capped:g}%"


def attention_lines(attention: dict[str, Any] | None) -> list[str]:
    """Dead, quarantined and ignored tasks, one line each with its reason."""
    if not attention or not attention["tasks"]:
        return []
    counts = ", ".join(f"{n} {state}" for state, n in attention["counts"].items() if n)
    lines = [f"tasks needing attention or set aside ({counts}):"]
    for task in attention["tasks"]:
        run = f" run {task['run_id']}" if task["run_id"] else ""
        lines.append(f"  {task['state']} job {task['job_id']}{run}: {task['reason']}")
    shown = len(attention["tasks"])
    total = sum(attention["counts"].values())
    if total > shown:
        lines.append(f"  ... and {total - shown} more (scrapesync status --json lists them)")
    return lines


def _shown(detail: dict[str, Any]) -> str:
    """A reason's sentence with its figures in brackets."""
    figures = detail.get("figures")
    return f"{detail['text']} [{figures}]" if figures else str(detail["text"])


def _run_notes(runs: list[dict[str, Any]]) -> list[str]:
    """Under each run that has them: its reasons and its partitions that did not simply pass."""
    lines: list[str] = []
    for run in runs:
        notes = [_shown(d) for d in run["reason_details"]]
        notes += [
            f"partition {p['partition']}: {p['state']}"
            + (f" ({'; '.join(_shown(d) for d in p['reason_details'])})" if p["reasons"] else "")
            for p in run["partitions"]
            if p["state"] not in ("passed", "accepted") or p["reasons"]
        ]
        if notes:
            lines.append(f"{run['run_id']}:")
            lines.extend(f"  - {note}" for note in notes)
    return lines


def _tasks_line(tasks: dict[str, Any]) -> str:
    """Sync tasks by state and the oldest lease held."""
    by_state = ", ".join(f"{n} {s}" for s, n in tasks["by_state"].items() if n) or "none"
    return f"tasks: {by_state}; " + (
        "no lease held"
        if tasks["oldest_lease_age_seconds"] is None
        else f"oldest lease {duration(tasks['oldest_lease_age_seconds'])}, "
        f"{tasks['expired_leases']} expired"
    )


def _outbox_line(outbox: dict[str, Any]) -> str:
    """The outbox backlog, its oldest event and the events by state."""
    return (
        f"outbox: {outbox['backlog']} undelivered"
        + (
            f" (oldest {duration(outbox['oldest_undelivered_age_seconds'])})"
            if outbox["backlog"]
            else ""
        )
        + "; "
        + (", ".join(f"{n} {s}" for s, n in sorted(outbox["events"].items())) or "no events")
    )


def _reconcile_line(last: dict[str, Any] | None) -> str:
    """When the last reconcile pass ran and what it found."""
    if last is None:
        return "last reconcile: never"
    line = (
        f"last reconcile: {duration(last['age_seconds'])} ago ({last['state']}, "
        f"{last['listed']} jobs listed, {last['wanted']} syncs wanted)"
    )
    if last.get("complete") is False:
        line += f"; INCOMPLETE: {last.get('error') or 'the listing stopped early'}"
    return line


def _maintenance_line(maintenance: dict[str, Any]) -> str:
    """When the workers' maintenance pass last came round, and whether that is too long ago."""
    if maintenance["age_seconds"] is None:
        return "maintenance: never ran (is a worker running?)"
    line = f"maintenance: last pass {duration(maintenance['age_seconds'])} ago"
    if maintenance["failed_steps"]:
        line += f" (failed steps: {', '.join(maintenance['failed_steps'])})"
    if maintenance["late"]:
        line += "; LATE: no pass for three sweep intervals, is a worker running?"
    return line


def _budget_line(budget: dict[str, Any]) -> str:
    """The Cloud API calls left in this window."""
    remaining = "unknown" if budget["remaining"] is None else str(budget["remaining"])
    return (
        f"API budget: {remaining} of {budget['limit']} calls left in this "
        f"{budget['window_seconds']:.0f} s window"
    )


def destination_lines(destinations: list[dict[str, Any]]) -> list[str]:
    """A line for each destination that is disabled or keeps failing."""
    lines = []
    for d in destinations:
        if d["disabled_at"]:
            lines.append(
                f"destination {d['destination']}: DISABLED since {d['disabled_at']} "
                f"({d['disabled_reason']}); `scrapesync deliveries enable {d['destination']}`"
            )
        else:
            lines.append(
                f"destination {d['destination']}: failing since {d['failing_since']}; "
                f"`scrapesync deliveries list --destination {d['destination']}`"
            )
    return lines
