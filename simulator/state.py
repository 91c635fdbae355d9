"""The simulated Cloud account: sitemaps, scraping jobs, their records, faults and notifications.

Job lifecycle, driven by test hooks (Cloud has no API for it):
``waiting-to-be-scheduled`` -> ``scheduled`` -> ``started`` -> ``finished`` | ``failed`` |
``stopped``. Entering a terminal status fires the notification. "Continue" sends a terminal job
back to ``waiting-to-be-scheduled``; finishing it again fires a fresh notification for the same
job id. Every public method is thread-safe (one re-entrant lock), because the API may be served
by a threaded server while a test drives the state.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import httpx

from simulator.export import Export
from simulator.fault import Fault, FaultPlan
from simulator.jobs import (
    PAGE_FAULTS,
    TERMINAL_STATUSES,
    Job,
    problem_list,
    scraped_so_far,
    settle_counters,
)
from simulator.notifier import Notifier
from simulator.quality import QualityInput, QualityThresholds, evaluate
from simulator.records import DEFAULT_PARTITIONS, generate_records
from simulator.sitemaps import Sitemap, product_selectors, sitemap_name
from simulator.throttle import Throttle

RETRY_AFTER_FORMATS = ("seconds", "http-date")


class CloudState:
    """One simulated Web Scraper Cloud account, shared by the API app and the test hooks."""

    def __init__(
        self,
        api_token: str = "sim-token",  # noqa: S107 (the simulator's well-known test token)
        rate_limit: int = 200,
        rate_window: float = 900.0,
        clock: Callable[[], float] = time.time,
        retry_after_format: str = "seconds",
        notify_url: str | None = None,
        notify_delays: Sequence[float] = (5.0, 10.0),
        notify_timeout: float = 10.0,
        notify_transport: httpx.BaseTransport | None = None,
        *,
        csv_bom: bool = True,
        page_credits: int = 100_000,
        first_sitemap_id: int = 1,
        first_job_id: int = 1001,
    ) -> None:
        if retry_after_format not in RETRY_AFTER_FORMATS:
            raise ValueError(f"retry_after_format must be one of {RETRY_AFTER_FORMATS}")
        self.api_token = api_token
        self.rate_limit = rate_limit
        self.rate_window = rate_window
        self.clock = clock
        self.retry_after_format = retry_after_format
        self.csv_bom = csv_bom
        self.page_credits = page_credits
        self.sitemaps: dict[int, Sitemap] = {}
        self.jobs: dict[int, Job] = {}
        self.calls = 0
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.RLock()
        self.throttle = Throttle()
        self.faults = FaultPlan()
        self.notifier = Notifier(
            url=notify_url,
            delays=notify_delays,
            timeout=notify_timeout,
            transport=notify_transport,
            clock=clock,
        )
        self._next_sitemap_id = first_sitemap_id
        self._next_job_id = first_job_id

    # -- notification settings live on the notifier; these keep the documented attribute names

    @property
    def notify_url(self) -> str | None:
        """Return the account's notification URL (None: notifications are off)."""
        return self.notifier.url

    @notify_url.setter
    def notify_url(self, url: str | None) -> None:
        self.notifier.url = url

    @property
    def notify_delays(self) -> tuple[float, ...]:
        """Return the waits before the second and third notification attempts."""
        return self.notifier.delays

    @notify_delays.setter
    def notify_delays(self, delays: Sequence[float]) -> None:
        self.notifier.delays = tuple(delays)

    @property
    def notify_timeout(self) -> float:
        """Return how long a receiver has to answer a notification."""
        return self.notifier.timeout

    @notify_timeout.setter
    def notify_timeout(self, timeout: float) -> None:
        self.notifier.timeout = timeout

    @property
    def notifications_sent(self) -> list[dict[str, Any]]:
        """Return every notification attempt: form, attempt, http_status or error, ok."""
        return self.notifier.sent

    def wait_for_notifications(self, timeout: float = 5.0) -> bool:
        """Wait until every queued notification delivery is done; False on timeout."""
        return self.notifier.wait(timeout)

    def close(self) -> None:
        """Stop notification retries and release the notifier's HTTP client."""
        self.notifier.close()

    def __enter__(self) -> CloudState:
        """Use the account as a context manager that closes the notifier on exit."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the notifier."""
        self.close()

    # -- sitemaps

    def add_sitemap(
        self,
        name: str,
        start_urls: Sequence[str] | str = ("https://shop.example/",),
        selectors: list[dict[str, Any]] | None = None,
    ) -> int:
        """Create a sitemap with this name and these start URLs; return its id. Without
        ``selectors`` it has one text selector per column of the generated product records."""
        urls = [start_urls] if isinstance(start_urls, str) else list(start_urls)
        chosen = product_selectors() if selectors is None else selectors
        return self.create_sitemap({"_id": name, "startUrl": urls, "selectors": chosen})

    def create_sitemap(self, definition: Mapping[str, Any]) -> int:
        """Store a sitemap definition as posted to ``POST sitemap``; return its id."""
        name = sitemap_name(definition)
        with self.lock:
            if any(s.name == name for s in self.sitemaps.values()):
                raise ValueError(f"a sitemap named {name!r} already exists")
            sitemap_id = self._next_sitemap_id
            self._next_sitemap_id += 1
            self.sitemaps[sitemap_id] = Sitemap(sitemap_id, name, dict(definition))
            return sitemap_id

    def update_sitemap(self, sitemap_id: int, definition: Mapping[str, Any]) -> None:
        """Replace a sitemap's definition (its name follows the new ``_id``)."""
        name = sitemap_name(definition)
        with self.lock:
            sitemap = self.sitemap(sitemap_id)
            if any(s.name == name and s.id != sitemap_id for s in self.sitemaps.values()):
                raise ValueError(f"a sitemap named {name!r} already exists")
            sitemap.name = name
            sitemap.definition = dict(definition)

    def delete_sitemap(self, sitemap_id: int) -> None:
        """Delete a sitemap; its jobs stay (what Cloud does with them is unknown)."""
        with self.lock:
            self.sitemap(sitemap_id)
            del self.sitemaps[sitemap_id]

    def sitemap(self, sitemap_id: int) -> Sitemap:
        """Return a sitemap by id or raise KeyError."""
        with self.lock:
            try:
                return self.sitemaps[sitemap_id]
            except KeyError:
                raise KeyError(f"no sitemap {sitemap_id}") from None

    def set_quality_thresholds(self, sitemap_id: int, **overrides: Any) -> None:
        """Configure a sitemap's data-quality criteria (what Cloud's UI tab does)."""
        with self.lock:
            sitemap = self.sitemap(sitemap_id)
            sitemap.quality = sitemap.quality.with_overrides(overrides)

    def enable_scheduler(self, sitemap_id: int, config: Mapping[str, Any]) -> None:
        """Store a sitemap's scheduler config and switch the scheduler on."""
        with self.lock:
            sitemap = self.sitemap(sitemap_id)
            sitemap.scheduler = dict(config)
            sitemap.scheduler_enabled = True

    def disable_scheduler(self, sitemap_id: int) -> None:
        """Switch a sitemap's scheduler off, keeping its config."""
        with self.lock:
            self.sitemap(sitemap_id).scheduler_enabled = False

    # -- jobs

    def create_job(
        self,
        sitemap_id: int,
        custom_id: str | None = None,
        start_urls: Sequence[str] | None = None,
        *,
        driver: str = "fast",
        request_interval: int = 2000,
        page_load_delay: int = 2000,
        proxy: Any = 0,
        scheduled: bool = False,
    ) -> int:
        """Create a scraping job for a sitemap, waiting to be scheduled; return its id."""
        with self.lock:
            sitemap = self.sitemap(sitemap_id)
            job_id = self._next_job_id
            self._next_job_id += 1
            self.jobs[job_id] = Job(
                id=job_id,
                sitemap_id=sitemap_id,
                sitemap_name=sitemap.name,
                time_created=int(self.clock()),
                start_urls=list(start_urls) if start_urls else sitemap.start_urls,
                custom_id=custom_id,
                driver=driver,
                request_interval=request_interval,
                page_load_delay=page_load_delay,
                proxy=proxy,
                scheduled=int(scheduled),
            )
            return job_id

    def job(self, job_id: int) -> Job:
        """Return a job by id or raise KeyError."""
        with self.lock:
            try:
                return self.jobs[job_id]
            except KeyError:
                raise KeyError(f"no scraping job {job_id}") from None

    def delete_job(self, job_id: int) -> None:
        """Delete a job and its data."""
        with self.lock:
            self.job(job_id)
            del self.jobs[job_id]

    def set_records(self, job_id: int, records: Iterable[Mapping[str, Any]]) -> None:
        """Replace a job's records (business fields; meta columns are added on download)."""
        with self.lock:
            job = self.job(job_id)
            job.records.replace(records)
            scraped_so_far(job)

    def add_records(self, job_id: int, records: Iterable[Mapping[str, Any]]) -> None:
        """Append records to a job (a ``generate_records(...)`` run stays lazy)."""
        with self.lock:
            job = self.job(job_id)
            job.records.append(records)
            scraped_so_far(job)

    def set_generated(
        self,
        job_id: int,
        n: int,
        seed: int = 0,
        partitions: Sequence[str] = DEFAULT_PARTITIONS,
        *,
        start: int = 0,
    ) -> None:
        """Give a job n lazily generated product records (O(1): nothing is rendered now)."""
        self.set_records(job_id, generate_records(n, seed=seed, partitions=partitions, start=start))

    def set_page_fault(self, job_id: int, kind: str | None) -> None:
        """Make every record of a job a page that is not data ("consent"), or undo it (None)."""
        if kind is not None and kind not in PAGE_FAULTS:
            raise ValueError(f"unknown page fault {kind!r}; expected one of {PAGE_FAULTS}")
        with self.lock:
            self.job(job_id).page_fault = kind

    def set_status(self, job_id: int, status: str) -> None:
        """Force a job's status to any string (e.g. legacy "shelved"), firing no notification."""
        with self.lock:
            self.job(job_id).status = status

    def start_job(self, job_id: int) -> None:
        """Move a waiting job through ``scheduled`` to ``started``."""
        with self.lock:
            job = self.job(job_id)
            job.status = "scheduled"
            job.status = "started"
            job.started_at = self.clock()
            scraped_so_far(job)

    def finish_job(
        self,
        job_id: int,
        status: str = "finished",
        jobs_scheduled: int | None = None,
        jobs_failed: int | None = None,
        jobs_empty: int | None = None,
        jobs_no_value: int | None = None,
        problematic_urls: Iterable[Mapping[str, str] | tuple[str, str]] | None = None,
        records_per_page: int | None = None,
    ) -> None:
        """End a job in a terminal status, fill its counters and fire its notification.

        Problem counters default to the counts in ``problematic_urls``; without a list, one URL
        per counted page is made up. Cloud counts pages, not records: ``jobs_scheduled`` defaults
        to the pages that yielded the records (``records_per_page`` each, default the job's, 1
        unless set) plus the failed, empty and no-value pages, which yield none;
        ``jobs_executed`` equals it.
        """
        if status not in TERMINAL_STATUSES:
            raise ValueError(f"terminal status must be one of {TERMINAL_STATUSES}, got {status!r}")
        if records_per_page is not None:
            _positive(records_per_page, "records_per_page")
        with self.lock:
            job = self.job(job_id)
            if job.started_at is None or job.status not in ("scheduled", "started"):
                self.start_job(job_id)
            urls = problem_list(problematic_urls) if problematic_urls is not None else None
            if records_per_page is not None:
                job.records_per_page = records_per_page
            settle_counters(
                job,
                urls,
                jobs_scheduled=jobs_scheduled,
                jobs_failed=jobs_failed,
                jobs_empty=jobs_empty,
                jobs_no_value=jobs_no_value,
            )
            now = self.clock()
            job.scraping_duration += max(0, int(now - (job.started_at or now)))
            job.started_at = None
            if not job.finished_once:
                self.page_credits = max(0, self.page_credits - job.jobs_executed)
                job.finished_once = True
            job.status = status
            form = job.notification_form()
        self.notifier.deliver(form)

    def continue_job(
        self, job_id: int, extra_records: Iterable[Mapping[str, Any]] | None = None
    ) -> None:
        """Cloud's UI "Continue": requeue a terminal job (no notification), adding records."""
        with self.lock:
            job = self.job(job_id)
            if job.status not in TERMINAL_STATUSES:
                raise ValueError(f"job {job_id} is {job.status!r}; only ended jobs can continue")
            if extra_records is not None:
                job.records.append(extra_records)
            job.status = "waiting-to-be-scheduled"

    def notify(self, job_id: int, times: int = 1) -> None:
        """Send a job's notification with its current status now, ``times`` times over."""
        with self.lock:
            form = self.job(job_id).notification_form()
        for _ in range(times):
            self.notifier.deliver(form)

    def run_job(
        self,
        job_id: int,
        n: int | None = None,
        records: Iterable[Mapping[str, Any]] | None = None,
        status: str = "finished",
        **finish: Any,
    ) -> None:
        """Give a job records (n generated, or explicit ones), start it and finish it."""
        if n is not None:
            self.set_generated(job_id, n)
        if records is not None:
            self.set_records(job_id, records)
        self.start_job(job_id)
        self.finish_job(job_id, status=status, **finish)

    # -- what the API reads

    def export(self, job_id: int) -> Export:
        """Snapshot what a download of this job renders (safe to stream outside the lock)."""
        with self.lock:
            job = self.job(job_id)
            return Export(
                records=job.records.snapshot(),
                order_time=job.time_created,
                start_urls=tuple(job.start_urls),
                consent=job.page_fault == "consent",
            )

    def data_quality(self, job_id: int) -> dict[str, Any] | None:
        """Return the job's data-quality result, or None while the job is not finished."""
        with self.lock:
            job = self.job(job_id)
            if job.status != "finished":
                return None
            sitemap = self.sitemaps.get(job.sitemap_id)
            thresholds = sitemap.quality if sitemap else QualityThresholds()
            facts = QualityInput(
                record_count=job.stored_record_count,
                jobs_scheduled=job.jobs_scheduled,
                jobs_failed=job.jobs_failed,
                jobs_empty=job.jobs_empty,
                jobs_no_value=job.jobs_no_value,
                filled=_column_fill(
                    sitemap.columns if sitemap else [],
                    job.records.filled_counts(consent=job.page_fault == "consent"),
                ),
            )
            return evaluate(facts, thresholds)

    # -- faults and the rate limit

    def inject_fault(
        self, kind: str, *, path_contains: str = "", times: int | None = 1, **params: Any
    ) -> None:
        """Arm a fault for the next ``times`` matching API requests (see ``simulator.fault``)."""
        fault = Fault(kind=kind, path_contains=path_contains, times=times, params=params)
        with self.lock:
            self.faults.arm(fault)

    def clear_faults(self) -> None:
        """Disarm every injected fault."""
        with self.lock:
            self.faults.clear()

    def take_fault(self, kinds: tuple[str, ...], method: str, path: str) -> Fault | None:
        """Spend and return the first armed fault of these kinds that targets a request."""
        with self.lock:
            return self.faults.take(kinds, method, path)

    def summary(self) -> dict[str, Any]:
        """Return the account at a glance: calls, job statuses, notifications, faults."""
        with self.lock:
            return {
                "calls": self.calls,
                "page_credits": self.page_credits,
                "sitemaps": {str(s.id): s.name for s in self.sitemaps.values()},
                "jobs": {str(j.id): j.status for j in self.jobs.values()},
                "notifications_sent": list(self.notifications_sent),
                "pending_notifications": self.notifier.pending,
                "faults": [f.describe() for f in self.faults.faults],
                "notify_url_set": self.notify_url is not None,
            }


def _column_fill(columns: Sequence[str], filled: Mapping[str, int]) -> dict[str, int]:
    """Return, per column of the sitemap's selectors, how many records filled it: a selector
    that no record carries counts 0, a record field no selector makes is not judged."""
    return {name: filled.get(name, 0) for name in columns}


def _positive(value: int, name: str) -> int:
    """Return value if it is a positive whole number, else refuse it naming the setting."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive whole number, got {value!r}")
    return value
