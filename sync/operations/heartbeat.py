"""Heartbeats: when a periodic pass (the worker's maintenance pass) last completed.

One row per kind in ``maintenance_runs``, updated in place: a worker that passes every minute
leaves no trail, yet every web process can tell from SQL how long ago the loop last came round.
Two workers racing on the first beat may leave two rows; readers take the latest.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from sync.bootstrap import Services
from sync.models import MaintenanceRun

MAINTENANCE = "maintenance"


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
