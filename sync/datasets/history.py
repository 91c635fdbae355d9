"""The history of a dataset's values: one row per entity per stretch of unchanged typed values
across published runs, from ``valid_from`` to ``valid_to`` (collection-window starts; NULL while
the stretch is current).

The history is kept in two places (:mod:`sync.datasets.tables`): an entity's open stretch is its
row in the dataset's table (values, ``last_changed_at`` as its start, ``changed_by_run_id`` as
the run that opened it), and only the closed stretches are rows of ``X_closed``. So the rows of
the dataset's table are the open stretches of its history by construction, and a stretch is
written to the history once, when it closes. A publication of run R (window start W) brings the
history of each entity whose row it added, changed or removed in line with that row:

- a stretch R itself opened before (the run is published again) or that a run being withdrawn
  opened is undone first: deleted, and the stretch it closed reopened; a stretch such a run
  closed is reopened. The history then reads as if that publication had never happened;
- then an entity gone from the table has its open stretch closed at W (deleted if it began at
  W or later: no stretch is ever empty); one whose values differ from its open stretch has that
  stretch closed at W and a new one opened from W (or, if the open one began at W or later,
  corrected in place); one with no open stretch gets one from W.

Stretches of entities the publication did not touch are left as they are. The stretches left
open are returned to the caller, which writes them as the entities' rows.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import bindparam, delete, exists, or_, select
from sqlalchemy.orm import Session

from sync.casts import to_json
from sync.datasets.rows import insert_rows, key_matches
from sync.datasets.tables import DatasetTables, stretch_selects
from sync.models import Run


def window_start(run: Run) -> datetime:
    """The instant a run's collection window starts: 00:00 UTC of a daily window's day, Monday
    00:00 UTC of a weekly one, the run's creation for a window of one job."""
    window = run.collection_window
    if window.startswith("job-"):
        return run.created_at.astimezone(UTC)
    if "-W" in window:
        year, week = window.split("-W")
        return datetime.fromisocalendar(int(year), int(week), 1).replace(tzinfo=UTC)
    return datetime.fromisoformat(window).replace(tzinfo=UTC)


@dataclass(frozen=True)
class Row:
    """An entity's row as the dataset's table holds it after the publication."""

    values: Mapping[str, Any]
    partition: str | None
    payload_hash: str


@dataclass(frozen=True)
class Dates:
    """When an entity was first published (its earliest stretch's start), when its values
    last changed (its open stretch's start) and the run that changed them (that opened it)."""

    first_seen_at: datetime
    last_changed_at: datetime
    changed_by_run_id: str


@dataclass
class _Stretch:
    was_open: bool  # read from the dataset's table, not from the closed stretches
    values: dict[str, Any]
    partition: str | None
    run_id: str
    valid_from: datetime
    valid_to: datetime | None
    closed_by: str | None
    payload_hash: str
    deleted: bool = False
    dirty: bool = False


@dataclass
class _Plan:
    # closed stretches to delete (reopened, undone, or to be written again), by their key
    deletes: list[tuple[str, datetime]] = field(default_factory=list)
    # stretches to write as closed (newly closed, or closed ones that changed)
    closes: list[tuple[str, _Stretch]] = field(default_factory=list)


def is_empty(session: Session, tables: DatasetTables) -> bool:
    """Whether the dataset's history has no stretch at all (nothing was ever published)."""
    held = or_(exists().select_from(tables.closed), exists().select_from(tables.current))
    return not session.execute(select(held)).scalar_one()


def same_values(a: Mapping[str, Any], b: Mapping[str, Any], columns: Collection[str]) -> bool:
    """Whether two rows hold the same typed values (as JSON would carry them, so a numeric read
    back from the database equals the one it was written from)."""
    return all(to_json(a.get(c)) == to_json(b.get(c)) for c in columns)


