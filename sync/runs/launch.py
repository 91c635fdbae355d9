"""Launching Cloud scraping jobs for runs: never two Cloud jobs for one launch.

The launch protocol: the intent (a ``launches`` row whose ``batch_id`` becomes the job's
``custom_id``) is committed BEFORE Cloud is called. A process takes the launch by moving it to
``creating``; only one process holds it at a time (a ``creating`` launch older than the lease
time counts as abandoned). Then:

- ``intended`` or ``failed`` (Cloud certainly made no job): create the job.
- ``uncertain`` (a create timed out or got a 5xx: Cloud may have made the job) or an abandoned
  ``creating``: first list the sitemap's jobs for that ``custom_id``; create only if none exists.
- ``created``: nothing to do; the job id is known.

After an uncertain create the same call looks the job up once more; if Cloud shows none yet the
launch stays ``uncertain`` and the next ``scrapesync launch`` (or a reconcile that sees the job)
settles it. A create is never simply repeated.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session

from config.datasets import Dataset
from sync import logs
from sync.bootstrap import Services
from sync.cloud.client import CloudClient
from sync.cloud.errors import (
    ApiBudgetExhaustedError,
    CloudAuthError,
    CloudError,
    CloudNotFoundError,
    CloudRateLimitedError,
    CloudServerError,
    CloudTransportError,
    CloudValidationError,
)
from sync.cloud.jobs import CloudJob
from sync.db import insert
from sync.ingest import run_rows
from sync.models import Launch, Run
from sync.states import LaunchKind, LaunchState

log = logs.get("launch")

CUSTOM_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._~-]{0,199}")
WINDOW_FORMATS = {"daily": re.compile(r"\d{4}-\d{2}-\d{2}"), "weekly": re.compile(r"\d{4}-W\d{2}")}


class LaunchError(Exception):
    """A launch cannot go ahead; the message names the dataset, run or batch and what to do."""


@dataclass(frozen=True)
class LaunchOutcome:
    """What one launch call found and did."""

    batch_id: str
    run_id: str
    kind: str
    state: str
    job_id: int | None
    created_job: bool
    found_existing: bool
    start_urls: tuple[str, ...]
    message: str

    def as_dict(self) -> dict[str, object]:
        """The outcome as plain JSON-able values."""
        return {
            "batch_id": self.batch_id,
            "run_id": self.run_id,
            "kind": self.kind,
            "state": self.state,
            "job_id": self.job_id,
            "created_job": self.created_job,
            "found_existing": self.found_existing,
            "start_urls": list(self.start_urls),
            "message": self.message,
        }

    def said(self) -> str:
        """The state, and what happened when that says more (``created``, not ``created:
        created``; ``created: already launched``)."""
        return self.state if self.message == self.state else f"{self.state}: {self.message}"


def check_custom_id(value: str) -> str:
    """``value`` if Cloud can carry it as a custom_id (letters, digits, ``._~-``), else an error."""
    if not CUSTOM_ID.fullmatch(value):
        raise LaunchError(
            f"{value!r} cannot be a Cloud custom_id: use letters, digits and . _ ~ - "
            "(at most 200 characters)"
        )
    return value


def window_now(dataset: Dataset, now: datetime) -> str:
    """The collection window a launch made now falls in (job windows use the launch time)."""
    if dataset.window == "job":
        return f"launch-{now:%Y%m%dT%H%M%S}"
    return dataset.window_for(now, 0)


def check_window(dataset: Dataset, window: str) -> str:
    """``window`` if it is spelled as the dataset's windows are, else an error naming the form."""
    pattern = WINDOW_FORMATS.get(dataset.window)
    if pattern is not None and not pattern.fullmatch(window):
        form = "YYYY-MM-DD" if dataset.window == "daily" else "YYYY-Www"
        raise LaunchError(
            f"dataset {dataset.name!r} has {dataset.window} windows: --window must look like "
            f"{form}, got {window!r}"
        )
    if len(window) > 40:
        raise LaunchError(f"window {window!r} is longer than 40 characters")
    if pattern is not None and not _on_the_calendar(dataset.window, window):
        raise LaunchError(
            f"dataset {dataset.name!r}: window {window!r} is not a {dataset.window} window on "
            "the calendar (no such day or ISO week)"
        )
    return window


def _on_the_calendar(kind: str, window: str) -> bool:
    """Whether a well-spelled daily or weekly window names a real day or ISO week."""
    try:
        if kind == "daily":
            date.fromisoformat(window)
        else:
            year, week = window.split("-W")
            date.fromisocalendar(int(year), int(week), 1)
    except ValueError:
        return False
    return True


