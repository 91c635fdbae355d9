"""One run in detail (``scrapesync status RUN``): its state and who decided it, every reason with
its figures, its partitions, the diagnosis of a rejection (fields and their selectors, sample
records before and after, Cloud's problematic URLs, the next command), the operator's decisions
and the events that announced it."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import select

from sync.bootstrap import Services
from sync.models import OperatorDecision, OutboxEvent, PartitionVerdict, Run
from sync.operations import triage
from sync.operations.reasons import reason_detail
from sync.runs import publication, verdict_rows


def run_detail(services: Services, run_id: str) -> dict[str, Any] | None:
    """The run as the detail view shows it, or None for an unknown run."""
    with services.uow.begin() as session:
        run = session.get(Run, run_id)
        if run is None:
            return None
        partitions = session.execute(
            select(PartitionVerdict)
            .where(PartitionVerdict.run_id == run_id)
            .order_by(PartitionVerdict.partition)
        ).scalars()
        decisions = session.execute(
            select(OperatorDecision)
            .where(OperatorDecision.run_id == run_id)
            .order_by(OperatorDecision.decided_at, OperatorDecision.id)
        ).scalars()
        events = session.execute(
            select(OutboxEvent).where(OutboxEvent.run_id == run_id).order_by(OutboxEvent.id)
        ).scalars()
        return {
            "run_id": run.run_id,
            "dataset": run.dataset,
            "window": run.collection_window,
            "state": run.state,
            "revision": run.revision,
            "published": publication.published_run_id(session, run.dataset) == run_id,
            **verdict_rows.decided_by(run),
            "evaluation_failures": run.evaluation_failures,
            "evaluated_at": run.evaluated_at.isoformat(timespec="seconds")
            if run.evaluated_at
            else None,
            "reasons": [reason_detail(r) for r in run.reasons or []],
            "partitions": [
                {
                    "partition": p.partition,
                    "state": p.state,
                    "records": p.records,
                    "reasons": [reason_detail(r) for r in p.reasons or []],
                }
                for p in partitions
            ],
            "diagnosis": run.diagnosis,
            "decisions": [
                {
                    "action": d.action,
                    "decided_by": d.decided_by,
                    "reason": d.reason,
                    "decided_at": d.decided_at.isoformat(timespec="seconds"),
                }
                for d in decisions
            ],
            "events": [
                {"event_id": e.event_id, "type": e.event_type, "state": e.state} for e in events
            ],
        }


def _standing(values: dict[str, Any]) -> str:
    """Whether readers get the run: the dataset's published run, or one no longer published
    (as the status table tells them apart, :func:`sync.operations.triage.standing`)."""
    if values["published"]:
        return " (the dataset's published run)"
    shown = triage.standing(values["state"], current=False)
    return f" ({shown})" if shown != values["state"] else ""


def detail_text(values: dict[str, Any]) -> str:
    """The detail view as the plain text ``scrapesync status RUN`` prints."""
    lines = [
        f"run {values['run_id']} ({values['dataset']}, window {values['window']})",
        f"state: {values['state']}{_standing(values)}, revision {values['revision']}",
    ]
    if values["decided_by"] == "operator":
        lines.append(
            f"decided by: operator ({values['decision']} at {values['decided_at']}): "
            f"{values['reason'] or 'no reason given'}"
        )
    else:
        lines.append("decided by: rules")
    if values["evaluation_failures"]:
        lines.append(f"failed evaluations in a row: {values['evaluation_failures']}")
    for reason in values["reasons"]:
        figures = f" [{reason['figures']}]" if reason["figures"] else ""
        lines.append(f"  - {reason['text']}{figures}")
    for p in values["partitions"]:
        lines.append(f"partition {p['partition']}: {p['state']}, {p['records']} records")
        for reason in p["reasons"]:
            figures = f" [{reason['figures']}]" if reason["figures"] else ""
            lines.append(f"  - {reason['text']}{figures}")
    lines.extend(diagnosis_lines(values.get("diagnosis")))
    for d in values["decisions"]:
        lines.append(
            f"decision: {d['action']} by {d['decided_by']} at {d['decided_at']}: {d['reason']}"
        )
    if values["events"]:
        lines.append(
            "events: " + ", ".join(f"{e['type']} ({e['state']})" for e in values["events"])
        )
    return "\n".join(lines)


def diagnosis_lines(diagnosis: dict[str, Any] | None) -> list[str]:
    """A rejection's diagnosis in words: per failure, the fields and their selectors, sample
    records before and after, problematic URLs; then the commands to run next."""
    if not diagnosis:
        return []
    lines = ["diagnosis:"]
    for failure in diagnosis.get("failures", []):
        where = f" in {failure['partition']}" if failure.get("partition") else ""
        lines.append(f"  {failure['code']}{where}:")
        for field in failure.get("fields", []):
            selector = field.get("selector")
            behind = (
                f"selector {selector['id']!r} "
                f"({selector.get('type')}, {selector.get('selector')!r})"
                if selector
                else "no selector found in the sitemap"
            )
            lines.append(f"    field {field['field']!r}: {behind}")
        samples = failure.get("samples") or {}
        for when in ("before", "after"):
            for record in samples.get(when, []):
                lines.append(f"    {when}: {json.dumps(record, ensure_ascii=False)}")
        for url in failure.get("problematic_urls", []):
            lines.append(f"    problematic URL: {url}")
    for command in diagnosis.get("next", []):
        lines.append(f"  next: {command}")
    return lines
