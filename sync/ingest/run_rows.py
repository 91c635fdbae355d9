"""The rows a committed import writes beside its observations: the run it collects for (created
once, its data version counted up by each import) and the scraping job as Cloud last described
it. Functions take a session and never commit."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import null, select, update
from sqlalchemy.orm import Session

from sync.cloud.jobs import CloudJob
from sync.db import insert
from sync.ingest.direct_copy import MAX_GROUPS
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


def record_import(
    session: Session,
    run_id: str,
    attempt_id: str,
    version: int,
    *,
    written: list[int] | None = None,
) -> None:
    """Record that ``attempt_id``'s import, committing with this transaction, made the run's
    data ``version``: a verdict that judges that version judges the rows it wrote
    (:mod:`sync.acceptance.row_states`). ``written``: the ids of the rows it wrote, when it
    kept them (the run's next evaluation then finds its pending rows without a pass)."""
    session.execute(
        insert(session, RunImport)
        .values(
            run_id=run_id,
            attempt_id=attempt_id,
            version=version,
            written=null() if written is None else written,  # SQL NULL, not JSON's
        )
        .on_conflict_do_nothing(index_elements=["run_id", "attempt_id"])
    )


@dataclass(frozen=True)
class GroupsChange:
    """How one import changed its run's rows per group (partition, stored shape, attempt
    that last wrote the row: see :mod:`sync.runs.shapes`), from the data version ``start``
    it began at: the rows it wrote per (partition, shape), and either every row of the run
    (``replaces_all``: it copied into a run it found empty) or the rows its writes replaced."""

    start: int
    replaces_all: bool
    wrote: Mapping[tuple[str | None, str | None], int]
    replaced: Mapping[tuple[str | None, str | None, str], int] = field(default_factory=dict)
    ids: list[int] | None = None  # the ids of the rows it wrote, when it kept them
    start_groups: dict[str, Any] | None = None  # the groups kept when it began


def keep_row_groups(
    session: Session, run_id: str, attempt_id: str, version: int, change: GroupsChange | None
) -> None:
    """Keep with the run its rows per group at ``version``, the data version this import's
    commit just counted up to (the run's row is locked since), when they follow from the
    import's ``change``: every row of the run, or a change from the groups kept at the version
    the import began at, the version before. Otherwise the groups kept stay at an older
    version, which no evaluation trusts (it passes over the run instead)."""
    if change is None or change.start != version - 1:
        return
    groups: Counter[tuple[str | None, str | None, str]] = Counter()
    if not change.replaces_all:
        kept = session.execute(select(Run.row_groups).where(Run.run_id == run_id)).scalar_one()
        if kept is None or kept["version"] != change.start:
            return
        # what it replaced was read from rows as they stood when it began: an evaluation that
        # gave rows their shapes since kept other groups, and those rows may be among them
        if change.replaced and kept != change.start_groups:
            return
        groups.update({(p, s, a): n for p, s, a, n in kept["groups"]})
        groups.subtract(change.replaced)
    for (partition, shape), n in change.wrote.items():
        groups[partition, shape, attempt_id] += n
    if min(groups.values(), default=0) < 0:
        return  # not the rows the groups said (never expected)
    store_row_groups(session, run_id, version, [(p, s, a, n) for (p, s, a), n in groups.items()])


def store_row_groups(
    session: Session, run_id: str, version: int | None, groups: Iterable[Sequence[Any]]
) -> None:
    """Keep with the run its rows per group, (partition, shape, attempt, rows) each, at data
    ``version`` (``runs.row_groups``); none when there is no version to name or when they are
    too many to be worth keeping."""
    rows = [[p, s, a, int(n)] for p, s, a, n in groups if n]
    kept: Any = null()
    if version is not None and len(rows) <= MAX_GROUPS:
        kept = {"version": version, "groups": rows}
    session.execute(update(Run).where(Run.run_id == run_id).values(row_groups=kept))


def evaluation_suffix(data_version: int) -> str:
    """The suffix of the evaluation job for a run's data version: one job per change, so the
    evaluation a sync queues and the one a sweep queues for the same change coalesce."""
    return f"v{data_version}"
