"""What changed for readers of a dataset between two of its published runs (``scrapesync diff``).

The answer for a run and the run published just before it is the change set that publication
stored in ``X_changes``: exactly what its ``dataset.changed`` events announced. For any other
pair (runs further apart, a later run against an earlier one, a run against one it was
republished after) it is computed with :func:`sync.datasets.changes.compare` from the two runs'
published views, read from ``X_history``: the stretches open at each run's collection-window
start, which are the rows ``X`` held once that run was published (rows kept from a quarantined
partition included).
For adjacent runs both give the same entities, kinds and values. Only published runs can be
compared: the history holds nothing else (and none from before the typed tables were kept), and
it is never deleted by retention.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Table, and_, or_, select
from sqlalchemy.orm import Session

from config.columns import Column, watch_by_column
from config.datasets import Dataset, DatasetsFileError
from sync import outbox
from sync.bootstrap import Services
from sync.casts import to_json
from sync.datasets.changes import (
    ADDED,
    CHANGED,
    REMOVED,
    ChangeSet,
    ColumnChange,
    EntityChange,
    compare,
)
from sync.datasets.columns import columns_of
from sync.datasets.history import window_start
from sync.datasets.tables import DatasetTables, tables_for
from sync.models import Publication, Run
from sync.states import EventType


class DiffError(Exception):
    """Two runs of a dataset cannot be compared; the message names the dataset, runs and why."""


@dataclass(frozen=True)
class Diff:
    """A change set between two published runs, and where it came from: ``stored`` (the
    publication's own change feed, at ``revision``) or computed from the history."""

    changes: ChangeSet
    stored: bool
    revision: int | None = None


def diff(
    services: Services, dataset: str, *, from_run: str | None = None, to_run: str | None = None
) -> Diff:
    """The changes from ``from_run`` to ``to_run`` (default: the last two published runs)."""
    try:
        configured = services.datasets.get(dataset)
    except DatasetsFileError as exc:
        raise DiffError(str(exc)) from None
    with services.uow.begin() as session:
        return diff_in(
            session,
            configured,
            schema=services.settings.data_schema,
            from_run=from_run,
            to_run=to_run,
        )


def diff_in(
    session: Session,
    dataset: Dataset,
    *,
    schema: str,
    from_run: str | None = None,
    to_run: str | None = None,
) -> Diff:
    """:func:`diff` inside the caller's transaction (one snapshot of the tables)."""
    publications = list(
        session.execute(
            select(Publication).where(Publication.dataset == dataset.name).order_by(Publication.id)
        ).scalars()
    )
    latest: dict[str, Publication] = {p.run_id: p for p in publications}
    if not publications:
        raise DiffError(f"dataset {dataset.name!r} has no published run yet")
    if to_run is not None:
        target = _published(session, dataset.name, to_run, latest)
    else:
        target = publications[-1]
    if from_run is None:
        # the run published last before this one, other than this one (a republication of
        # the same run is not the run before it)
        earlier = [p for p in publications if p.id < target.id and p.run_id != target.run_id]
        if not earlier:
            return _baseline(session, dataset, target, schema)
        from_run = earlier[-1].run_id
    else:
        _published(session, dataset.name, from_run, latest)
    tables = tables_of(session, dataset, schema)
    recorded = target.changes or {}
    if (
        target.run_id != from_run
        and not recorded.get("baseline")
        and recorded.get("previous_run_id") == from_run
    ):
        revision = _revision_of(session, target, recorded)
        if revision is not None:
            return Diff(
                stored_changes(session, tables, target.run_id, revision, from_run),
                stored=True,
                revision=revision,
            )
    for run_id in (from_run, target.run_id):
        if latest[run_id].changes is None:  # no counts: published before the history was kept
            raise DiffError(
                f"run {run_id!r} of dataset {dataset.name!r} was published before its typed "
                "tables and history were kept: only runs published since can be compared"
            )
    return Diff(computed_changes(session, dataset, tables, from_run, target.run_id), stored=False)


def tables_of(session: Session, dataset: Dataset, schema: str) -> DatasetTables:
    """The dataset's tables with the columns they hold."""
    return tables_for(
        dataset.name,
        columns_of(session, dataset.name, dataset.columns),
        dialect=session.get_bind().dialect.name,
        schema=schema,
    )


def _published(
    session: Session, dataset: str, run_id: str, latest: Mapping[str, Publication]
) -> Publication:
    """The run's latest publication, or an error saying why the run cannot be compared."""
    run = session.get(Run, run_id)
    if run is None or run.dataset != dataset:
        raise DiffError(f"dataset {dataset!r} has no run {run_id!r}")
    if run_id not in latest:
        raise DiffError(
            f"run {run_id!r} of dataset {dataset!r} was never published (it is {run.state}): "
            "only published runs can be compared"
        )
    return latest[run_id]


def _baseline(session: Session, dataset: Dataset, target: Publication, schema: str) -> Diff:
    """A dataset's first publication, as the change it was: every entity of its view added."""
    if target.changes is None:
        raise DiffError(
            f"run {target.run_id!r} of dataset {dataset.name!r} was published before its typed "
            "tables and history were kept: only runs published since can be compared"
        )
    tables = tables_of(session, dataset, schema)
    run = session.get(Run, target.run_id)
    assert run is not None  # a publication's run
    view = view_at(session, tables.history, tables.columns, window_start(run))
    changes = compare(dataset.name, target.run_id, None, {}, view, {})
    return Diff(changes, stored=False, revision=_revision_of(session, target, target.changes))


def _revision_of(
    session: Session, publication: Publication, recorded: Mapping[str, Any]
) -> int | None:
    """The run revision a publication published: kept with its counts, or found from the id of
    its ``dataset.published`` event (derived from run, type and revision)."""
    if isinstance(recorded.get("revision"), int):
        return int(recorded["revision"])
    run = session.get(Run, publication.run_id)
    top = run.revision if run is not None else 0
    for revision in range(top, -1, -1):
        if outbox.event_id_for(publication.run_id, EventType.DATASET_PUBLISHED, revision) == (
            publication.event_id
        ):
            return revision
    return None


def stored_changes(
    session: Session, tables: DatasetTables, run_id: str, revision: int, previous_run_id: str
) -> ChangeSet:
    """The change set one publication kept in ``X_changes`` (one row per added or removed
    entity, one per changed column)."""
    t = tables.changes
    rows = session.execute(
        select(t.c.entity_key, t.c.kind, t.c.column_name, t.c.before, t.c.after).where(
            t.c.run_id == run_id,
            t.c.revision == revision,
            t.c.previous_run_id == previous_run_id,
        )
    ).all()
    added: dict[str, EntityChange] = {}
    removed: dict[str, EntityChange] = {}
    changed: dict[str, list[ColumnChange]] = {}
    for key, kind, column, before, after in rows:
        if kind == ADDED:
            added[key] = EntityChange(key, ADDED, values=dict(after or {}))
        elif kind == REMOVED:
            removed[key] = EntityChange(key, REMOVED, values=dict(before or {}))
        elif kind == CHANGED and column is not None:
            changed.setdefault(key, []).append(ColumnChange(column, before, after))
    return ChangeSet(
        dataset=tables.dataset,
        run_id=run_id,
        previous_run_id=previous_run_id,
        added=tuple(added[k] for k in sorted(added)),
        removed=tuple(removed[k] for k in sorted(removed)),
        changed=tuple(
            EntityChange(k, CHANGED, columns=tuple(sorted(changed[k], key=lambda c: c.column)))
            for k in sorted(changed)
        ),
    )


def view_at(
    session: Session, history: Table, columns: tuple[Column, ...], moment: datetime
) -> dict[str, dict[str, Any]]:
    """What the dataset's table held at ``moment``: each entity's stretch open then."""
    names = [c.name for c in columns]
    rows = session.execute(
        select(history.c.entity_key, *(history.c[n] for n in names)).where(
            and_(
                history.c.valid_from <= moment,
                or_(history.c.valid_to.is_(None), history.c.valid_to > moment),
            )
        )
    ).all()
    return {row[0]: dict(zip(names, row[1:], strict=True)) for row in rows}


def computed_changes(
    session: Session, dataset: Dataset, tables: DatasetTables, from_run: str, to_run: str
) -> ChangeSet:
    """The change set from one published run's view to another's, compared as the change feed
    compares (the dataset's watched columns and tolerances)."""
    views = []
    for run_id in (from_run, to_run):
        run = session.get(Run, run_id)
        assert run is not None  # both were checked to be published runs of the dataset
        views.append(view_at(session, tables.history, tables.columns, window_start(run)))
    return compare(
        dataset.name, to_run, from_run, views[0], views[1], watch_by_column(dataset.watch)
    )


SHOWN_VALUES = 4  # columns shown for an added or removed entity in the readable report
LINE_WIDTH = 120


def _shown(value: Any) -> str:
    value = to_json(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False) if not value or " " in value else value
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _cut(line: str) -> str:
    return line if len(line) <= LINE_WIDTH else line[: LINE_WIDTH - 1] + "…"


def _entry(entry: EntityChange) -> str:
    if entry.kind == CHANGED:
        moves = ", ".join(
            f"{c.column} {_shown(c.before)} → {_shown(c.after)}" for c in entry.columns
        )
        return _cut(f"  ~ {entry.entity_key}: {moves}")
    sign = "+" if entry.kind == ADDED else "-"
    values = list(entry.values.items())
    text = ", ".join(f"{name}={_shown(value)}" for name, value in values[:SHOWN_VALUES])
    more = ", …" if len(values) > SHOWN_VALUES else ""
    return _cut(f"  {sign} {entry.entity_key}" + (f": {text}{more}" if text else ""))


def report(result: Diff, *, limit: int) -> str:
    """The change set as ``scrapesync diff`` prints it: where it comes from, the counts, then
    up to ``limit`` entries of each kind."""
    changes = result.changes
    if changes.previous_run_id is None:
        source = "the dataset's first publication: every entity added"
    elif result.stored:
        source = f"from the change feed of its publication, revision {result.revision}"
    else:
        source = "computed from the history"
    counts = changes.counts()
    lines = [
        f"{changes.dataset}: {changes.previous_run_id or 'nothing'} → {changes.run_id} ({source})",
        f"{counts[ADDED]} added, {counts[REMOVED]} removed, {counts[CHANGED]} changed",
    ]
    for kind, entries in (
        (ADDED, changes.added),
        (REMOVED, changes.removed),
        (CHANGED, changes.changed),
    ):
        if not entries:
            continue
        lines.append(f"{kind}:")
        lines.extend(_entry(e) for e in entries[:limit])
        if len(entries) > limit:
            lines.append(f"  … and {len(entries) - limit} more")
    return "\n".join(lines)


# --- the change feed, page by page (GET /api/changes) -------------------------------------------

PAGE_LIMIT = 10_000  # entries one page may hold at most


@dataclass(frozen=True)
class ChangePage:
    """One page of one publication's changes; ``next`` is the cursor of the page after it."""

    dataset: str
    run_id: str
    revision: int | None
    previous_run_id: str | None
    baseline: bool
    counts: Mapping[str, int]
    entries: tuple[dict[str, Any], ...]
    next: str | None

    def as_dict(self) -> dict[str, Any]:
        """The page as ``GET /api/changes`` answers it."""
        return {
            "dataset": self.dataset,
            "run_id": self.run_id,
            "revision": self.revision,
            "previous_run_id": self.previous_run_id,
            "baseline": self.baseline,
            "counts": dict(self.counts),
            "changes": list(self.entries),
            "next": self.next,
        }


def change_page(
    session: Session,
    dataset: Dataset,
    *,
    schema: str,
    run_id: str | None = None,
    after: str | None = None,
    limit: int = 1000,
) -> ChangePage:
    """A page of the changes that ``run_id``'s latest publication (default: the dataset's last
    publication) made, after the cursor ``after``: one entry per added or removed entity and
    per changed column, in a stable order. A baseline's entries are its entities, added."""
    limit = max(1, min(limit, PAGE_LIMIT))
    query = select(Publication).where(Publication.dataset == dataset.name)
    if run_id is not None:
        query = query.where(Publication.run_id == run_id)
    target = session.execute(query.order_by(Publication.id.desc()).limit(1)).scalar_one_or_none()
    if target is None:
        what = f"run {run_id!r}" if run_id is not None else "any run"
        raise DiffError(f"dataset {dataset.name!r} has no publication of {what}")
    recorded = dict(target.changes or {})
    revision = _revision_of(session, target, recorded)
    tables = tables_of(session, dataset, schema)
    baseline = bool(recorded.get("baseline"))
    if baseline:
        entries, cursor = _baseline_entries(session, tables, target.run_id, after, limit)
    else:
        entries, cursor = _stored_entries(session, tables, target.run_id, revision, after, limit)
    return ChangePage(
        dataset=dataset.name,
        run_id=target.run_id,
        revision=revision,
        previous_run_id=recorded.get("previous_run_id"),
        baseline=baseline,
        counts={k: int(recorded.get(k, 0)) for k in (ADDED, REMOVED, CHANGED)},
        entries=tuple(entries),
        next=cursor,
    )


def _stored_entries(
    session: Session,
    tables: DatasetTables,
    run_id: str,
    revision: int | None,
    after: str | None,
    limit: int,
) -> tuple[list[dict[str, Any]], str | None]:
    """The publication's ``X_changes`` rows after row id ``after``."""
    t = tables.changes
    query = select(t.c.id, t.c.entity_key, t.c.kind, t.c.column_name, t.c.before, t.c.after)
    query = query.where(t.c.run_id == run_id)
    if revision is not None:
        query = query.where(t.c.revision == revision)
    if after:
        if not after.isdigit():
            raise DiffError(f"the cursor {after!r} is not one this feed gave")
        query = query.where(t.c.id > int(after))
    rows = session.execute(query.order_by(t.c.id).limit(limit + 1)).all()
    entries = [
        {"entity_key": key, "kind": kind, "column": column, "before": before, "after": value}
        for _, key, kind, column, before, value in rows[:limit]
    ]
    return entries, (str(rows[limit - 1][0]) if len(rows) > limit else None)


def _baseline_entries(
    session: Session, tables: DatasetTables, run_id: str, after: str | None, limit: int
) -> tuple[list[dict[str, Any]], str | None]:
    """A baseline's entities: the history's stretches the run opened, by entity key."""
    h = tables.history
    names = [c.name for c in tables.columns]
    query = select(h.c.entity_key, *(h.c[n] for n in names)).where(h.c.run_id == run_id)
    if after:
        query = query.where(h.c.entity_key > after)
    rows = session.execute(query.order_by(h.c.entity_key).limit(limit + 1)).all()
    entries = [
        {
            "entity_key": row[0],
            "kind": ADDED,
            "column": None,
            "before": None,
            "after": {n: to_json(v) for n, v in zip(names, row[1:], strict=True)},
        }
        for row in rows[:limit]
    ]
    return entries, (str(rows[limit - 1][0]) if len(rows) > limit else None)
