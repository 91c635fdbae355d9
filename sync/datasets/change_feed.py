"""The change feed of a publication: its change set kept in the dataset's ``X_changes`` table
and announced as ``dataset.changed`` outbox events.

Each publication of revision v of run R writes one row per added entity (``after`` = its
values), per removed entity (``before`` = its values) and per changed column of a changed
entity (``before`` and ``after`` of that column). A dataset's first publication is a baseline:
no rows, and one event that says so with the counts.

The events: the change set's entries split into pages of at most ``max_changes_per_event``, one
event per page with the id ``event_id_for(R, "dataset.changed.<page>", v)`` (so a repeat writes
nothing and a receiver deduplicates by it), each carrying :meth:`ChangeSet.as_dict` restricted to
its page's entries, with the totals as ``counts`` and ``revision``, ``page`` and ``pages``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from config.datasets import Dataset
from sync import outbox
from sync.casts import to_json
from sync.datasets.changes import ADDED, CHANGED, REMOVED, ChangeSet, pages
from sync.datasets.rows import insert_rows
from sync.datasets.tables import DatasetTables

EVENT_TYPE = "dataset.changed"


def counts_of(changes: ChangeSet) -> dict[str, Any]:
    """What a publication row keeps of its change set."""
    return {
        **changes.counts(),
        "baseline": changes.baseline,
        "previous_run_id": changes.previous_run_id,
    }


def change_rows(changes: ChangeSet, *, revision: int, now: datetime) -> list[dict[str, Any]]:
    """The ``X_changes`` rows of a change set (none for a baseline)."""
    if changes.baseline:
        return []
    common = {
        "run_id": changes.run_id,
        "revision": revision,
        "previous_run_id": changes.previous_run_id,
        "created_at": now,
    }
    rows: list[dict[str, Any]] = []
    for entry in changes.added + changes.removed:
        values = {name: to_json(value) for name, value in entry.values.items()}
        rows.append(
            {
                **common,
                "entity_key": entry.entity_key,
                "kind": entry.kind,
                "column_name": None,
                "before": values if entry.kind == REMOVED else None,
                "after": values if entry.kind == ADDED else None,
            }
        )
    for entry in changes.changed:
        for column in entry.columns:
            rows.append(
                {
                    **common,
                    "entity_key": entry.entity_key,
                    "kind": CHANGED,
                    "column_name": column.column,
                    "before": to_json(column.before),
                    "after": to_json(column.after),
                }
            )
    return rows


def announce(
    session: Session,
    tables: DatasetTables,
    dataset: Dataset,
    changes: ChangeSet,
    *,
    revision: int,
    now: datetime,
) -> list[str]:
    """Keep the change set in ``X_changes`` and write its ``dataset.changed`` events, in the
    caller's transaction; the event ids."""
    insert_rows(session, tables.changes, change_rows(changes, revision=revision, now=now))
    split = pages(changes, dataset.max_changes_per_event)
    counts = changes.counts()
    events = []
    for number, entries in enumerate(split, start=1):
        page = ChangeSet(
            dataset=changes.dataset,
            run_id=changes.run_id,
            previous_run_id=changes.previous_run_id,
            added=tuple(e for e in entries if e.kind == ADDED),
            removed=tuple(e for e in entries if e.kind == REMOVED),
            changed=tuple(e for e in entries if e.kind == CHANGED),
            baseline=changes.baseline,
        )
        payload = {
            **page.as_dict(),
            "counts": counts,
            "revision": revision,
            "page": number,
            "pages": len(split),
        }
        events.append(
            outbox.write_event(
                session,
                event_type=EVENT_TYPE,
                event_key=f"{EVENT_TYPE}.{number}",
                run_id=changes.run_id,
                dataset=dataset.name,
                revision=revision,
                payload=payload,
                destinations=[d.key for d in dataset.destinations],
                now=now,
            )
        )
    return events
