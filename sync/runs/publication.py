"""The published pointer: which accepted run of a dataset is the one readers get.

Each dataset has at most one current ``Publication``. An accepted run takes the pointer unless the
published run is a later collection window; a published run that fails a later evaluation gives it
back to the newest other accepted run, or the dataset is announced withdrawn. Each move is written
with the outbox events that announce it, and the dataset's typed table, history and change feed
follow it (:mod:`sync.datasets.materialise`), inside the evaluating transaction.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from config.datasets import Dataset
from sync import outbox
from sync.acceptance import row_states
from sync.datasets import change_feed, materialise, withdrawal
from sync.models import Observation, PartitionVerdict, Publication, Run
from sync.states import EventType, PartitionState, RunState


def current_publication(session: Session, dataset: str) -> Publication | None:
    """The dataset's current publication row, if any run is published."""
    return session.execute(
        select(Publication).where(Publication.dataset == dataset, Publication.is_current)
    ).scalar_one_or_none()


def published_run_id(session: Session, dataset: str) -> str | None:
    """The run the dataset's published pointer names, if any."""
    current = current_publication(session, dataset)
    return current.run_id if current is not None else None


def window_order(window: str) -> tuple[str, int | str]:
    """A collection window's place in time: ``job-N`` by job number, daily and weekly windows
    by their ISO text (which sorts by time within one kind)."""
    if window.startswith("job-") and window[4:].isdigit():
        return ("job", int(window[4:]))
    return ("weekly" if "-W" in window else "daily", window)


def publishes(session: Session, run: Run, current: Publication | None) -> bool:
    """The pointer moves to an accepted run unless the published run is a later collection
    window (a repaired or late old run is accepted, and stays in history); windows of different
    kinds (the datasets file changed) are ordered by when their runs began."""
    if current is None or current.run_id == run.run_id:
        return True
    published = session.get(Run, current.run_id)
    if published is None:
        return True
    mine, theirs = window_order(run.collection_window), window_order(published.collection_window)
    if mine[0] == theirs[0] and mine != theirs:
        return mine > theirs
    return published.created_at <= run.created_at


def publish(
    session: Session,
    dataset: Dataset,
    run: Run,
    *,
    records: int,
    previous: Publication | None,
    now: datetime,
    schema: str,
    replacing: str | None = None,
    fields: Collection[str] | None = None,
    valid_rows: int | None = None,
    pending_ids: str | None = None,
) -> list[str]:
    """Flip the dataset's published pointer to ``run``, bring the dataset's table to it (see
    :mod:`sync.datasets.materialise`) and write the events that say so: ``dataset.published``, then
    the pages of ``dataset.changed``. ``fields``, ``valid_rows`` and ``pending_ids``: what the
    caller knows of the run (see :func:`sync.datasets.materialise.apply_publication`)."""
    if previous is not None:
        session.execute(
            update(Publication)
            .where(Publication.id == previous.id)
            .values(is_current=False, superseded_at=now)
            .execution_options(synchronize_session=False)
        )
    event_id = outbox.event_id_for(run.run_id, EventType.DATASET_PUBLISHED, run.revision)
    row = Publication(
        dataset=dataset.name,
        run_id=run.run_id,
        is_current=True,
        published_at=now,
        event_id=event_id,
    )
    session.add(row)
    session.flush()
    run.state = RunState.PUBLISHED
    run.published_at = now
    partitions = list(
        session.execute(
            select(PartitionVerdict.partition).where(
                PartitionVerdict.run_id == run.run_id,
                PartitionVerdict.state == PartitionState.PASSED,
            )
        ).scalars()
    )
    published = outbox.write_event(
        session,
        event_type=EventType.DATASET_PUBLISHED,
        run_id=run.run_id,
        dataset=dataset.name,
        revision=run.revision,
        payload={
            "dataset": dataset.name,
            "run_id": run.run_id,
            "collection_window": run.collection_window,
            "revision": run.revision,
            "records": records,
            "partitions": sorted(partitions),
            "published_at": now.isoformat(),
            "previous_run_id": previous.run_id if previous is not None else None,
            **({"replacing": replacing} if replacing else {}),
        },
        destinations=[d.key for d in dataset.destinations],
        now=now,
    )
    made = materialise.apply_publication(
        session,
        dataset,
        run,
        schema=schema,
        now=now,
        previous_run_id=previous.run_id if previous is not None else None,
        replacing=replacing,
        fields=fields,
        valid_rows=valid_rows,
        pending_ids=pending_ids,
    )
    row.changes = change_feed.counts_of(made.changes)
    return [published, *made.events]


def withdraw(
    session: Session, dataset: Dataset, run: Run, now: datetime, *, schema: str
) -> list[str]:
    """A published run that fails a later evaluation is no longer published: the pointer goes
    back to the newest other accepted run, or the dataset is announced withdrawn (and its table
    emptied)."""
    current = current_publication(session, dataset.name)
    if current is None or current.run_id != run.run_id:
        return []
    fallback = session.execute(
        select(Run)
        .where(
            Run.dataset == dataset.name,
            Run.run_id != run.run_id,
            Run.state.in_((RunState.ACCEPTED, RunState.PUBLISHED)),
        )
        .order_by(Run.created_at.desc())
        .limit(1)
    ).scalar_one_or_none()
    if fallback is None:
        session.execute(
            update(Publication)
            .where(Publication.id == current.id)
            .values(is_current=False, superseded_at=now)
            .execution_options(synchronize_session=False)
        )
        emptied = withdrawal.apply_withdrawal(session, dataset, run, schema=schema, now=now)
        return [
            outbox.write_event(
                session,
                event_type=EventType.DATASET_WITHDRAWN,
                run_id=run.run_id,
                dataset=dataset.name,
                revision=run.revision,
                payload={"dataset": dataset.name, "run_id": run.run_id, "revision": run.revision},
                destinations=[d.key for d in dataset.destinations],
                now=now,
            ),
            *emptied.events,
        ]
    fallback.revision += 1
    return publish(
        session,
        dataset,
        fallback,
        records=_valid_records(session, fallback.run_id),
        previous=current,
        now=now,
        schema=schema,
        replacing=run.run_id,
    )


def _valid_records(session: Session, run_id: str) -> int:
    return int(
        session.execute(
            select(func.count()).select_from(Observation).where(row_states.valid(session, run_id))
        ).scalar_one()
    )
