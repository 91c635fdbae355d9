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

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from sqlalchemy.orm import Session

from config.datasets import Dataset
from sync import outbox
from sync.casts import to_json
from sync.datasets.changes import ADDED, CHANGED, REMOVED, ChangeSet, EntityChange
from sync.datasets.rows import insert_rows
from sync.datasets.tables import DatasetTables
from sync.states import EventType

EVENT_TYPE = EventType.DATASET_CHANGED


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
    inline = not changes.baseline and sum(changes.counts().values()) <= limit
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
    return [_write_event(session, dataset, changes, revision, now)]


def _write_event(
    session: Session, dataset: Dataset, changes: ChangeSet, revision: int, now: datetime
) -> str:
    return outbox.write_event(
        session,
        event_type=EVENT_TYPE,
        event_key=f"{EVENT_TYPE}.1",
        run_id=changes.run_id,
        dataset=dataset.name,
        revision=revision,
        payload=event_payload(changes, revision=revision, limit=dataset.max_changes_per_event),
        destinations=[d.key for d in dataset.destinations],
        now=now,
    )


@dataclass
class Feed:
    """A publication's change set, taken a batch of entities at a time: each batch's rows go to
    ``X_changes`` at once, and only the counts, plus the entries while they still fit inline,
    stay in memory, so a publication of any size holds one batch."""

    session: Session
    tables: DatasetTables
    dataset: Dataset
    run_id: str
    previous_run_id: str | None
    revision: int
    now: datetime
    baseline: bool
    counts: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys((ADDED, REMOVED, CHANGED), 0)
    )
    kept: list[EntityChange] | None = field(default_factory=list)

    def add(self, changes: ChangeSet) -> None:
        """Take one batch's change set: store its rows, count it, keep its entries if they fit."""
        insert_rows(
            self.session,
            self.tables.changes,
            change_rows(changes, revision=self.revision, now=self.now),
        )
        for kind, n in changes.counts().items():
            self.counts[kind] += n
        if self.kept is not None and not self.baseline:
            self.kept.extend(changes.entries)
            if len(self.kept) > self.dataset.max_changes_per_event:
                self.kept = None  # a summary, then: the entries stay in X_changes only

    def add_written(
        self, added: int, changed: int, entries: Callable[[], Sequence[EntityChange]]
    ) -> None:
        """Take what set-based statements wrote to ``X_changes``: count it, and keep its
        entries (``entries`` reads them) while they fit inline."""
        self.counts[ADDED] += added
        self.counts[CHANGED] += changed
        if self.kept is None or self.baseline:
            return
        if len(self.kept) + added + changed > self.dataset.max_changes_per_event:
            self.kept = None
            return
        self.kept.extend(entries())

    def change_set(self) -> ChangeSet:
        """The whole change set: its counts, and its entries in order while they fit inline."""
        kept = sorted(self.kept or [], key=lambda e: e.entity_key)
        return ChangeSet(
            dataset=self.dataset.name,
            run_id=self.run_id,
            previous_run_id=self.previous_run_id,
            added=tuple(e for e in kept if e.kind == ADDED),
            removed=tuple(e for e in kept if e.kind == REMOVED),
            changed=tuple(e for e in kept if e.kind == CHANGED),
            baseline=self.baseline,
            totals=dict(self.counts),
        )

    def announce(self) -> list[str]:
        """Write the publication's one ``dataset.changed`` event; its id."""
        return [
            _write_event(self.session, self.dataset, self.change_set(), self.revision, self.now)
        ]
