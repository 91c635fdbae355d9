"""Cloud's facts about a finished job (its data-quality result and problematic URLs) come with the
sync that downloads the job: the evaluation after it judges with them and asks Cloud nothing;
facts that could not come in time are asked for by the evaluation, and the verdict is the same."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sqlalchemy import select

from simulator import CloudState
from sync.bootstrap import Services
from sync.ingest import cloud_facts, store, tasks
from sync.models import ScrapingJob
from sync.queue import RecordingDispatcher
from sync.runs import evaluation
from tests.acceptance.flow import (
    finished_job,
    product_records,
    run_id_of,
    use_datasets,
    verdict,
    with_policy,
)

pytestmark = pytest.mark.redis


def _sync_alone(services: Services, job_id: int) -> tasks.SyncResult:
    """The job's sync, its evaluation left undone (recorded, not queued)."""
    offline = replace(services, dispatcher=RecordingDispatcher())
    with services.uow.begin() as session:
        wish = store.want_sync(session, job_id, now=services.clock())
        session.commit()
    return tasks.run_sync(offline, wish.task_key)


def _facts_calls(cloud: CloudState) -> list[str]:
    return [path for _, path in cloud.requests if "data-quality" in path or "problematic" in path]


def _stored(services: Services, job_id: int) -> ScrapingJob:
    with services.uow.begin() as session:
        job = session.execute(select(ScrapingJob).where(ScrapingJob.job_id == job_id)).scalar_one()
        session.expunge(job)
        return job


def test_the_sync_brings_the_facts_and_the_evaluation_asks_cloud_nothing(
    services: Services, cloud: CloudState
) -> None:
    """Twenty empty pages of a hundred: the sync stores Cloud's data-quality result and the
    problematic URLs with the job; the evaluation rejects the run on them without a call."""
    job_id = finished_job(cloud, product_records(80), jobs_empty=20)
    assert _sync_alone(services, job_id).outcome == "committed"
    job = _stored(services, job_id)
    assert job.quality_checked_at == job.last_seen_at
    assert job.data_quality is not None
    assert len(job.problematic_urls or []) == 20
    assert {u["type"] for u in job.problematic_urls or []} == {"empty"}
    asked = len(_facts_calls(cloud))
    assert asked == 2  # the data-quality result and one page of problematic URLs

    found = evaluation.evaluate_run(services, run_id_of(job_id))
    assert found.state == "rejected"
    assert len(_facts_calls(cloud)) == asked
    reasons = {r["code"]: r for r in verdict(services, run_id_of(job_id)).reasons}
    assert {"empty_pages", "cloud_quality"} <= set(reasons)
    assert len(reasons["empty_pages"]["detail"]["sample_urls"]) == 3


def test_a_job_with_no_problem_page_costs_one_call_and_a_dataset_without_clouds_check_none(
    services: Services, cloud: CloudState
) -> None:
    job_id = finished_job(cloud, product_records(40))
    assert _sync_alone(services, job_id).outcome == "committed"
    assert [p.rsplit("/", 1)[-1] for p in _facts_calls(cloud)] == ["data-quality"]
    assert evaluation.evaluate_run(services, run_id_of(job_id)).state == "published"
    assert len(_facts_calls(cloud)) == 1

    services = use_datasets(services, with_policy("reject", quality="use_cloud_quality = false"))
    other = finished_job(cloud, product_records(40, start=100))
    assert _sync_alone(services, other).outcome == "committed"
    job = _stored(services, other)
    assert (job.data_quality, job.problematic_urls) == (None, [])
    assert job.quality_checked_at == job.last_seen_at
    assert len(_facts_calls(cloud)) == 1


def test_facts_that_fail_during_the_sync_are_asked_for_by_the_evaluation(
    services: Services, cloud: CloudState
) -> None:
    """Cloud answers 503 to every data-quality request while the job syncs: the sync commits
    all the same, and the evaluation, once Cloud answers again, asks and publishes."""
    job_id = finished_job(cloud, product_records(40))
    cloud.inject_fault("status", path_contains="data-quality", times=None, status=503)
    result = _sync_alone(services, job_id)
    assert (result.outcome, result.records_read) == ("committed", 40)
    job = _stored(services, job_id)
    assert (job.quality_checked_at, job.data_quality) == (None, None)

    cloud.clear_faults()
    asked = len(_facts_calls(cloud))
    assert evaluation.evaluate_run(services, run_id_of(job_id)).state == "published"
    assert len(_facts_calls(cloud)) == asked + 1
    job = _stored(services, job_id)
    assert job.quality_checked_at == job.last_seen_at
    assert job.data_quality is not None


def test_facts_still_on_their_way_are_left_to_the_evaluation(
    services: Services, cloud: CloudState, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cloud takes longer to give the data-quality result than the sync waits for it once its
    import is ready: the sync commits without it, the evaluation asks and judges."""
    monkeypatch.setattr(cloud_facts, "FACTS_WAIT", 0.05)
    job_id = finished_job(cloud, product_records(40))
    cloud.inject_fault("slow", path_contains="data-quality", times=1, seconds=1.0)
    assert _sync_alone(services, job_id).outcome == "committed"
    assert _stored(services, job_id).quality_checked_at is None

    assert evaluation.evaluate_run(services, run_id_of(job_id)).state == "published"
    job = _stored(services, job_id)
    assert job.quality_checked_at == job.last_seen_at
    assert job.data_quality is not None


def test_a_later_sync_of_the_job_brings_its_facts_again(
    services: Services, cloud: CloudState
) -> None:
    """Cloud's "Continue" of a job that had empty pages: the second sync stores the facts of the
    job as it is now, stamped with that sync."""
    job_id = finished_job(cloud, product_records(80), jobs_empty=20)
    assert _sync_alone(services, job_id).outcome == "committed"
    first = _stored(services, job_id)
    cloud.continue_job(job_id)
    cloud.run_job(job_id, records=product_records(100))
    assert _sync_alone(services, job_id).outcome == "committed"
    again = _stored(services, job_id)
    assert again.last_seen_at > first.last_seen_at
    assert again.quality_checked_at == again.last_seen_at
    assert again.problematic_urls == []
