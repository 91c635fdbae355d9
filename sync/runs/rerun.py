"""Targeted recovery: re-scrape one partition, the failed pages, or given URLs of a run.

A rerun is a recovery batch of the ORIGINAL run: a ``launches`` row of kind ``rerun`` whose
``batch_id`` (``<run id>~r<n>``) is the Cloud job's ``custom_id``. The sync task maps that job
to the original run and collection window, so its records land under the same observation keys
with new attempts; when it commits, the run is evaluated again (partitions, then the whole run)
and a run that now passes is promoted: a rejected run becomes a ``candidate`` again as soon
as its recovery job exists, and the evaluation after the recovery commit accepts (and
publishes) or rejects it.

Before the job is launched the run's manifest is frozen into the launch row: for every
partition already accepted, its record count and a digest over its observation keys and payload
hashes. A rerun of a partition that passed is refused, and :func:`frozen_partitions_intact` proves
afterwards that the recovery batch left accepted partitions as they were.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from config.datasets import Dataset
from sync import logs
from sync.acceptance.facts import WAITING, Reason
from sync.bootstrap import Services
from sync.cloud.errors import CloudError
from sync.models import Launch, Observation, PartitionVerdict, Run, ScrapingJob, SyncTask
from sync.runs.launch import (
    LaunchError,
    LaunchOutcome,
    already_launched,
    carry_out,
    intend,
    resolve_sitemap,
)
from sync.states import LaunchKind, LaunchState, PartitionState, RunState, TaskState

log = logs.get("rerun")

PASSED = PartitionState.PASSED
UNFINISHED = (LaunchState.INTENDED, LaunchState.CREATING, LaunchState.UNCERTAIN)
MAX_START_URLS = 10_000


class RerunError(Exception):
    """A rerun cannot be made; the message names the run and what to do instead."""


def _digest(rows: Sequence[tuple[str, str]]) -> str:
    digest = hashlib.sha256()
    for key, payload_hash in rows:
        digest.update(f"{key}:{payload_hash}\n".encode())
    return digest.hexdigest()


def partition_digest(session: Session, run_id: str, partition: str) -> tuple[int, str]:
    """(records, digest over observation keys and payload hashes) of one partition of a run."""
    rows = session.execute(
        select(Observation.observation_key, Observation.payload_hash)
        .where(Observation.run_id == run_id, Observation.partition == partition)
        .order_by(Observation.observation_key)
    ).all()
    return len(rows), _digest([(r[0], r[1]) for r in rows])


def freeze_manifest(session: Session, run: Run, *, now: datetime) -> dict[str, Any]:
    """The run's partitions that passed, as they are now, to be kept exactly as they are."""
    accepted = session.execute(
        select(PartitionVerdict.partition).where(
            PartitionVerdict.run_id == run.run_id, PartitionVerdict.state == PASSED
        )
    ).scalars()
    frozen: dict[str, Any] = {}
    for partition in sorted(accepted):
        records, digest = partition_digest(session, run.run_id, partition)
        frozen[partition] = {"records": records, "digest": digest}
    return {"frozen_at": now.isoformat(), "run_state": run.state, "partitions": frozen}


def frozen_partitions_intact(services: Services, batch_id: str) -> dict[str, bool]:
    """For each partition a rerun froze: whether its records are still exactly as frozen."""
    with services.uow.begin() as session:
        launch = session.get(Launch, batch_id)
        if launch is None:
            raise RerunError(f"no recovery batch {batch_id!r}")
        frozen = (launch.manifest or {}).get("partitions", {})
        return {
            partition: partition_digest(session, launch.run_id, partition)
            == (kept["records"], kept["digest"])
            for partition, kept in frozen.items()
        }


def _partition_urls(session: Session, run_id: str, partition: str) -> list[str]:
    rows = session.execute(
        select(Observation.start_url, func.min(Observation.id))
        .where(
            Observation.run_id == run_id,
            Observation.partition == partition,
            Observation.start_url.is_not(None),
        )
        .group_by(Observation.start_url)
        .order_by(func.min(Observation.id))
    ).all()
    return [str(r[0]) for r in rows]


