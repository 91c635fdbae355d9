"""Heartbeats: when a periodic pass (the worker's maintenance pass) last completed.

One row per kind in ``maintenance_runs``, updated in place: a worker that passes every minute
leaves no trail, yet every web process can tell from SQL how long ago the loop last came round.
Two workers racing on the first beat may leave two rows; readers take the latest.

A worker offers a pass every sweep interval and one runs it, so a pass that has not come round for
``LATE_INTERVALS`` intervals means that no worker runs, or that none gets through a pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from sync.bootstrap import Services
from sync.models import MaintenanceRun
from sync.states import PassKind

MAINTENANCE = PassKind.MAINTENANCE
LATE_INTERVALS = 3


@dataclass(frozen=True)
class Beat:
    """When a pass last completed and what it did (its counts and the steps that failed)."""

    finished_at: datetime
    summary: dict[str, Any]

    def age(self, now: datetime) -> float:
        """Seconds since the pass completed."""
        return (now - self.finished_at).total_seconds()

    @property
    def failed(self) -> list[str]:
        """The steps of the pass that raised."""
        return [str(step) for step in self.summary.get("failed", [])]


def beat(
    services: Services, kind: str = MAINTENANCE, summary: dict[str, Any] | None = None
) -> None:
    """Record that a pass of ``kind`` has just completed."""
    now = services.clock()
    values = {"started_at": now, "finished_at": now, "summary": dict(summary or {})}
    with services.uow.begin() as session:
        changed = session.execute(
            update(MaintenanceRun).where(MaintenanceRun.kind == kind).values(**values)
        ).rowcount  # type: ignore[attr-defined]
        if not changed:
            session.add(MaintenanceRun(kind=kind, **values))
        session.commit()


def last(session: Session, kind: str = MAINTENANCE) -> datetime | None:
    """When a pass of ``kind`` last completed, or None if it never has."""
    return session.execute(
        select(func.max(MaintenanceRun.finished_at)).where(MaintenanceRun.kind == kind)
    ).scalar_one()


def latest(session: Session, kind: str = MAINTENANCE) -> Beat | None:
    """The last completed pass of ``kind``, or None if none ever completed."""
    row = session.execute(
        select(MaintenanceRun.finished_at, MaintenanceRun.summary)
        .where(MaintenanceRun.kind == kind, MaintenanceRun.finished_at.is_not(None))
        .order_by(MaintenanceRun.finished_at.desc())
        .limit(1)
    ).first()
    if row is None or row.finished_at is None:
        return None
    return Beat(finished_at=row.finished_at, summary=dict(row.summary or {}))


def late(beat: Beat | None, *, now: datetime, interval: float) -> bool:
    """Whether the pass is late: none has completed for ``LATE_INTERVALS`` sweep intervals."""
    return beat is None or beat.age(now) > LATE_INTERVALS * interval
