"""Withdrawing a dataset's published run with no other run to fall back on: its table is
emptied, the run's own stretches undone, and every entity reported removed (a fallback to
another run is a publication of that run: :mod:`sync.datasets.materialise`)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from config.datasets import Dataset
from sync.datasets import change_feed
from sync.datasets import history as dataset_history
from sync.datasets import schema as dataset_schema
from sync.datasets.changes import compare
from sync.datasets.materialise import Materialised
from sync.models import Run


def apply_withdrawal(
    session: Session, dataset: Dataset, run: Run, *, schema: str, now: datetime
) -> Materialised:
    """Empty the dataset's table when its published ``run`` is withdrawn with no other run to
    fall back on: the run's own stretches are undone and every other open one ends at its
    window; every entity is reported removed."""
    tables = dataset_schema.tables_in(session, dataset.name, schema)
    names = [c.name for c in tables.columns]
    current = tables.current
    before = {
        r["entity_key"]: {n: r[n] for n in names}
        for r in session.execute(select(current)).mappings()
    }
    changes = compare(dataset.name, run.run_id, run.run_id, before, {}, {})
    dataset_history.record(
        session,
        tables,
        dict.fromkeys(before),
        run_id=run.run_id,
        start=dataset_history.window_start(run),
        undo={run.run_id},
    )
    session.execute(current.delete())
    events = change_feed.announce(session, tables, dataset, changes, revision=run.revision, now=now)
    return Materialised(changes, tuple(events))
