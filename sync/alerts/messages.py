"""What alert messages say: plain words for a person, the figures behind them, and the command
that shows more. Pure functions over plain values; no secret is ever given to them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sync.alerts.conditions import Notice

MAX_LISTED = 10  # reasons, tasks or deliveries named in one message; the command shows all


def duration(seconds: float) -> str:
    """A span of time as a person reads it: ``2d 3h``, ``45m``, ``30s``."""
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [
        f"{days}d" if days else "",
        f"{hours}h" if hours else "",
        f"{minutes}m" if minutes else "",
    ]
    text = " ".join(p for p in parts if p)
    return text or f"{secs}s"


def _reason_line(reason: Mapping[str, Any]) -> str:
    line = f"- {reason.get('code')}: {reason.get('message')}"
    figures = [
        f"{name} {reason[name]}"
        for name in ("got", "expected", "baseline")
        if reason.get(name) is not None
    ]
    if figures:
        line += f" ({', '.join(figures)})"
    if reason.get("partition"):
        line += f" [partition {reason['partition']}]"
    return line


def _listed(lines: Sequence[str], total: int) -> list[str]:
    shown = list(lines[:MAX_LISTED])
    if total > len(shown):
        shown.append(f"- ... and {total - len(shown)} more")
    return shown


def run_rejected(
    dataset: str,
    run_id: str,
    *,
    revision: int,
    reasons: Sequence[Mapping[str, Any]],
    partitions: Mapping[str, Mapping[str, Any]],
) -> Notice:
    """A run was rejected: its reasons with their figures, and its quarantined partitions."""
    command = f"scrapesync check {run_id}"
    quarantined = {p: v for p, v in partitions.items() if v.get("state") == "quarantined"}
    lines = [f"scrapesync: run {run_id} of dataset {dataset} was rejected (revision {revision})."]
    lines.append("Reasons:")
    lines.extend(_listed([_reason_line(r) for r in reasons], len(reasons)))
    if quarantined:
        lines.append(
            "Quarantined partitions: "
            + ", ".join(
                f"{p} ({v.get('records', 0)} records)" for p, v in sorted(quarantined.items())
            )
        )
    lines.append(f"It is not published: readers keep the last accepted run. More: {command}")
    return Notice(
        "\n".join(lines),
        command,
        subject=run_id,
        details={
            "run_id": run_id,
            "revision": revision,
            "reasons": [dict(r) for r in reasons],
            "quarantined_partitions": sorted(quarantined),
        },
    )


def run_accepted(dataset: str, run_id: str, *, records: int, what: str) -> Notice:
    """A run was accepted after ``what`` (a rejection, a quarantine, a stale spell)."""
    command = f"scrapesync check {run_id}"
    return Notice(
        f"scrapesync: dataset {dataset} recovered from {what}: run {run_id} was accepted "
        f"({records} records). More: {command}",
        command,
        subject=run_id,
        details={"run_id": run_id, "records": records},
    )


def partitions_quarantined(
    dataset: str, run_id: str, *, partitions: Mapping[str, Mapping[str, Any]]
) -> Notice:
    """An accepted run with partitions held back from publication."""
    command = f"scrapesync check {run_id}"
    quarantined = sorted(p for p, v in partitions.items() if v.get("state") == "quarantined")
    return Notice(
        f"scrapesync: run {run_id} of dataset {dataset} was accepted with "
        f"{len(quarantined)} partition(s) quarantined and not published: "
        f"{', '.join(quarantined[:MAX_LISTED])}"
        f"{' ...' if len(quarantined) > MAX_LISTED else ''}. More: {command} "
        f"(repair one with scrapesync rerun {run_id} --partition NAME)",
        command,
        subject=run_id,
        details={"run_id": run_id, "quarantined_partitions": quarantined},
    )


def tasks_stuck(dataset: str | None, tasks: Sequence[Mapping[str, Any]], total: int) -> Notice:
    """Sync tasks that will not go on by themselves (``dead`` or ``quarantined``)."""
    command = "scrapesync status"
    whom = f"dataset {dataset}" if dataset else "the Cloud account"
    lines = [f"scrapesync: {total} sync task(s) of {whom} cannot go on by themselves:"]
    lines.extend(
        _listed(
            [
                f"- job {t['job_id']} {t['state']}: {t.get('error_class') or 'error'}: "
                f"{(t.get('error') or '')[:200]}"
                for t in tasks
            ],
            total,
        )
    )
    lines.append(
        "Fix the cause (for a 401, the API token), then sync again with scrapesync sync JOB_ID "
        f"--force. More: {command}"
    )
    return Notice(
        "\n".join(lines),
        command,
        details={"tasks": [dict(t) for t in tasks], "total": total},
    )


def tasks_recovered(dataset: str | None) -> Notice:
    """No sync task is stuck any more."""
    whom = f"dataset {dataset}" if dataset else "the Cloud account"
    return Notice(
        f"scrapesync: {whom} recovered: no sync task is dead or quarantined any more. "
        "More: scrapesync status",
        "scrapesync status",
    )


def deliveries_dead(
    dataset: str | None, deliveries: Sequence[Mapping[str, Any]], total: int
) -> Notice:
    """Deliveries given up on (a destination refused them, answered 410 Gone, or kept failing)."""
    command = "scrapesync status"
    whom = f"dataset {dataset}" if dataset else "no dataset"
    lines = [f"scrapesync: {total} delivery(ies) of {whom} are dead (not retried any more):"]
    lines.extend(
        _listed(
            [
                f"- event {d['event_id']} ({d['event_type']}) to {d['destination']}: "
                + (
                    "destination gone (HTTP 410): it is disabled; "
                    if d.get("status") == 410
                    else ""
                )
                + f"{(d.get('error') or '')[:200]}"
                for d in deliveries
            ],
            total,
        )
    )
    lines.append(f"Replay them once the destination is fixed. More: {command}")
    return Notice(
        "\n".join(lines),
        command,
        details={"deliveries": [dict(d) for d in deliveries], "total": total},
    )


def deliveries_recovered(dataset: str | None) -> Notice:
    """No delivery is dead any more (replayed, or let go by retention)."""
    whom = f"dataset {dataset}" if dataset else "no dataset"
    return Notice(
        f"scrapesync: the deliveries of {whom} recovered: none is dead any more. "
        "More: scrapesync status",
        "scrapesync status",
    )


def budget_spent(limit: int, window: float) -> Notice:
    """The account's Cloud API budget is spent for this window."""
    command = "scrapesync status"
    return Notice(
        f"scrapesync: the Cloud API budget is spent (0 of {limit} calls left in this "
        f"{duration(window)} window): syncs and reconciles wait for the window to reset. "
        "Something else may spend the same account's calls. "
        f"More: {command}",
        command,
        details={"limit": limit, "window_seconds": window},
    )


