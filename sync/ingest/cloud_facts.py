"""Cloud's facts about a finished scraping job that a verdict reads: its data-quality result and its
problematic URLs (the pages Cloud found empty, failed or without a value).

A sync asks Cloud for them beside its download (:class:`FactsAhead`) and stores them with the
import it commits, so that the evaluation that follows finds them and waits for no round trip to
Cloud; the evaluation asks for those of any finished job whose sync did not bring them (the
request failed, or was still waiting when the import was ready to commit). Either way they are
stamped with the ``last_seen_at`` of the sync that saw the job as it was: a later sync of the job
makes them stale again.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime
from itertools import islice
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from config.datasets import Dataset
from sync import logs
from sync.bootstrap import Services
from sync.cloud.client import CloudClient
from sync.cloud.jobs import CloudJob
from sync.models import ScrapingJob

log = logs.get("ingest")

PROBLEMATIC_URL_LIMIT = 500  # kept per job: enough to show and to rerun what failed
# How long a sync whose import is ready waits for facts still on their way: a request that
# takes longer is left to the evaluation, which asks again.
FACTS_WAIT = 5.0


@dataclass(frozen=True)
class Facts:
    """One job's data-quality result (None when the dataset does not use Cloud's) and its
    problematic URLs (none asked for when Cloud counted no problem page)."""

    quality: dict[str, Any] | None
    urls: list[dict[str, str]] = field(default_factory=list)


def fetch(cloud: CloudClient, dataset: Dataset, job_id: int, *, problems: int) -> Facts:
    """Ask Cloud for a finished job's facts (raises CloudError)."""
    quality = cloud.get_data_quality(job_id) if dataset.quality.use_cloud_quality else None
    urls = (
        [
            {"url": u.url, "type": u.type}
            for u in islice(cloud.iter_problematic_urls(job_id), PROBLEMATIC_URL_LIMIT)
        ]
        if problems
        else []
    )
    return Facts(quality, urls)


def store(session: Session, job_id: int, facts: Facts, *, seen_at: datetime | None = None) -> None:
    """Keep a job's facts, stamped with the sync that saw the job: the one that last did, as
    ``seen_at`` (as stored) tells, unless a later sync has seen it since (its facts are then to
    be asked for again); without ``seen_at``, the sync whose transaction just stamped it."""
    job = ScrapingJob.__table__.c
    matches = job.job_id == job_id
    if seen_at is not None:
        matches &= job.last_seen_at == seen_at
    session.execute(
        update(ScrapingJob)
        .where(matches)
        .values(
            data_quality=facts.quality,
            problematic_urls=facts.urls,
            quality_checked_at=job.last_seen_at,
        )
        .execution_options(synchronize_session=False)
    )


def problems_of(job: CloudJob) -> int:
    """The pages Cloud counted as failed, empty or without a value."""
    return job.jobs_failed + job.jobs_empty + job.jobs_no_value


class FactsAhead:
    """A finished job's facts, asked for by a thread of their own (with a Cloud client of its
    own, under the account's shared budget) while the sync downloads the job's data."""

    def __init__(self, services: Services, dataset: Dataset, job: CloudJob) -> None:
        self.job_id = job.id
        self._facts: Facts | None = None
        self._failure = ""  # what kept them, for the log (an error's class, never its text)
        self._done = threading.Event()
        ask = threading.Thread(
            target=self._ask,
            args=(services, dataset, problems_of(job)),
            name="cloud-facts",
            daemon=True,
        )
        ask.start()

    @classmethod
    def start(cls, services: Services, dataset: Dataset, job: CloudJob) -> FactsAhead | None:
        """Begin asking, for a finished job (the only kind an evaluation asks about)."""
        return cls(services, dataset, job) if job.status == "finished" else None

    def _ask(self, services: Services, dataset: Dataset, problems: int) -> None:
        try:
            with services.cloud() as cloud:
                self._facts = fetch(cloud, dataset, self.job_id, problems=problems)
        except Exception as exc:  # whatever it was, the evaluation asks again
            self._failure = type(exc).__name__
        finally:
            self._done.set()

    def wait(self) -> None:
        """Give facts still on their way up to FACTS_WAIT seconds more, once the import is
        ready (and before its transaction takes the run's row, which evaluations wait for)."""
        self._done.wait(FACTS_WAIT)

    def store(self, session: Session) -> bool:
        """Keep the facts, if they came, with the import being committed (whose transaction
        stamped the job's row): whether they were kept."""
        if not self._done.is_set() or self._facts is None:
            log.info(
                "sync.cloud_facts_left_to_evaluation",
                extra={"job_id": self.job_id, "reason": self._failure or "still waiting"},
            )
            return False
        store(session, self.job_id, self._facts)
        return True
