"""Reconciliation: heal whatever notifications, workers and Redis lost, by asking Cloud.

Cloud retries a notification only twice within ~15 s, so a restart loses some. A pass:

1. lists Cloud's scraping jobs (every page, within the shared API budget; on a 429 or a spent
   budget it waits the time Cloud asked for, up to ``max_wait``, and lists again);
2. for each job of a configured dataset created within ``since``: links a launch whose create
   was uncertain to the job that carries its custom_id; and wants a sync (``intake.want_sync``)
   for a finished job we never synced, one that changed since our last sync (status, page
   counters, stored records: Cloud's "Continue"), or one whose task still waits for it to end;
3. re-drives stuck tasks (``sweeper.sweep``: expired leases, lost RQ jobs, due retries);
4. evaluates runs whose tasks are all committed and changed since their last evaluation;
5. re-drives unsent or failed outbox events.

Every step is a repeatable wish, so a second pass right after the first does nothing. Jobs in
flight (pending, leased, retry_wait) are left to the sweeper; quarantined, dead or gone tasks
without data are reported, not revived (``scrapesync sync JOB_ID`` retries one by hand).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select, update

from sync import logs
from sync.bootstrap import Services
from sync.cloud.errors import ApiBudgetExhaustedError, CloudError, CloudRateLimitedError
from sync.cloud.jobs import CloudJob
from sync.delivery import relay
from sync.ingest import intake, job_changes, store, sweeper
from sync.models import Launch, MaintenanceRun, Run, SyncTask
from sync.models import ScrapingJob as JobRow
from sync.retry import backoff
from sync.runs import due, evaluation
from sync.states import LaunchState, PassKind, TaskState

log = logs.get("reconcile")

DEFAULT_SINCE = timedelta(days=7)
IN_FLIGHT = (TaskState.PENDING, TaskState.LEASED, TaskState.RETRY_WAIT)
CHUNK = 500
CLI_MAX_WAIT = 900.0  # `reconcile --wait`: at most one budget window
WORKER_MAX_WAIT = 60.0  # a worker's pass stops early rather than outwait its RQ job timeout


@dataclass(frozen=True)
class Wanted:
    """A Cloud job whose sync this pass asked for, and why."""

    job_id: int
    reason: str


@dataclass
class ReconcileReport:
    """What one reconcile pass found and did."""

    started_at: datetime
    since: datetime
    dry_run: bool
    listed: int = 0
    complete: bool = True
    listing_error: str | None = None
    waited_seconds: float = 0.0
    would_wait_seconds: float | None = None  # the wait a complete listing needed, not taken
    in_range: int = 0
    ignored: int = 0
    running: int = 0
    unchanged: int = 0
    in_flight: int = 0
    wanted: list[Wanted] = field(default_factory=list)
    enqueued: int = 0
    needs_attention: list[int] = field(default_factory=list)
    ignored_tasks: list[int] = field(default_factory=list)  # failed tasks of other sitemaps
    launches_linked: list[str] = field(default_factory=list)
    tasks_due: int = 0
    tasks_requeued: int = 0
    runs_evaluated: list[str] = field(default_factory=list)
    outbox_redriven: int = 0
    finished_at: datetime | None = None

    @property
    def did_anything(self) -> bool:
        """Whether the pass changed or queued anything (a dry run reports what it would do)."""
        return bool(
            self.wanted
            or self.enqueued
            or self.launches_linked
            or self.tasks_requeued
            or self.runs_evaluated
            or self.outbox_redriven
        )

    def as_dict(self) -> dict[str, Any]:
        """The report as plain JSON-able values."""
        values = asdict(self)
        for key in ("started_at", "since", "finished_at"):
            moment = values[key]
            values[key] = moment.isoformat() if moment is not None else None
        values["did_anything"] = self.did_anything
        return values

    def summary_line(self) -> str:
        """One line for logs and non-terminal output."""
        verb = "would want" if self.dry_run else "wanted"
        line = (
            f"reconcile: {self.listed} Cloud jobs listed, {self.in_range} in range; "
            f"{verb} {len(self.wanted)} syncs "
            f"({self._reasons()}); {self.unchanged} unchanged, {self.in_flight} in flight, "
            f"{self.running} still running, {self.ignored} of other sitemaps (ignored); "
            f"{self.tasks_requeued} stuck tasks re-queued ({self.tasks_due} due); "
            f"{len(self.runs_evaluated)} runs evaluated; {self.outbox_redriven} outbox events "
            f"re-driven; {len(self.launches_linked)} launches linked"
        )
        if self.needs_attention:
            line += f"; needs attention: jobs {', '.join(map(str, self.needs_attention))}"
        if not self.complete:
            line += f"; INCOMPLETE listing: {self.listing_error}"
            if self.would_wait_seconds is not None:
                line += (
                    f" (a complete pass would wait {self.would_wait_seconds:.0f} s for the API "
                    "budget: run it again then, or with --wait)"
                )
        return line

    def _reasons(self) -> str:
        counts: dict[str, int] = {}
        for wish in self.wanted:
            counts[wish.reason] = counts.get(wish.reason, 0) + 1
        return ", ".join(f"{n} {reason}" for reason, n in sorted(counts.items())) or "none"


def parse_since(text: str) -> timedelta:
    """A look-back like ``7d``, ``12h``, ``30m`` or ``3600`` (seconds) as a timedelta."""
    text = text.strip().lower()
    units = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "w": 604800.0}
    scale = units.get(text[-1:])
    number = text[:-1] if scale is not None else text
    try:
        value = float(number)
    except ValueError:
        raise ValueError(
            f"--since takes a number with d, h, m or s, e.g. 7d; got {text!r}"
        ) from None
    if value <= 0:
        raise ValueError(f"--since must be positive, got {text!r}")
    return timedelta(seconds=value * (scale or 1.0))


def reconcile(
    services: Services,
    *,
    since: timedelta = DEFAULT_SINCE,
    dry_run: bool = False,
    sleep: Callable[[float], None] = time.sleep,
    max_wait: float = 900.0,
    on_progress: Callable[[int, int], None] | None = None,
) -> ReconcileReport:
    """Run one reconcile pass; with ``dry_run`` only report what it would do."""
    now = services.clock()
    report = ReconcileReport(started_at=now, since=now - since, dry_run=dry_run)
    pass_id = None if dry_run else _start(services, now)
    jobs = _list_jobs(services, report, sleep=sleep, max_wait=max_wait)
    report.listed = len(jobs)
    cutoff = report.since
    in_range = [j for j in jobs if j.time_created is None or _created(j) >= cutoff]
    report.in_range = len(in_range)
    _check_jobs(services, report, in_range, on_progress)
    if not dry_run:
        _want(services, report)
        _ignore(services, report.ignored_tasks)
        _link_launches(services, report, in_range)
        swept = sweeper.sweep(services)
        report.tasks_due, report.tasks_requeued = swept.due, swept.enqueued
    else:
        with services.uow.begin() as session:
            report.tasks_due = len(store.due_tasks(session, now=services.clock()))
        report.launches_linked = [b for b, _ in _unlinked(services, in_range)]
    with services.uow.begin() as session:
        candidates = due.runs_due_for_evaluation(session, limit=None)
    if dry_run:
        report.runs_evaluated = candidates
        with services.uow.begin() as session:
            report.outbox_redriven = relay.due_deliveries(session, now=services.clock())
    else:
        report.runs_evaluated = _evaluate(services, candidates)
        report.outbox_redriven = relay.relay(services).claimed
    report.finished_at = services.clock()
    if pass_id is not None:
        _finish(services, pass_id, report)
    if report.did_anything or not report.complete:
        log.info("reconcile.done", extra=report.as_dict())
    return report


def _created(job: CloudJob) -> datetime:
    assert job.time_created is not None
    return datetime.fromtimestamp(job.time_created, UTC)


def _start(services: Services, now: datetime) -> int:
    with services.uow.begin() as session:
        row = MaintenanceRun(kind=PassKind.RECONCILE, started_at=now, summary={"state": "running"})
        session.add(row)
        session.commit()
        return row.id


def _finish(services: Services, pass_id: int, report: ReconcileReport) -> None:
    with services.uow.begin() as session:
        row = session.get(MaintenanceRun, pass_id)
        assert row is not None
        row.finished_at = report.finished_at
        state = "done" if report.complete else "incomplete"
        row.summary = {"state": state, **report.as_dict()}
        session.commit()


def _list_jobs(
    services: Services,
    report: ReconcileReport,
    *,
    sleep: Callable[[float], None],
    max_wait: float,
) -> list[CloudJob]:
    """Every scraping job Cloud lists, waiting politely when Cloud or the budget says so."""
    seen: dict[int, CloudJob] = {}
    next_page = 1  # after a wait the listing resumes here; pages already read cost nothing
    refused = 0
    while True:
        try:
            with services.cloud() as cloud:
                for page, jobs in cloud.iter_job_pages(start_page=next_page):
                    for job in jobs:
                        seen.setdefault(job.id, job)
                    next_page = page + 1
            return list(seen.values())
        except (CloudRateLimitedError, ApiBudgetExhaustedError) as exc:
            refused += 1
            hinted = exc.retry_after
            # Cloud named no wait: back off longer each time (at least half the ceiling)
            guess = backoff(refused, 0.5 + services.random() / 2, base=1.0, cap=60.0)
            wait = max(hinted if hinted is not None else guess, 0.0) + 1.0
            if report.waited_seconds + wait > max_wait:
                report.complete, report.listing_error = False, str(exc)
                report.would_wait_seconds = round(wait, 1)
                log.warning(
                    "reconcile.not_waiting",
                    extra={"seconds": round(wait, 1), "max_wait": max_wait, "listed": len(seen)},
                )
                return list(seen.values())
            log.info("reconcile.waiting", extra={"seconds": round(wait, 1), "listed": len(seen)})
            sleep(wait)
            report.waited_seconds += wait
        except CloudError as exc:
            report.complete, report.listing_error = False, str(exc)
            log.warning("reconcile.listing_failed", extra={"error": str(exc)})
            return list(seen.values())


def _chunks(items: Sequence[Any]) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), CHUNK):
        yield items[start : start + CHUNK]


def _ours(services: Services, jobs: Sequence[CloudJob]) -> set[int]:
    """The jobs that feed a configured dataset: by sitemap, or by a custom_id we gave."""
    custom_ids = sorted({j.custom_id for j in jobs if j.custom_id})
    known: set[str] = set()
    with services.uow.begin() as session:
        for chunk in _chunks(custom_ids):
            known.update(
                session.execute(select(Launch.batch_id).where(Launch.batch_id.in_(chunk))).scalars()
            )
            known.update(session.execute(select(Run.run_id).where(Run.run_id.in_(chunk))).scalars())
    return {
        j.id
        for j in jobs
        if (j.custom_id is not None and j.custom_id in known)
        or services.datasets.for_sitemap(j.sitemap_id, j.sitemap_name) is not None
    }


def _check_jobs(
    services: Services,
    report: ReconcileReport,
    jobs: Sequence[CloudJob],
    on_progress: Callable[[int, int], None] | None,
) -> None:
    ours = _ours(services, jobs)
    ids = [j.id for j in jobs if j.id in ours]
    rows: dict[int, dict[str, Any]] = {}
    tasks: dict[int, tuple[str, str | None]] = {}
    with services.uow.begin() as session:
        for chunk in _chunks(ids):
            for row in session.execute(
                select(JobRow.__table__).where(JobRow.job_id.in_(chunk))
            ).mappings():
                rows[int(row["job_id"])] = dict(row)
        # every listed job's task: another sitemap's job may have one, from a notification
        for chunk in _chunks([j.id for j in jobs]):
            for job_id, state, error_class in session.execute(
                select(SyncTask.job_id, SyncTask.state, SyncTask.last_error_class).where(
                    SyncTask.job_id.in_(chunk)
                )
            ):
                tasks[int(job_id)] = (state, error_class)
    for done, job in enumerate(jobs, start=1):
        _check_one(report, job, job.id in ours, rows.get(job.id), tasks.get(job.id))
        if on_progress is not None:
            on_progress(done, len(jobs))


def _check_one(
    report: ReconcileReport,
    job: CloudJob,
    ours: bool,
    row: dict[str, Any] | None,
    task: tuple[str, str | None] | None,
) -> None:
    if not ours:
        report.ignored += 1
        if task is not None and task[0] != TaskState.IGNORED and task[1] == "NoDatasetError":
            report.ignored_tasks.append(job.id)
        return
    if not job.is_terminal:
        report.running += 1
        return
    if task is not None and task[0] in IN_FLIGHT:
        if task[0] == TaskState.RETRY_WAIT and task[1] == "JobNotFinishedError":
            report.wanted.append(Wanted(job.id, "finished since"))
        else:
            report.in_flight += 1
        return
    if row is None:
        if task is None:
            report.wanted.append(Wanted(job.id, "never synced"))
        elif task[0] == TaskState.IGNORED:  # its sitemap was added to the datasets file since
            report.wanted.append(Wanted(job.id, "now configured"))
        else:
            report.needs_attention.append(job.id)
        return
    if job_changes.changed_since(job, row):
        report.wanted.append(Wanted(job.id, "changed since"))
    else:
        report.unchanged += 1


def _want(services: Services, report: ReconcileReport) -> None:
    """Ask for the syncs the pass found missing, then queue them (repeats coalesce)."""
    for wish in report.wanted:
        # a failure to queue is logged; the task row is durable and the sweeper below queues it
        if intake.want_sync(services, wish.job_id, failure_event="reconcile.enqueue_failed").queued:
            report.enqueued += 1


def _ignore(services: Services, job_ids: Sequence[int]) -> None:
    """Tasks of jobs whose sitemap feeds no dataset are ``ignored``, as the sync path leaves
    them, never failed: an alert on failed tasks must not fire for another sitemap's job."""
    for chunk in _chunks(list(job_ids)):
        with services.uow.begin() as session:
            session.execute(
                update(SyncTask)
                .where(SyncTask.job_id.in_(chunk), SyncTask.last_error_class == "NoDatasetError")
                .values(state=TaskState.IGNORED, updated_at=services.clock())
            )
            session.commit()