def budget_recovered() -> Notice:
    """Calls are left again."""
    return Notice(
        "scrapesync: the Cloud API budget recovered: calls are left in the window. "
        "More: scrapesync status",
        "scrapesync status",
    )


def stale(
    dataset: str, *, stale_after: float, since: datetime, last_run_id: str | None, now: datetime
) -> Notice:
    """No accepted run for longer than the dataset's ``stale_after``."""
    command = "scrapesync status"
    at = since.isoformat(timespec="seconds")
    last = (
        f"its last accepted run is {last_run_id}, accepted {at}"
        if last_run_id
        else f"no run of it was ever accepted; its first run began {at}"
    )
    return Notice(
        f"scrapesync: dataset {dataset} is stale: no accepted run for "
        f"{duration((now - since).total_seconds())} (stale_after {duration(stale_after)}); "
        f"{last}. Check Cloud's scheduler and the latest runs. More: {command}",
        command,
        subject=last_run_id,
        details={
            "stale_after_seconds": stale_after,
            "since": since.isoformat(),
            "last_accepted_run_id": last_run_id,
        },
    )


def stale_recovered(dataset: str, *, last_run_id: str | None) -> Notice:
    """The dataset has a recent accepted run again (or no longer has a ``stale_after``)."""
    command = "scrapesync status"
    run = f": run {last_run_id} was accepted" if last_run_id else ""
    return Notice(
        f"scrapesync: dataset {dataset} recovered from a stale spell{run}. More: {command}",
        command,
        subject=last_run_id,
    )