def record(
    session: Session,
    tables: DatasetTables,
    rows: Mapping[str, Row | None],
    *,
    run_id: str,
    start: datetime,
    undo: Collection[str],
) -> dict[str, Dates]:
    """Bring the history of the entities in ``rows`` (entity key -> its row after the
    publication, None when it left the table) in line with them, as the module says; ``undo``
    are the runs whose stretches are undone first. Returns each remaining entity's dates."""
    names = [c.name for c in tables.columns]
    stretches = _read(session, tables, list(rows), names)
    plan = _Plan()
    dates: dict[str, Dates] = {}
    for key, row in rows.items():
        mine = stretches.get(key, [])
        current = _undo(mine, undo)
        opened = _reconcile(current, row, start, run_id, names)
        if row is None:
            continue
        alive = [s.valid_from for s in mine if not s.deleted]
        if opened is not None:
            alive.append(opened)
        if opened is not None or current is None:
            last, by = start, run_id
        else:
            last, by = current.valid_from, current.run_id
        dates[key] = Dates(
            first_seen_at=min(alive, default=start), last_changed_at=last, changed_by_run_id=by
        )
    for key, found in stretches.items():
        for s in found:
            if not s.was_open and (s.deleted or s.dirty):
                plan.deletes.append((key, s.valid_from))
            if not s.deleted and s.valid_to is not None and (s.dirty or s.was_open):
                plan.closes.append((key, s))
    _write(session, tables, plan, names)
    return dates


def _read(
    session: Session, tables: DatasetTables, keys: Sequence[str], names: Sequence[str]
) -> dict[str, list[_Stretch]]:
    """Each entity's stretches: the closed ones, and its row of the dataset's table as the
    open one."""
    found: dict[str, list[_Stretch]] = {}
    closed, open_ = stretch_selects(tables)
    for was_open, query in ((False, closed), (True, open_)):
        for matches in key_matches(session, query.selected_columns.entity_key, keys):
            wanted = query.where(matches)
            for r in session.execute(wanted).mappings():
                found.setdefault(r["entity_key"], []).append(
                    _Stretch(
                        was_open=was_open,
                        values={n: r[n] for n in names},
                        partition=r["partition"],
                        run_id=r["run_id"],
                        valid_from=r["valid_from"],
                        valid_to=r["valid_to"],
                        closed_by=r["closed_by_run_id"],
                        payload_hash=r["payload_hash"],
                    )
                )
    return found


def _reopen(s: _Stretch) -> _Stretch:
    s.valid_to, s.closed_by, s.dirty = None, None, True
    return s


def _undo(mine: list[_Stretch], undo: Collection[str]) -> _Stretch | None:
    """Undo the stretches the ``undo`` runs opened or closed; the open stretch left."""
    current = next((s for s in mine if s.valid_to is None), None)
    if current is None:
        closed = [s for s in mine if s.closed_by in undo and s.valid_to is not None]
        if closed:
            current = _reopen(max(closed, key=lambda s: s.valid_to or s.valid_from))
    while current is not None and current.run_id in undo:
        current.deleted = True
        began = current.valid_from
        before = [s for s in mine if not s.deleted and s.closed_by in undo and s.valid_to == began]
        current = _reopen(before[0]) if before else None
    return current


def _reconcile(
    current: _Stretch | None,
    row: Row | None,
    start: datetime,
    run_id: str,
    names: Sequence[str],
) -> datetime | None:
    """Change the entity's open stretch ``current`` so that it holds ``row``: closed, deleted,
    corrected in place or kept; the start of the stretch to open from ``row``, if one is to
    open (the caller writes it as the entity's row)."""
    if row is None:
        if current is not None:
            if current.valid_from >= start:
                current.deleted = True
            else:
                current.valid_to, current.closed_by, current.dirty = start, run_id, True
        return None
    if current is not None and same_values(current.values, row.values, names):
        return None
    if current is not None and current.valid_from >= start:
        current.values = dict(row.values)
        current.partition, current.payload_hash = row.partition, row.payload_hash
        current.run_id, current.dirty = run_id, True
        return None
    if current is not None:
        current.valid_to, current.closed_by, current.dirty = start, run_id, True
    return start


def _write(session: Session, tables: DatasetTables, plan: _Plan, names: Sequence[str]) -> None:
    """Closed stretches that were reopened, undone or changed are deleted, then the stretches
    that are closed now are written (a changed one again, under its unchanged start)."""
    c = tables.closed
    if plan.deletes:
        session.execute(
            delete(c).where(
                c.c.entity_key == bindparam("_key"),
                c.c.valid_from == bindparam("_from", type_=c.c.valid_from.type),
            ),
            [{"_key": key, "_from": valid_from} for key, valid_from in plan.deletes],
        )
    insert_rows(
        session,
        c,
        [
            {
                "entity_key": key,
                **{n: s.values.get(n) for n in names},
                "partition": s.partition,
                "run_id": s.run_id,
                "valid_from": s.valid_from,
                "valid_to": s.valid_to,
                "closed_by_run_id": s.closed_by,
                "payload_hash": s.payload_hash,
            }
            for key, s in sorted(plan.closes, key=lambda k: (k[0], k[1].valid_from))
        ],
    )