def _stored_problems(session: Session, run_id: str) -> tuple[list[str], list[int]]:
    """The problematic URLs stored on the run's scraping jobs, and the jobs with none stored."""
    urls: list[str] = []
    missing: list[int] = []
    for job_id, problems, failed, empty, no_value in session.execute(
        select(
            ScrapingJob.job_id,
            ScrapingJob.problematic_urls,
            ScrapingJob.jobs_failed,
            ScrapingJob.jobs_empty,
            ScrapingJob.jobs_no_value,
        )
        .where(ScrapingJob.run_id == run_id)
        .order_by(ScrapingJob.job_id)
    ):
        if problems is None:
            if failed or empty or no_value:
                missing.append(int(job_id))
            continue
        urls.extend(str(p["url"]) for p in problems if isinstance(p, dict) and p.get("url"))
    return urls, missing


def _unique(urls: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(u for u in urls if u))


def _check_urls(urls: Sequence[str]) -> list[str]:
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise RerunError(f"{url!r} is not an http(s) URL")
    if len(urls) > MAX_START_URLS:
        raise RerunError(f"{len(urls)} start URLs is more than one job takes ({MAX_START_URLS})")
    return list(urls)


@dataclass(frozen=True)
class _Plan:
    """What a rerun of one run starts from, read in one transaction."""

    dataset: Dataset
    sitemap_id: int | None
    unfinished: str | None  # an earlier rerun's batch whose create's fate is unknown
    start_urls: list[str]
    problems_missing: list[int]  # jobs with failed pages but no problematic URLs stored


def rerun(
    services: Services,
    run_id: str,
    *,
    partition: str | None = None,
    failed_pages: bool = False,
    urls: Sequence[str] = (),
) -> LaunchOutcome:
    """Launch a recovery job under ``run_id`` for one partition, the failed pages or ``urls``.

    An unfinished earlier rerun of the run (its create's fate unknown) is resumed instead, so a
    repeated command never makes a second job for one batch.
    """
    if sum([partition is not None, failed_pages, bool(urls)]) != 1:
        raise RerunError("choose exactly one of a partition, the failed pages or URLs")
    now = services.clock()
    plan = _plan(services, run_id, partition=partition, failed_pages=failed_pages, urls=urls)
    start_urls = plan.start_urls
    if plan.unfinished is None and plan.problems_missing:
        start_urls = [*start_urls, *_fetch_problems(services, plan.problems_missing)]
    with services.cloud() as cloud:
        if plan.sitemap_id is not None:
            sitemap_id = int(plan.sitemap_id)
        else:
            sitemap_id, _ = resolve_sitemap(services, plan.dataset, cloud)
        if plan.unfinished is not None:
            log.info("rerun.resumed", extra={"run_id": run_id, "batch_id": plan.unfinished})
            resumed = carry_out(services, cloud, plan.unfinished, sitemap_id=sitemap_id)
            return _reopen(services, resumed)
        start_urls = _check_urls(_unique(start_urls))
        if not start_urls:
            raise RerunError(f"run {run_id} has no failed, empty or no-value pages to rerun")
        running = _same_batch_running(services, run_id, partition, start_urls)
        if running is not None:
            return running
        batch_id = _intend_batch(services, run_id, partition, start_urls, now=now)
        log.info(
            "rerun.intended",
            extra={"run_id": run_id, "batch_id": batch_id, "start_urls": len(start_urls)},
        )
        return _reopen(services, carry_out(services, cloud, batch_id, sitemap_id=sitemap_id))


def _plan(
    services: Services,
    run_id: str,
    *,
    partition: str | None,
    failed_pages: bool,
    urls: Sequence[str],
) -> _Plan:
    """The run's dataset and sitemap, and an unfinished rerun to resume or else the pages to
    scrape again."""
    with services.uow.begin() as session:
        run = session.get(Run, run_id)
        if run is None:
            raise RerunError(f"no run {run_id!r} (see `scrapesync status`)")
        dataset = services.datasets.get(run.dataset)
        unfinished = session.execute(
            select(Launch.batch_id)
            .where(
                Launch.run_id == run_id,
                Launch.kind == LaunchKind.RERUN,
                Launch.state.in_(UNFINISHED),
            )
            .order_by(Launch.created_at)
            .limit(1)
        ).scalar_one_or_none()
        problems_missing: list[int] = []
        start_urls: list[str] = []
        if unfinished is None:
            if partition is not None:
                start_urls = _partition_pages(session, run_id, partition)
            elif failed_pages:
                start_urls, problems_missing = _stored_problems(session, run_id)
            else:
                start_urls = list(urls)
        return _Plan(dataset, run.sitemap_id, unfinished, start_urls, problems_missing)