def _unlinked(services: Services, jobs: Sequence[CloudJob]) -> list[tuple[str, int]]:
    """Launches left uncertain or abandoned whose job Cloud lists: (batch id, job id)."""
    by_custom_id = {j.custom_id: j.id for j in jobs if j.custom_id}
    if not by_custom_id:
        return []
    found: list[tuple[str, int]] = []
    with services.uow.begin() as session:
        for chunk in _chunks(sorted(by_custom_id)):
            for batch_id in session.execute(
                select(Launch.batch_id).where(
                    Launch.batch_id.in_(chunk),
                    Launch.state.in_((LaunchState.UNCERTAIN, LaunchState.CREATING)),
                )
            ).scalars():
                found.append((batch_id, by_custom_id[batch_id]))
    return found


def _link_launches(services: Services, report: ReconcileReport, jobs: Sequence[CloudJob]) -> None:
    for batch_id, job_id in _unlinked(services, jobs):
        with services.uow.begin() as session:
            launch = session.get(Launch, batch_id)
            if launch is None or launch.state not in (LaunchState.UNCERTAIN, LaunchState.CREATING):
                continue
            launch.state, launch.job_id, launch.updated_at = (
                LaunchState.CREATED,
                job_id,
                services.clock(),
            )
            launch.last_error = None
            session.commit()
        report.launches_linked.append(batch_id)
        log.info("reconcile.launch_linked", extra={"batch_id": batch_id, "job_id": job_id})


def _evaluate(services: Services, run_ids: Sequence[str]) -> list[str]:
    done: list[str] = []
    for run_id in run_ids:
        try:
            evaluation.evaluate_run(services, run_id)
        except Exception:  # one broken run must not stop the pass; its error is logged
            log.exception("reconcile.evaluate_failed", extra={"run_id": run_id})
            continue
        done.append(run_id)
    return done


def schedule(services: Services) -> bool:
    """Queue a reconcile pass if none started within ``settings.reconcile_interval``."""
    interval = services.settings.reconcile_interval
    now = services.clock()
    with services.uow.begin() as session:
        last = session.execute(
            select(func.max(MaintenanceRun.started_at)).where(
                MaintenanceRun.kind == PassKind.RECONCILE
            )
        ).scalar_one()
    if last is not None and (now - last).total_seconds() < interval:
        return False
    # Redis away: the failure is logged and the next maintenance pass asks again
    return bool(services.dispatcher.reconcile(bucket=int(now.timestamp() // interval)))