def resolve_sitemap(services: Services, dataset: Dataset, cloud: CloudClient) -> tuple[int, str]:
    """The Cloud sitemap (id, name) of a dataset: its sitemap_id, or the sitemap with its name."""
    if dataset.sitemap_id is not None:
        return dataset.sitemap_id, dataset.sitemap or ""
    for sitemap in cloud.iter_sitemaps():
        if sitemap.get("name") == dataset.sitemap:
            return int(sitemap["id"]), str(sitemap["name"])
    raise LaunchError(
        f"dataset {dataset.name!r}: Cloud has no sitemap named {dataset.sitemap!r} "
        "(create it in Cloud, or set sitemap_id in the datasets file)"
    )


def launch(
    services: Services,
    dataset_name: str,
    *,
    window: str | None = None,
    start_urls: Sequence[str] = (),
) -> LaunchOutcome:
    """Create (or find) the run of ``dataset_name`` for ``window`` and start its Cloud job.

    The same dataset and window always give the same run and at most one Cloud job.
    """
    dataset = services.datasets.get(dataset_name)
    now = services.clock()
    window = check_window(dataset, window or window_now(dataset, now))
    run_id = check_custom_id(dataset.run_id_for(window))
    with services.uow.begin() as session:
        run = session.get(Run, run_id)
        known_sitemap = (run.sitemap_id, run.sitemap_name) if run is not None else (None, None)
        existing = session.get(Launch, run_id)
        if existing is not None and existing.state == LaunchState.CREATED:
            return _outcome(_snap(existing), created=False, found=False, message="already launched")
    with services.cloud() as cloud:
        if known_sitemap[0] is not None:
            sitemap_id, sitemap_name = int(known_sitemap[0]), known_sitemap[1] or ""
        else:
            sitemap_id, sitemap_name = resolve_sitemap(services, dataset, cloud)
        with services.uow.begin() as session:
            run_rows.ensure_run(
                session,
                run_id=run_id,
                dataset=dataset.name,
                window=window,
                sitemap_id=sitemap_id,
                sitemap_name=sitemap_name,
                now=now,
            )
            intend(
                session,
                batch_id=run_id,
                run_id=run_id,
                kind=LaunchKind.LAUNCH,
                partition=None,
                start_urls=list(start_urls) or None,
                now=now,
            )
            session.commit()
        return carry_out(services, cloud, run_id, sitemap_id=sitemap_id)


