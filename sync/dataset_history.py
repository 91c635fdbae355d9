"""The history of a dataset's values: one row per entity per stretch of unchanged typed values
across published runs, from ``valid_from`` to ``valid_to`` (collection-window starts; NULL while
the stretch is current).

The rule every publication keeps: the rows of the dataset's table are exactly the open stretches
of its history, with the same typed values. A publication of run R (window start W) brings the
history of each entity whose row it added, changed or removed in line with that row:

- a stretch R itself opened before (the run is published again) or that a run being withdrawn
  opened is undone first: deleted, and the stretch it closed reopened; a stretch such a run
  closed is reopened. The history then reads as if that publication had never happened;
- then an entity gone from the table has its open stretch closed at W (deleted if it began at
  W or later: no stretch is ever empty); one whose values differ from its open stretch has that
  stretch closed at W and a new one opened from W (or, if the open one began at W or later,
  corrected in place); one with no open stretch gets one from W.

Stretches of entities the publication did not touch are left as they are.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import bindparam, exists, insert, literal, select, update
from sqlalchemy.orm import Session

from sync.casts import to_json
from sync.dataset_rows import chunks, delete_keys, insert_rows
from sync.dataset_tables import DatasetTables
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
    """When an entity was first published (its earliest stretch's start) and when its values
    last changed (its open stretch's start)."""

    first_seen_at: datetime
    last_changed_at: datetime


@dataclass
class _Stretch:
    id: int
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
    deletes: list[int] = field(default_factory=list)
    updates: list[_Stretch] = field(default_factory=list)
    inserts: list[dict[str, Any]] = field(default_factory=list)


def is_empty(session: Session, tables: DatasetTables) -> bool:
    """Whether the dataset's history has no stretch at all (nothing was ever published)."""
    return not session.execute(select(exists().select_from(tables.history))).scalar_one()


def open_all(session: Session, tables: DatasetTables, *, run_id: str, start: datetime) -> None:
    """Open a stretch from ``start`` for every row of the dataset's table, in one statement (a
    first publication: the history was empty)."""
    names = ["entity_key", *(c.name for c in tables.columns), "partition", "payload_hash"]
    x = tables.current.c
    session.execute(
        insert(tables.history).from_select(
            [*names, "run_id", "valid_from"],
            select(
                *(x[n] for n in names),
                literal(run_id, type_=tables.history.c.run_id.type),
                literal(start, type_=tables.history.c.valid_from.type),
            ).order_by(x.entity_key),  # its indexes lead with the key: each entry goes last
        )
    )


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
        opened = _reconcile(key, current, row, run_id, start, names, plan)
        if row is None:
            continue
        alive = [s.valid_from for s in mine if not s.deleted]
        if opened is not None:
            alive.append(opened)
        last = opened if opened is not None else current.valid_from if current else start
        dates[key] = Dates(first_seen_at=min(alive, default=start), last_changed_at=last)
    for found in stretches.values():
        for s in found:
            if s.deleted:
                plan.deletes.append(s.id)
            elif s.dirty:
                plan.updates.append(s)
    _write(session, tables, plan, names)
    return dates


def _read(
    session: Session, tables: DatasetTables, keys: Sequence[str], names: Sequence[str]
) -> dict[str, list[_Stretch]]:
    h = tables.history.c
    found: dict[str, list[_Stretch]] = {}
    for part in chunks(keys):
        for r in session.execute(select(tables.history).where(h.entity_key.in_(part))).mappings():
            found.setdefault(r["entity_key"], []).append(
                _Stretch(
                    id=r["id"],
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
    key: str,
    current: _Stretch | None,
    row: Row | None,
    run_id: str,
    start: datetime,
    names: Sequence[str],
    plan: _Plan,
) -> datetime | None:
    """Plan the change that makes ``key``'s open stretch hold ``row``; the start of the stretch
    it opens, if it opens one."""
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
    plan.inserts.append(
        {
            "entity_key": key,
            **{n: row.values.get(n) for n in names},
            "partition": row.partition,
            "run_id": run_id,
            "valid_from": start,
            "valid_to": None,
            "closed_by_run_id": None,
            "payload_hash": row.payload_hash,
        }
    )
    return start


def _write(session: Session, tables: DatasetTables, plan: _Plan, names: Sequence[str]) -> None:
    """Deletes, then stretches that end, then those that are open (so no entity ever has two
    open stretches between statements), then new stretches."""
    h = tables.history
    delete_keys(session, h, "id", sorted(plan.deletes))
    statement = (
        update(h)
        .where(h.c.id == bindparam("_id"))
        .values(
            {
                **{n: bindparam(f"_v_{n}", type_=h.c[n].type) for n in names},
                "partition": bindparam("_partition"),
                "run_id": bindparam("_run_id"),
                "valid_to": bindparam("_valid_to", type_=h.c.valid_to.type),
                "closed_by_run_id": bindparam("_closed_by"),
                "payload_hash": bindparam("_payload_hash"),
            }
        )
    )
    ending = [s for s in plan.updates if s.valid_to is not None]
    opening = [s for s in plan.updates if s.valid_to is None]
    for batch in (ending, opening):
        if batch:
            session.execute(
                statement,
                [
                    {
                        "_id": s.id,
                        **{f"_v_{n}": s.values.get(n) for n in names},
                        "_partition": s.partition,
                        "_run_id": s.run_id,
                        "_valid_to": s.valid_to,
                        "_closed_by": s.closed_by,
                        "_payload_hash": s.payload_hash,
                    }
                    for s in batch
                ],
            )
    insert_rows(session, h, plan.inserts)
