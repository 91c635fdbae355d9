"""The rows a committed import writes beside its observations: the run it collects for (created
once, its data version counted up by each import) and the scraping job as Cloud last described
it. Functions take a session and never commit."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from sync.cloud.jobs import CloudJob
from sync.db import insert
from sync.models import Run, RunImport, ScrapingJob
from sync.states import RunState


def ensure_run(
    session: Session,
    *,
    run_id: str,
    dataset: str,
    window: str,
    sitemap_id: int | None,
    sitemap_name: str | None,
    now: datetime,
) -> None:
    """Create the run if it does not exist yet; an existing run is left as it is."""
    stmt = insert(session, Run).values(
        run_id=run_id,
        dataset=dataset,
        collection_window=window,
        sitemap_id=sitemap_id,
        sitemap_name=sitemap_name,
        state=RunState.COLLECTING,
        reasons=[],
        created_at=now,
        updated_at=now,
    )
    session.execute(stmt.on_conflict_do_nothing(index_elements=["run_id"]))


def save_scraping_job(
    session: Session,
    job: CloudJob,
    *,
    run_id: str | None,
    recovery_batch: str | None,
    now: datetime,
) -> None:
    """Insert or refresh the scraping job's row from what Cloud said."""
    values: dict[str, Any] = {
        "run_id": run_id,
        "recovery_batch": recovery_batch,
        "sitemap_id": job.sitemap_id,
        "sitemap_name": job.sitemap_name,
        "custom_id": job.custom_id,
        "status": job.status,
        "jobs_scheduled": job.jobs_scheduled,
        "jobs_executed": job.jobs_executed,
        "jobs_failed": job.jobs_failed,
        "jobs_empty": job.jobs_empty,
        "jobs_no_value": job.jobs_no_value,
        "stored_record_count": job.stored_record_count,
        "time_created": (
            datetime.fromtimestamp(job.time_created, UTC) if job.time_created is not None else None
        ),
        "last_seen_at": now,
    }
    stmt = insert(session, ScrapingJob).values(job_id=job.id, first_seen_at=now, **values)
    session.execute(stmt.on_conflict_do_update(index_elements=["job_id"], set_=values))


def count_import(session: Session, run_id: str) -> int:
    """Count up the run's data version for an import committed into it; the new version (what
    an evaluation of this change is named after)."""
    return int(
        session.execute(
            update(Run)
            .where(Run.run_id == run_id)
            .values(data_version=Run.data_version + 1)
            .returning(Run.data_version)
        ).scalar_one()
    )


def record_import(session: Session, run_id: str, attempt_id: str, version: int) -> None:
    """Record that ``attempt_id``'s import, committing with this transaction, made the run's
    data ``version``: a verdict that judges that version judges the rows it wrote
    (:mod:`sync.acceptance.row_states`)."""
    session.execute(
        insert(session, RunImport)
        .values(run_id=run_id, attempt_id=attempt_id, version=version)
        .on_conflict_do_nothing(index_elements=["run_id", "attempt_id"])
    )


def keep_import_tally(
    session: Session, run_id: str, version: int, groups: Mapping[tuple[str | None, str | None], int]
) -> None:
    """Keep with the run what its only rows are at ``version`` (the import that wrote them
    just counted the run up to it): how many per partition and record shape. The run's first
    evaluation counts them from here instead of passing over the run (:mod:`sync.runs.shapes`)."""
    tally = {
        "version": version,
        "groups": [[partition, shape, n] for (partition, shape), n in groups.items()],
    }
    session.execute(update(Run).where(Run.run_id == run_id).values(import_tally=tally))


def evaluation_suffix(data_version: int) -> str:
    """The suffix of the evaluation job for a run's data version: one job per change, so the
    evaluation a sync queues and the one a sweep queues for the same change coalesce."""
    return f"v{data_version}"
