"""Records of a run set aside at import whose entity is known, kept per record in the sync's
transaction: their entities keep their last published rows, flagged stale, and are never
reported removed for them (:mod:`sync.datasets.materialise`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from sync.db import insert
from sync.models import SetAsideRecord

BATCH = 1000


def keep(
    session: Session,
    *,
    run_id: str,
    dataset: str,
    job_id: int,
    entities: Sequence[dict[str, Any]],
    now: datetime,
) -> None:
    """Write the run's set-aside records (the latest sync's wins for an entity)."""
    for start in range(0, len(entities), BATCH):
        rows = [
            {
                "run_id": run_id,
                "dataset": dataset,
                "entity_key": e["entity_key"],
                "partition": e["partition"],
                "job_id": job_id,
                "line": e["line"],
                "reason": e["reason"],
                "values": e["values"],
                "recorded_at": now,
            }
            for e in {e["entity_key"]: e for e in entities[start : start + BATCH]}.values()
        ]
        stmt = insert(session, SetAsideRecord).values(rows)
        session.execute(
            stmt.on_conflict_do_update(
                index_elements=["run_id", "entity_key"],
                set_={
                    "partition": stmt.excluded.partition,
                    "job_id": stmt.excluded.job_id,
                    "line": stmt.excluded.line,
                    "reason": stmt.excluded.reason,
                    "values": stmt.excluded["values"],
                    "recorded_at": stmt.excluded.recorded_at,
                },
            )
        )
