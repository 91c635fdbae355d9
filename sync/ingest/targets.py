"""Where a scraping job's records go: the dataset, run and collection window it feeds."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from config.datasets import Dataset
from sync.bootstrap import Services
from sync.cloud.jobs import CloudJob
from sync.ingest.failures import NoDatasetError
from sync.models import Launch, Run
from sync.states import LaunchKind


@dataclass(frozen=True)
class Target:
    """Where a scraping job's records go: dataset, run and collection window."""

    dataset: Dataset
    run_id: str
    window: str
    recovery_batch: str | None
    frozen_partitions: frozenset[str] = frozenset()


def resolve_target(services: Services, job: CloudJob) -> Target:
    """Map a scraping job to its run: custom_id names a launch or a run; otherwise the dataset
    whose sitemap matches, with the window from the job's creation time."""
    with services.uow.begin() as session:
        if job.custom_id:
            launch = session.get(Launch, job.custom_id)
            run_id = launch.run_id if launch is not None else job.custom_id
            run = session.get(Run, run_id)
            if run is not None and _feeds(services, run.dataset, job):
                rerun = launch is not None and launch.kind == LaunchKind.RERUN
                recovery = launch if rerun else None
                frozen = (recovery.manifest or {}).get("partitions", {}) if recovery else {}
                return Target(
                    dataset=services.datasets.get(run.dataset),
                    run_id=run.run_id,
                    window=run.collection_window,
                    recovery_batch=recovery.batch_id if recovery is not None else None,
                    frozen_partitions=frozenset(frozen),
                )
    dataset = services.datasets.for_sitemap(job.sitemap_id, job.sitemap_name)
    if dataset is None:
        raise NoDatasetError(
            f"scraping job {job.id}: sitemap {job.sitemap_name!r} (id {job.sitemap_id}) feeds no "
            "dataset in the datasets file"
        )
    created = (
        datetime.fromtimestamp(job.time_created, UTC)
        if job.time_created is not None
        else services.clock()
    )
    window = dataset.window_for(created, job.id)
    return Target(dataset, dataset.run_id_for(window), window, None)


def _feeds(services: Services, dataset: str, job: CloudJob) -> bool:
    """Whether the job's sitemap is the one the dataset is collected with: a custom_id alone
    never links a job from another sitemap to a dataset's run."""
    if dataset not in services.datasets.by_name:
        return False
    return services.datasets.get(dataset).matches_sitemap(job.sitemap_id, job.sitemap_name)
