"""The change feed of a publication: its change set kept in the dataset's ``X_changes`` table
and announced as ``dataset.changed`` outbox events.

Each publication of revision v of run R writes one row per added entity (``after`` = its
values), per removed entity (``before`` = its values) and per changed column of a changed
entity (``before`` and ``after`` of that column). A dataset's first publication is a baseline:
no rows (its entities are the history's stretches that R opened).

The event: ONE ``dataset.changed`` per publication, whatever its size, with the id
``event_id_for(R, "dataset.changed.1", v)`` (so a repeat writes nothing and a receiver
deduplicates by it). It always carries the ``counts``, ``revision`` and ``changes_path``, where
``GET`` pages through every change (:func:`sync.datasets.diff.change_page`). The changes travel
inline (``inline: true``, :meth:`ChangeSet.as_dict`'s lists) while there are at most
``max_changes_per_event`` entries; a baseline or a larger change set travels as a summary
(``inline: false``, no lists), so a million-entity baseline costs one delivery per destination.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from sqlalchemy.orm import Session

from config.datasets import Dataset
from sync import outbox
from sync.casts import to_json
from sync.datasets.changes import ADDED, CHANGED, REMOVED, ChangeSet
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


def changes_path(dataset: str, run_id: str, revision: int) -> str:
    """Where a publication's changes can be fetched, page by page (``GET /api/changes``)."""
    return "/api/changes?" + urlencode({"dataset": dataset, "run": run_id, "revision": revision})


def event_payload(changes: ChangeSet, *, revision: int, limit: int) -> dict[str, Any]:
    """A publication's ``dataset.changed`` payload: the changes inline while they fit under
    ``limit`` entries, otherwise (and for a baseline) a summary that says where to fetch them."""
    inline = not changes.baseline and len(changes.entries) <= limit
    whole = changes.as_dict()
    if not inline:
        for kind in (ADDED, REMOVED, CHANGED):
            del whole[kind]
    return {
        **whole,
        "counts": changes.counts(),
        "revision": revision,
        "inline": inline,
        "changes_path": changes_path(changes.dataset, changes.run_id, revision),
        "page": 1,
        "pages": 1,
    }


def announce(
    session: Session,
    tables: DatasetTables,
    dataset: Dataset,
    changes: ChangeSet,
    *,
    revision: int,
    now: datetime,
) -> list[str]:
    """Keep the change set in ``X_changes`` and write its one ``dataset.changed`` event, in the
    caller's transaction; the event ids."""
    insert_rows(session, tables.changes, change_rows(changes, revision=revision, now=now))
    payload = event_payload(changes, revision=revision, limit=dataset.max_changes_per_event)
    event = outbox.write_event(
        session,
        event_type=EVENT_TYPE,
        event_key=f"{EVENT_TYPE}.1",
        run_id=changes.run_id,
        dataset=dataset.name,
        revision=revision,
        payload=payload,
        destinations=[d.key for d in dataset.destinations],
        now=now,
    )
    return [event]
