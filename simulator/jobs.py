"""A simulated scraping job: what Cloud shows of it, and how its page counters are counted."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from simulator.records import RecordSet

TERMINAL_STATUSES = ("finished", "failed", "stopped")
PROBLEM_TYPES = ("failed", "empty", "no_value")
PAGE_FAULTS = ("consent",)


@dataclass
class Job:
    """A scraping job: its settings, status, page counters, records and problematic URLs."""

    id: int
    sitemap_id: int
    sitemap_name: str
    time_created: int
    start_urls: list[str]
    custom_id: str | None = None
    driver: str = "fast"
    request_interval: int = 2000
    page_load_delay: int = 2000
    proxy: Any = 0
    status: str = "waiting-to-be-scheduled"
    test_run: int = 0
    scheduled: int = 0
    jobs_scheduled: int = 0
    jobs_executed: int = 0
    jobs_failed: int = 0
    jobs_empty: int = 0
    jobs_no_value: int = 0
    stored_record_count: int = 0
    scraping_duration: int = 0
    started_at: float | None = None
    finished_once: bool = False
    page_fault: str | None = None
    records_per_page: int = 1
    records: RecordSet = field(default_factory=RecordSet)
    problematic_urls: list[dict[str, str]] = field(default_factory=list)

    def as_api(self) -> dict[str, Any]:
        """Return the job exactly as ``GET scraping-job/{id}`` shows it (key set and order)."""
        return {
            "id": self.id,
            "custom_id": self.custom_id,
            "sitemap_name": self.sitemap_name,
            "status": self.status,
            "sitemap_id": self.sitemap_id,
            "test_run": self.test_run,
            "jobs_scheduled": self.jobs_scheduled,
            "jobs_executed": self.jobs_executed,
            "jobs_failed": self.jobs_failed,
            "jobs_empty": self.jobs_empty,
            "jobs_no_value": self.jobs_no_value,
            "stored_record_count": self.stored_record_count,
            "request_interval": self.request_interval,
            "page_load_delay": self.page_load_delay,
            "driver": self.driver,
            "scheduled": self.scheduled,
            "time_created": self.time_created,
            "scraping_duration": self.scraping_duration,
        }

    def notification_form(self) -> dict[str, str]:
        """Return the form Cloud POSTs when this job ends (no token in it)."""
        return {
            "scrapingjob_id": str(self.id),
            "status": self.status,
            "sitemap_id": str(self.sitemap_id),
            "sitemap_name": self.sitemap_name,
            "custom_id": self.custom_id or "",
        }


def scraped_so_far(job: Job) -> None:
    """While a job runs, its counters follow the records scraped so far (Cloud's progress)."""
    if job.status != "started":
        return
    job.stored_record_count = len(job.records)
    job.jobs_scheduled = job.jobs_executed = _pages(job.stored_record_count, job.records_per_page)


def settle_counters(
    job: Job,
    urls: list[dict[str, str]] | None,
    *,
    jobs_scheduled: int | None,
    jobs_failed: int | None,
    jobs_empty: int | None,
    jobs_no_value: int | None,
) -> None:
    """Fill an ending job's page counters, record count and problematic URLs (see finish_job)."""
    counted = {kind: sum(1 for u in urls or [] if u["type"] == kind) for kind in PROBLEM_TYPES}
    job.jobs_failed = counted["failed"] if jobs_failed is None else jobs_failed
    job.jobs_empty = counted["empty"] if jobs_empty is None else jobs_empty
    job.jobs_no_value = counted["no_value"] if jobs_no_value is None else jobs_no_value
    job.problematic_urls = _made_up_problems(job) if urls is None else urls
    record_count = len(job.records)
    problems = job.jobs_failed + job.jobs_empty + job.jobs_no_value
    job.jobs_scheduled = (
        _pages(record_count, job.records_per_page) + problems
        if jobs_scheduled is None
        else jobs_scheduled
    )
    job.jobs_executed = job.jobs_scheduled
    job.stored_record_count = record_count


def problem_list(items: Iterable[Mapping[str, str] | tuple[str, str]]) -> list[dict[str, str]]:
    """Normalise problematic URLs given as dicts or (url, type) pairs."""
    problems: list[dict[str, str]] = []
    for item in items:
        url, kind = (item["url"], item["type"]) if isinstance(item, Mapping) else item
        if kind not in PROBLEM_TYPES:
            raise ValueError(f"problematic URL type must be one of {PROBLEM_TYPES}, got {kind!r}")
        problems.append({"url": str(url), "type": kind})
    return problems


def _pages(records: int, per_page: int) -> int:
    """Return how many pages yield ``records`` records at ``per_page`` a page."""
    return -(-records // per_page)


def _made_up_problems(job: Job) -> list[dict[str, str]]:
    """Invent one problematic URL per counted failed, empty or no-value page."""
    start = job.start_urls[0] if job.start_urls else "https://shop.example/"
    parts = urlsplit(start)
    base = f"{parts.scheme or 'https'}://{parts.netloc or 'shop.example'}"
    counts = {"failed": job.jobs_failed, "empty": job.jobs_empty, "no_value": job.jobs_no_value}
    return [
        {"url": f"{base}/{kind.replace('_', '-')}/{i}", "type": kind}
        for kind, count in counts.items()
        for i in range(1, count + 1)
    ]