def intend(
    session: Session,
    *,
    batch_id: str,
    run_id: str,
    kind: str,
    partition: str | None,
    start_urls: list[str] | None,
    now: datetime,
) -> bool:
    """Store the intent to launch ``batch_id`` unless it is stored already; True if new."""
    result = session.execute(
        insert(session, Launch)
        .values(
            batch_id=check_custom_id(batch_id),
            run_id=run_id,
            kind=kind,
            partition=partition,
            start_urls=start_urls,
            state=LaunchState.INTENDED,
            created_at=now,
            updated_at=now,
        )
        .on_conflict_do_nothing(index_elements=["batch_id"])
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


def _take(services: Services, batch_id: str) -> tuple[str, Snapshot] | None:
    """Move the launch to ``creating`` if nobody else is creating it; (previous state, row)."""
    now = services.clock()
    abandoned = now - timedelta(seconds=services.settings.lease_seconds)
    with services.uow.begin() as session:
        row = session.execute(
            select(Launch).where(Launch.batch_id == batch_id).with_for_update()
        ).scalar_one_or_none()
        if row is None:
            raise LaunchError(f"no launch {batch_id!r} is stored")
        previous = row.state
        free = or_(
            Launch.state.in_((LaunchState.INTENDED, LaunchState.FAILED, LaunchState.UNCERTAIN)),
            and_(Launch.state == LaunchState.CREATING, Launch.updated_at < abandoned),
        )
        taken = session.execute(
            update(Launch)
            .where(Launch.batch_id == batch_id, Launch.state == previous, free)
            .values(state=LaunchState.CREATING, updated_at=now)
        )
        if not taken.rowcount:  # type: ignore[attr-defined]
            return None
        session.commit()
        return previous, _snap(row)


def _settle(
    services: Services,
    batch_id: str,
    *,
    state: str,
    job_id: int | None = None,
    error: str | None = None,
) -> Snapshot:
    now = services.clock()
    with services.uow.begin() as session:
        row = session.get(Launch, batch_id)
        assert row is not None
        row.state = state
        row.updated_at = now
        row.last_error = error
        if job_id is not None:
            row.job_id = job_id
        session.commit()
        return _snap(row)


def find_job(cloud: CloudClient, *, sitemap_id: int, custom_id: str) -> CloudJob | None:
    """The sitemap's scraping job carrying ``custom_id``, if Cloud has one."""
    for job in cloud.iter_jobs(sitemap_id=sitemap_id):
        if job.custom_id == custom_id:
            return job
    return None


def carry_out(
    services: Services, cloud: CloudClient, batch_id: str, *, sitemap_id: int
) -> LaunchOutcome:
    """Take the stored launch ``batch_id`` and make sure Cloud has exactly one job for it."""
    taken = _take(services, batch_id)
    if taken is None:
        with services.uow.begin() as session:
            current = session.get(Launch, batch_id)
            assert current is not None
            message = (
                "already launched"
                if current.state == LaunchState.CREATED
                else "another process is creating this job right now; try again in a minute"
            )
            return _outcome(_snap(current), created=False, found=False, message=message)
    previous, row = taken
    bound = {"run_id": row.run_id, "batch_id": batch_id, "kind": row.kind}
    if previous in (LaunchState.UNCERTAIN, LaunchState.CREATING):
        try:
            found = find_job(cloud, sitemap_id=sitemap_id, custom_id=batch_id)
        except CloudError as exc:
            _settle(services, batch_id, state=LaunchState.UNCERTAIN, error=f"lookup: {exc}")
            raise LaunchError(
                f"launch {batch_id}: an earlier create may have made a Cloud job, and Cloud's "
                f"job list cannot be read now ({exc}); run the same command again later"
            ) from None
        if found is not None:
            settled = _settle(services, batch_id, state=LaunchState.CREATED, job_id=found.id)
            log.info("launch.found", extra={**bound, "job_id": found.id})
            return _outcome(settled, created=False, found=True, message="found the earlier job")
    start_urls = list(row.start_urls or [])
    try:
        job_id = cloud.create_job(
            sitemap_id=sitemap_id, start_urls=start_urls or None, custom_id=batch_id
        )
    except CloudError as exc:
        if not _uncertain(exc):
            _settle(services, batch_id, state=LaunchState.FAILED, error=str(exc))
            log.warning("launch.failed", extra={**bound, "error": str(exc)})
            raise LaunchError(f"launch {batch_id}: Cloud refused the job: {exc}") from None
        _settle(services, batch_id, state=LaunchState.UNCERTAIN, error=str(exc))
        log.warning("launch.uncertain", extra={**bound, "error": str(exc)})
        return _after_uncertain(services, cloud, batch_id, sitemap_id=sitemap_id, error=exc)
    settled = _settle(services, batch_id, state=LaunchState.CREATED, job_id=job_id)
    log.info("launch.created", extra={**bound, "job_id": job_id})
    return _outcome(settled, created=True, found=False, message="created")


def _after_uncertain(
    services: Services, cloud: CloudClient, batch_id: str, *, sitemap_id: int, error: CloudError
) -> LaunchOutcome:
    """After a create of unknown fate: look the job up; never create a second time here."""
    try:
        found = find_job(cloud, sitemap_id=sitemap_id, custom_id=batch_id)
    except CloudError:
        found = None
    if found is not None:
        settled = _settle(services, batch_id, state=LaunchState.CREATED, job_id=found.id)
        log.info("launch.found", extra={"batch_id": batch_id, "job_id": found.id})
        return _outcome(
            settled, created=True, found=True, message=f"create timed out ({error}); found the job"
        )
    with services.uow.begin() as session:
        row = session.get(Launch, batch_id)
        assert row is not None
        return _outcome(
            _snap(row),
            created=False,
            found=False,
            message=(
                f"Cloud may or may not have created the job ({error}); run the same command "
                "again later: it looks for the job before creating one"
            ),
        )


def _uncertain(exc: CloudError) -> bool:
    """Whether Cloud may have acted on a create that failed this way."""
    refused = (
        ApiBudgetExhaustedError,
        CloudRateLimitedError,
        CloudAuthError,
        CloudNotFoundError,
        CloudValidationError,
    )
    if isinstance(exc, refused):
        return False
    if isinstance(exc, CloudTransportError):
        return exc.request_sent
    if isinstance(exc, CloudServerError):
        return True
    return exc.status is None  # an answer that could not be read, e.g. 200 without a job id


@dataclass(frozen=True)
class Snapshot:
    """A launch row's values, read inside its transaction."""

    batch_id: str
    run_id: str
    kind: str
    state: str
    job_id: int | None
    start_urls: tuple[str, ...]


def _snap(row: Launch) -> Snapshot:
    return Snapshot(
        batch_id=row.batch_id,
        run_id=row.run_id,
        kind=row.kind,
        state=row.state,
        job_id=row.job_id,
        start_urls=tuple(str(u) for u in row.start_urls or ()),
    )


def _outcome(row: Snapshot, *, created: bool, found: bool, message: str) -> LaunchOutcome:
    return LaunchOutcome(
        batch_id=row.batch_id,
        run_id=row.run_id,
        kind=row.kind,
        state=row.state,
        job_id=row.job_id,
        created_job=created,
        found_existing=found,
        start_urls=row.start_urls,
        message=message,
    )


def already_launched(row: Launch, message: str) -> LaunchOutcome:
    """The outcome of a launch that found its batch's Cloud job already created."""
    return _outcome(_snap(row), created=False, found=False, message=message)