def _partition_pages(session: Session, run_id: str, partition: str) -> list[str]:
    """The start URLs of a partition that did not pass; an accepted one is left untouched."""
    verdict = session.execute(
        select(PartitionVerdict.state).where(
            PartitionVerdict.run_id == run_id, PartitionVerdict.partition == partition
        )
    ).scalar_one_or_none()
    if verdict == PASSED:
        raise RerunError(
            f"partition {partition!r} of run {run_id} was accepted; accepted "
            "partitions are left untouched (rerun a failed partition or --url)"
        )
    start_urls = _partition_urls(session, run_id, partition)
    if not start_urls:
        raise RerunError(
            f"run {run_id} has no start URLs for partition {partition!r} (none of "
            "its observations carries one); pass the pages with --url"
        )
    return start_urls


def _same_batch_running(
    services: Services, run_id: str, partition: str | None, start_urls: list[str]
) -> LaunchOutcome | None:
    """The run's recovery batch for these same pages whose Cloud job was created and is not
    synced yet: a repeated ``rerun`` finds it, as a repeated ``launch`` finds its job."""
    with services.uow.begin() as session:
        batches = session.execute(
            select(Launch)
            .where(
                Launch.run_id == run_id,
                Launch.kind == LaunchKind.RERUN,
                Launch.state == LaunchState.CREATED,
            )
            .order_by(Launch.created_at.desc())
        ).scalars()
        for batch in batches:
            same = batch.partition == partition and list(batch.start_urls or []) == start_urls
            if not same or batch.job_id is None:
                continue
            synced = session.execute(
                select(SyncTask.task_key).where(
                    SyncTask.job_id == batch.job_id, SyncTask.state == TaskState.COMMITTED
                )
            ).first()
            if synced is None:
                log.info("rerun.already_running", extra={"run_id": run_id, "batch": batch.batch_id})
                return already_launched(
                    batch,
                    f"already launched: recovery batch {batch.batch_id} for the same pages is "
                    "not synced yet",
                )
    return None


def _intend_batch(
    services: Services,
    run_id: str,
    partition: str | None,
    start_urls: list[str],
    *,
    now: datetime,
) -> str:
    """Record the run's next recovery batch with the manifest of its accepted partitions."""
    with services.uow.begin() as session:
        run = session.get(Run, run_id)
        assert run is not None
        number = (
            1
            + session.execute(
                select(func.count())
                .select_from(Launch)
                .where(Launch.run_id == run_id, Launch.kind == LaunchKind.RERUN)
            ).scalar_one()
        )
        batch_id = f"{run_id}~r{number}"
        intend(
            session,
            batch_id=batch_id,
            run_id=run_id,
            kind=LaunchKind.RERUN,
            partition=partition,
            start_urls=start_urls,
            now=now,
        )
        launch = session.get(Launch, batch_id)
        assert launch is not None
        if launch.manifest is None:
            launch.manifest = freeze_manifest(session, run, now=now)
        session.commit()
    return batch_id


def _reopen(services: Services, outcome: LaunchOutcome) -> LaunchOutcome:
    """A rejected run whose recovery job exists is a candidate again, waiting for that job."""
    if outcome.state != LaunchState.CREATED:
        return outcome
    waiting = Reason(
        "recovery_batch",
        f"waiting for recovery batch {outcome.batch_id} (Cloud job {outcome.job_id})",
        detail={"kind": WAITING, "batch_id": outcome.batch_id, "job_id": outcome.job_id},
    )
    with services.uow.begin() as session:
        reopened = session.execute(
            update(Run)
            .where(Run.run_id == outcome.run_id, Run.state == RunState.REJECTED)
            .values(
                state=RunState.CANDIDATE, reasons=[waiting.as_dict()], updated_at=services.clock()
            )
        )
        session.commit()
    if reopened.rowcount:  # type: ignore[attr-defined]
        log.info(
            "rerun.run_reopened", extra={"run_id": outcome.run_id, "batch_id": outcome.batch_id}
        )
    return outcome


def _fetch_problems(services: Services, job_ids: Sequence[int]) -> list[str]:
    """Problematic URLs Cloud lists for jobs whose list was never stored."""
    urls: list[str] = []
    try:
        with services.cloud() as cloud:
            for job_id in job_ids:
                urls.extend(p.url for p in cloud.iter_problematic_urls(job_id))
    except CloudError as exc:
        raise LaunchError(f"cannot read the problematic URLs from Cloud: {exc}") from None
    return urls
