"""What Cloud says about a scraping job: the job itself and its problematic pages."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

TERMINAL_STATUSES: Final = frozenset({"finished", "failed", "stopped", "shelved"})
RUNNING_STATUSES: Final = frozenset(
    {"waiting-to-be-scheduled", "scheduling", "scheduled", "started", "waiting"}
)
MAX_COUNTER: Final = 2**63 - 1  # the widest integer column
MAX_TIMESTAMP: Final = 253402300799  # 9999-12-31T23:59:59Z, the last second a datetime holds


def as_int(value: Any, default: int = 0) -> int:
    """A number Cloud sent as an int, a float or a string, else ``default``."""
    if value is None or value == "":
        return default
    if isinstance(value, int):
        return value
    try:
        return int(float(value))
    except (TypeError, ValueError, OverflowError):
        return default


@dataclass(frozen=True)
class CloudJob:
    """One Cloud scraping job as Cloud reports it now."""

    id: int
    sitemap_id: int
    sitemap_name: str
    status: str
    custom_id: str | None
    time_created: int | None
    jobs_scheduled: int
    jobs_executed: int
    jobs_failed: int
    jobs_empty: int
    jobs_no_value: int
    stored_record_count: int
    scraping_duration: int
    problems: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def from_api(cls, data: Mapping[str, Any]) -> CloudJob:
        """Build a scraping job from Cloud's job object; an empty custom_id becomes None. A
        counter outside 0..2**63-1 or a time_created that is no date is kept out (0, None) and
        named in ``problems``."""
        problems: list[str] = []

        def counter(name: str) -> int:
            value = as_int(data.get(name))
            if not 0 <= value <= MAX_COUNTER:
                problems.append(f"{name} = {value} is out of range")
                return 0
            return value

        custom_id = data.get("custom_id")
        raw_created = data.get("time_created")
        time_created = None if raw_created in (None, "") else as_int(raw_created)
        if time_created is not None and not 0 <= time_created <= MAX_TIMESTAMP:
            problems.append(f"time_created = {raw_created!r} is not a date")
            time_created = None
        return cls(
            id=as_int(data.get("id")),
            sitemap_id=as_int(data.get("sitemap_id")),
            sitemap_name=str(data.get("sitemap_name") or ""),
            status=str(data.get("status") or ""),
            custom_id=str(custom_id) if custom_id not in (None, "") else None,
            time_created=time_created,
            jobs_scheduled=counter("jobs_scheduled"),
            jobs_executed=counter("jobs_executed"),
            jobs_failed=counter("jobs_failed"),
            jobs_empty=counter("jobs_empty"),
            jobs_no_value=counter("jobs_no_value"),
            stored_record_count=counter("stored_record_count"),
            scraping_duration=counter("scraping_duration"),
            problems=tuple(problems),
        )

    @property
    def is_terminal(self) -> bool:
        """Cloud has stopped working on the job: finished, failed, stopped or shelved."""
        return self.status in TERMINAL_STATUSES

    @property
    def is_running(self) -> bool:
        """The job is queued or scraping; its data is not final yet."""
        return self.status in RUNNING_STATUSES


@dataclass(frozen=True)
class ProblematicUrl:
    """A page of a scraping job that came back empty, failed or without values."""

    url: str
    type: str
