"""Evaluation, acceptance and publication of runs, end to end: the simulator as Cloud, a real
worker loop, real databases; the verdict, the published pointer and the export must agree."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from flask import Flask
from sqlalchemy import func, select, text

from simulator import CloudState
from sync import jobs
from sync.acceptance import row_states
from sync.bootstrap import Services
from sync.datasets import export
from sync.ingest import run_rows, store, tasks
from sync.models import Launch, Observation, OutboxEvent, Publication, Run
from sync.operations import status
from sync.queue import RecordingDispatcher
from sync.runs import due, evaluation
from tests.acceptance.flow import (
    DATASETS_TOML,
    Receiver,
    exported,
    finished_job,
    product_records,
    published,
    run_id_of,
    settle,
    use_datasets,
    verdict,
    with_policy,
)
from tests.datasets.flow import current_rows
from tests.harness import notify, products_sitemap

pytestmark = pytest.mark.redis


def sync(web: Flask, services: Services, job_id: int) -> None:
    """Cloud notifies; the worker syncs, evaluates and delivers whatever follows."""
    notify(web, job_id)
    settle(services)


def states_of(services: Services, run_id: str) -> dict[str | None, dict[str, int]]:
    """How many of a run's observations are in each validation state, per partition."""
    with services.uow.begin() as session:
        state = row_states.state(session, run_id)
        rows = session.execute(
            select(Observation.partition, state, func.count())
            .where(Observation.run_id == run_id)
            .group_by(Observation.partition, state)
        ).all()
    found: dict[str | None, dict[str, int]] = {}
    for partition, state, count in rows:
        found.setdefault(partition, {})[state] = count
    return found


def events_of(services: Services) -> list[tuple[str | None, str]]:
    """Every outbox event as (run id, type), oldest first."""
    with services.uow.begin() as session:
        return [
            (e.run_id, e.event_type)
            for e in session.execute(select(OutboxEvent).order_by(OutboxEvent.id)).scalars()
        ]


def test_a_clean_job_is_accepted_published_and_announced(
    web: Flask, services: Services, cloud: CloudState, receiver: Receiver, tmp_path: Path
) -> None:
    """Sync, evaluation, publication and delivery follow from one notification."""
    job_id = finished_job(cloud, product_records(40))
    sync(web, services, job_id)
    run_id = run_id_of(job_id)
    found = verdict(services, run_id)
    assert (found.state, found.revision, found.is_published, found.reasons) == (
        "published",
        1,
        True,
        [],
    )
    assert [p["state"] for p in found.partitions] == ["passed"] * 4
    assert [e["type"] for e in found.events] == [
        "run.accepted",
        "dataset.published",
        "dataset.changed",
    ]
    assert {e["state"] for e in found.events} == {"delivered"}
    assert sorted(receiver.events.values()) == [
        "dataset.changed",
        "dataset.published",
        "run.accepted",
    ]
    assert all(r.signed for r in receiver.requests)
    assert published(services) == run_id
    assert states_of(services, run_id) == {r: {"valid": 10} for r in states_of(services, run_id)}
    records, manifest = exported(services, tmp_path)
    assert len(records) == manifest["records"] == 40
    assert (manifest["run_id"], manifest["revision"], manifest["is_published"]) == (
        run_id,
        1,
        True,
    )


@pytest.mark.slow
def test_one_retailers_garbage_prices_quarantine_it_and_reject_the_run(
    web: Flask, services: Services, cloud: CloudState, receiver: Receiver, tmp_path: Path
) -> None:
    """4,000 records, one retailer's prices unparsable: under the default policy that partition
    is quarantined, the run rejected with the numbers, and the previous run stays published and
    exported in full."""
    good = finished_job(cloud, product_records(4000))
    sync(web, services, good)
    bad = finished_job(cloud, product_records(4000, start=4000, garbage="beta.example"))
    sync(web, services, bad)
    found = verdict(services, run_id_of(bad))
    assert (found.state, found.is_published) == ("rejected", False)
    by_partition = {p["partition"]: p for p in found.partitions}
    assert {name: p["state"] for name, p in by_partition.items()} == {
        "alpha.example": "passed",
        "beta.example": "quarantined",
        "delta.example": "passed",
        "gamma.example": "passed",
    }
    (reason,) = by_partition["beta.example"]["reasons"]
    assert (reason["code"], reason["got"], reason["expected"]) == ("unparsable", 100.0, 5)
    assert "1000 of 1000 records" in reason["message"]
    assert "call for price" in reason["message"]
    assert [r["code"] for r in found.reasons] == ["partition_quarantined"]
    assert states_of(services, run_id_of(bad))["beta.example"] == {"quarantined": 1000}
    assert published(services) == run_id_of(good)
    records, manifest = exported(services, tmp_path)
    assert (len(records), manifest["run_id"]) == (4000, run_id_of(good))
    assert receiver.of_type("run.rejected")[0].body["data"]["run_id"] == run_id_of(bad)
    assert len(receiver.of_type("dataset.published")) == 1
    with pytest.raises(export.ExportError, match="rejected"):
        export.export_dataset(services, "products", run_id=run_id_of(bad), out=tmp_path)


@pytest.mark.slow
def test_publish_passing_publishes_the_clean_retailers_and_never_the_garbage(
    web: Flask, services: Services, cloud: CloudState, receiver: Receiver, tmp_path: Path
) -> None:
    """Under publish_passing the passing partitions are published; the quarantined one never
    reaches the export or the announcement."""
    services = use_datasets(services, with_policy("publish_passing"))
    sync(web, services, finished_job(cloud, product_records(4000)))
    bad = finished_job(cloud, product_records(4000, start=4000, garbage="beta.example"))
    sync(web, services, bad)
    found = verdict(services, run_id_of(bad))
    assert (found.state, found.is_published) == ("published", True)
    assert [r["code"] for r in found.reasons] == ["partition_quarantined"]
    records, manifest = exported(services, tmp_path)
    assert len(records) == manifest["records"] == 3000
    assert "beta.example" not in {r["retailer"] for r in records}
    assert not any(r["price"] == "call for price" for r in records)
    assert manifest["quarantined_partitions"] == ["beta.example"]
    announced = receiver.of_type("dataset.published")[-1].body["data"]
    assert announced["partitions"] == ["alpha.example", "delta.example", "gamma.example"]
    assert announced["records"] == 3000


def test_a_job_with_too_many_empty_pages_is_rejected_with_the_numbers(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """Cloud counted 20 empty pages of 100 (80 yielded a record each): 20% > 5%, rejected,
    nothing published."""
    job_id = finished_job(cloud, product_records(80), jobs_empty=20)
    sync(web, services, job_id)
    found = verdict(services, run_id_of(job_id))
    assert found.state == "rejected"
    empty = next(r for r in found.reasons if r["code"] == "empty_pages")
    assert (empty["got"], empty["expected"]) == (20.0, 5)
    assert empty["detail"]["pages"] == 20
    assert empty["detail"]["scheduled"] == 100
    assert len(empty["detail"]["sample_urls"]) == 3
    assert any(r["code"] == "cloud_quality" for r in found.reasons)
    assert published(services) is None
    assert events_of(services) == [(run_id_of(job_id), "run.rejected")]


@pytest.mark.parametrize("use_cloud_quality", [True, False])
def test_a_consent_page_served_with_200_everywhere_is_rejected(
    web: Flask, services: Services, cloud: CloudState, use_cloud_quality: bool
) -> None:
    """Every page a consent wall: no record has its key, so the run holds nothing; it is
    rejected even when Cloud's own check is switched off."""
    if not use_cloud_quality:
        services = use_datasets(
            services, with_policy("reject", quality="use_cloud_quality = false")
        )
    job_id = cloud.create_job(products_sitemap(cloud))
    cloud.set_records(job_id, product_records(50))
    cloud.set_page_fault(job_id, "consent")
    cloud.run_job(job_id)
    sync(web, services, job_id)
    found = verdict(services, run_id_of(job_id))
    assert found.state == "rejected"
    codes = {r["code"] for r in found.reasons}
    assert {"records_without_key", "min_records"} <= codes
    assert ("cloud_quality" in codes) is use_cloud_quality
    key = next(r for r in found.reasons if r["code"] == "records_without_key")
    assert (key["got"], key["detail"]["records"]) == (100.0, 50)
    assert published(services) is None


def test_consent_pages_that_keep_their_keys_are_caught_by_their_markers(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """A cookie wall that still yields keyed records fails its partition on the marker."""
    records = product_records(40)
    for record in records:
        if record["retailer"] == "gamma.example":
            record["title"] = "We use cookies to improve your experience"
    job_id = finished_job(cloud, records)
    sync(web, services, job_id)
    found = verdict(services, run_id_of(job_id))
    gamma = next(p for p in found.partitions if p["partition"] == "gamma.example")
    assert gamma["state"] == "quarantined"
    assert [r["code"] for r in gamma["reasons"]] == ["consent_page"]
    assert found.state == "rejected"


@pytest.mark.slow
def test_a_failed_job_is_rejected_and_a_big_drop_against_the_baseline_too(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """A job that ended 'failed' is not a collection; once three runs were accepted, a run with
    60% fewer records than their median is rejected with the count, baseline and allowance."""
    failed = finished_job(cloud, product_records(100), status="failed")
    sync(web, services, failed)
    assert [r["code"] for r in verdict(services, run_id_of(failed)).reasons] == ["job_not_finished"]
    for start in (100, 200, 300):
        sync(web, services, finished_job(cloud, product_records(100, start=start)))
    small = finished_job(cloud, product_records(40, start=400))
    sync(web, services, small)
    codes = [r["code"] for r in verdict(services, run_id_of(small)).reasons]
    assert codes[0] == "record_drop"
    drop = verdict(services, run_id_of(small)).reasons[0]
    assert (drop["got"], drop["baseline"], drop["expected"]) == (40, 100, 75)
    assert drop["detail"]["drop_percent"] == 60.0


def test_conflicting_duplicates_in_one_job_reject_the_run(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """Two records with one SKU and different prices: identity is ambiguous, rejected."""
    records = product_records(40)
    records.append({**records[0], "price": "999.00"})
    job_id = finished_job(cloud, records)
    sync(web, services, job_id)
    (reason,) = verdict(services, run_id_of(job_id)).reasons
    assert (reason["code"], reason["detail"]) == (
        "conflicting_duplicates",
        {"keys": 1, "distinct": 40},
    )


def test_two_runs_accepted_back_to_back_move_the_pointer_and_keep_history(
    web: Flask, services: Services, cloud: CloudState, tmp_path: Path
) -> None:
    """The published pointer and the export follow the later run; the earlier one stays
    readable by name, and the publications table keeps both."""
    first = finished_job(cloud, product_records(40))
    second = finished_job(cloud, product_records(44, start=40))
    sync(web, services, first)
    sync(web, services, second)
    assert published(services) == run_id_of(second)
    assert verdict(services, run_id_of(first)).is_published is False
    latest, manifest = exported(services, tmp_path / "latest")
    assert (len(latest), manifest["run_id"]) == (44, run_id_of(second))
    earlier, manifest = exported(services, tmp_path / "earlier", run_id=run_id_of(first))
    assert (len(earlier), manifest["run_id"], manifest["is_published"]) == (
        40,
        run_id_of(first),
        False,
    )
    with services.uow.begin() as session:
        history = session.execute(
            select(Publication.run_id, Publication.is_current).order_by(Publication.id)
        ).all()
    assert [tuple(h) for h in history] == [(run_id_of(first), False), (run_id_of(second), True)]


def test_evaluating_again_changes_nothing_and_announces_nothing(
    web: Flask, services: Services, cloud: CloudState, receiver: Receiver
) -> None:
    """A repeated evaluation, or a repeat sync of unchanged data, writes no new event."""
    job_id = finished_job(cloud, product_records(40))
    sync(web, services, job_id)
    before = events_of(services)
    again = evaluation.evaluate_run(services, run_id_of(job_id))
    assert (again.outcome, again.revision, again.events) == ("unchanged", 1, ())
    sync(web, services, job_id)  # Cloud notifies again; the sync finds nothing new
    assert events_of(services) == before
    assert len(receiver.requests) == 3  # accepted, published, changed (a baseline)


def test_changed_data_in_a_published_run_is_announced_as_a_new_revision(
    web: Flask, services: Services, cloud: CloudState, receiver: Receiver
) -> None:
    """Cloud's "Continue" adds records to the published run: a new revision, new event ids."""
    job_id = finished_job(cloud, product_records(40))
    sync(web, services, job_id)
    cloud.continue_job(job_id, extra_records=product_records(4, start=40))
    cloud.finish_job(job_id)
    sync(web, services, job_id)
    found = verdict(services, run_id_of(job_id))
    assert (found.state, found.revision, found.is_published) == ("published", 2, True)
    published_events = receiver.of_type("dataset.published")
    assert [e.body["data"]["revision"] for e in published_events] == [1, 2]
    assert published_events[1].body["data"]["records"] == 44
    assert len(set(receiver.events)) == 6  # accepted, published and changed, twice
    added = receiver.of_type("dataset.changed")[1].body["data"]
    assert (added["revision"], added["counts"]["added"], len(added["added"])) == (2, 4, 4)


@pytest.mark.slow
def test_a_published_run_that_turns_bad_is_withdrawn_to_the_previous_one(
    web: Flask, services: Services, cloud: CloudState, receiver: Receiver, tmp_path: Path
) -> None:
    """Garbage added to the published run rejects it: the pointer goes back to the last
    accepted run and that is announced, so nothing failed stays published."""
    first = finished_job(cloud, product_records(40))
    second = finished_job(cloud, product_records(40, start=40))
    sync(web, services, first)
    sync(web, services, second)
    garbage = product_records(40, start=80, garbage="alpha.example")
    cloud.continue_job(second, extra_records=garbage)
    cloud.finish_job(second)
    sync(web, services, second)
    assert verdict(services, run_id_of(second)).state == "rejected"
    assert published(services) == run_id_of(first)
    records, manifest = exported(services, tmp_path)
    assert (len(records), manifest["run_id"], manifest["revision"]) == (40, run_id_of(first), 2)
    last = receiver.of_type("dataset.published")[-1].body["data"]
    assert (last["run_id"], last["replacing"]) == (run_id_of(first), run_id_of(second))


def test_a_repaired_older_run_never_takes_the_pointer_back(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """An older run accepted again after a newer one was published is announced accepted, but
    the pointer stays with the newer collection."""
    first = finished_job(cloud, product_records(40))
    second = finished_job(cloud, product_records(40, start=40))
    sync(web, services, first)
    sync(web, services, second)
    cloud.continue_job(first, extra_records=product_records(4, start=80))
    cloud.finish_job(first)
    sync(web, services, first)
    assert verdict(services, run_id_of(first)).revision == 2
    assert published(services) == run_id_of(second)
    assert events_of(services)[-1] == (run_id_of(first), "run.accepted")


@pytest.mark.slow
def test_a_late_run_of_an_earlier_window_never_takes_the_pointer(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """Yesterday's job synced after today's was published: yesterday's run is accepted and
    announced, but the published dataset stays today's collection."""
    services = use_datasets(services, DATASETS_TOML.replace('window = "job"', 'window = "daily"'))
    today, yesterday = "products-2026-12-02", "products-2026-12-01"
    for run_id in (today, yesterday):
        with services.uow.begin() as session:
            run_rows.ensure_run(
                session,
                run_id=run_id,
                dataset="products",
                window=run_id.removeprefix("products-"),
                sitemap_id=None,
                sitemap_name=None,
                now=services.clock(),
            )
            session.commit()
    sitemap = products_sitemap(cloud)
    for run_id, start in ((today, 0), (yesterday, 40)):
        job_id = cloud.create_job(sitemap, custom_id=run_id)
        cloud.run_job(job_id, records=product_records(40, start=start))
        sync(web, services, job_id)
    assert verdict(services, yesterday).state == "accepted"
    assert published(services) == today
    assert events_of(services)[-1] == (yesterday, "run.accepted")


def test_a_run_waiting_for_one_of_its_jobs_stays_a_candidate(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """Two launched jobs of one run: while one is still scraping the run is a candidate that
    names the task it waits for; once it commits the run is accepted."""
    run_id = "products-2026-12-01"
    with services.uow.begin() as session:
        run_rows.ensure_run(
            session,
            run_id=run_id,
            dataset="products",
            window="2026-12-01",
            sitemap_id=None,
            sitemap_name=None,
            now=services.clock(),
        )
        session.commit()
    sitemap = products_sitemap(cloud)
    early = cloud.create_job(sitemap, custom_id="batch-a")
    late = cloud.create_job(sitemap, custom_id="batch-b")
    with services.uow.begin() as session:
        for batch, job_id in (("batch-a", early), ("batch-b", late)):
            session.add(
                Launch(batch_id=batch, run_id=run_id, kind="launch", state="created", job_id=job_id)
            )
        session.commit()
    cloud.run_job(early, records=product_records(20))
    cloud.set_records(late, product_records(20, start=20))
    cloud.start_job(late)
    sync(web, services, early)
    found = verdict(services, run_id)
    assert found.state == "candidate"
    (reason,) = found.reasons
    assert reason["code"] == "tasks_not_committed"
    assert reason["detail"]["tasks"] == {f"job-{late}": "not synced"}
    assert published(services) is None
    cloud.finish_job(late)
    sync(web, services, late)
    found = verdict(services, run_id)
    assert (found.state, found.is_published) == ("published", True)


def test_a_run_with_nothing_synced_or_a_launch_in_flight_is_not_judged(
    services: Services,
) -> None:
    """A launched run whose job is not created yet, or whose first sync has not committed, is a
    candidate that says what it waits for, never a rejection for having no records."""
    run_id = "products-2026-12-02"
    with services.uow.begin() as session:
        run_rows.ensure_run(
            session,
            run_id=run_id,
            dataset="products",
            window="2026-12-02",
            sitemap_id=None,
            sitemap_name=None,
            now=services.clock(),
        )
        session.commit()
    nothing = evaluation.evaluate_run(services, run_id)
    assert (nothing.outcome, nothing.state) == ("waiting", "candidate")
    assert nothing.reasons[0]["detail"]["tasks"] == {"first sync": "not synced"}
    with services.uow.begin() as session:
        session.add(Launch(batch_id="batch-c", run_id=run_id, kind="launch", state="creating"))
        session.commit()
    launching = evaluation.evaluate_run(services, run_id)
    assert launching.reasons[0]["detail"]["tasks"] == {"launch batch-c": "creating"}
    assert events_of(services) == []


def test_a_run_waits_for_clouds_quality_result_and_the_sweep_retries_it(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """Cloud cannot give its data-quality result: the run stays a candidate; the maintenance
    sweep evaluates it again once Cloud answers."""
    job_id = finished_job(cloud, product_records(40))
    cloud.inject_fault("status", path_contains="data-quality", times=None, status=503)
    sync(web, services, job_id)
    found = verdict(services, run_id_of(job_id))
    assert found.state == "candidate"
    assert [r["code"] for r in found.reasons] == ["cloud_quality_unavailable"]
    assert "503" in found.reasons[0]["message"]
    cloud.clear_faults()
    with services.uow.begin() as session:
        assert due.runs_due_for_evaluation(session) == [run_id_of(job_id)]
    assert jobs.maintain()["evaluations"] == 1
    settle(services)
    assert verdict(services, run_id_of(job_id)).state == "published"
    with services.uow.begin() as session:
        assert due.runs_due_for_evaluation(session) == []


def test_a_lost_evaluation_is_found_by_the_maintenance_sweep(
    services: Services, cloud: CloudState
) -> None:
    """The sync committed but its evaluation job never reached Redis: the sweep finds the run
    by its commit and evaluates it; a second sweep finds nothing."""
    job_id = finished_job(cloud, product_records(40))
    recorder = RecordingDispatcher()
    offline = replace(services, dispatcher=recorder)
    with services.uow.begin() as session:
        wish = store.want_sync(session, job_id, now=services.clock())
        session.commit()
    assert tasks.run_sync(offline, wish.task_key).outcome == "committed"
    assert [call[0] for call in recorder.calls] == ["sync.jobs.evaluate_run"]
    with services.uow.begin() as session:
        assert session.get(Run, run_id_of(job_id)).state == "collecting"  # type: ignore[union-attr]
    assert due.redrive(services) == 1
    settle(services)
    assert verdict(services, run_id_of(job_id)).state == "published"
    assert due.redrive(services) == 0


@pytest.mark.postgres
def test_concurrent_evaluations_of_one_run_announce_it_once(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """Four workers evaluate the same run at the same moment: one judges it (one revision, one
    set of events); the others leave at once, finding it under way ("busy") or judged
    ("unchanged"), and none does the work again."""
    job_id = finished_job(cloud, product_records(400))
    offline = replace(services, dispatcher=RecordingDispatcher())
    with services.uow.begin() as session:
        wish = store.want_sync(session, job_id, now=services.clock())
        session.commit()
    tasks.run_sync(offline, wish.task_key)
    barrier = threading.Barrier(4)
    outcomes: list[str] = []

    def evaluate() -> None:
        barrier.wait()
        outcomes.append(evaluation.evaluate_run(offline, run_id_of(job_id)).outcome)

    threads = [threading.Thread(target=evaluate) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcomes.count("published") == 1
    assert set(outcomes) - {"published"} <= {"busy", "unchanged"}
    assert len(outcomes) == 4
    assert verdict(services, run_id_of(job_id)).revision == 1
    assert events_of(services) == [
        (run_id_of(job_id), "run.accepted"),
        (run_id_of(job_id), "dataset.published"),
        (run_id_of(job_id), "dataset.changed"),
    ]


@pytest.mark.postgres
def test_a_sync_committing_during_an_evaluation_leaves_its_rows_pending_until_judged(
    services: Services, cloud: CloudState
) -> None:
    """A sync rewrites a partition with garbage after the evaluation read the run: its commit
    waits for the verdict, which publishes what it read and never counts the rows it did not
    read as valid; they stay pending, out of the published table, until the next evaluation
    quarantines them and withdraws the run."""
    job_id = finished_job(cloud, product_records(40))
    run_id = run_id_of(job_id)
    offline = replace(services, dispatcher=RecordingDispatcher())
    with services.uow.begin() as session:
        wish = store.want_sync(session, job_id, now=services.clock())
        session.commit()
    tasks.run_sync(offline, wish.task_key)
    between: list[threading.Thread] = []

    def rewrite() -> None:
        """What a sync's import does: rewrite rows under its attempt, count the run's data
        version up (waiting for the evaluation that holds the run) and record it, commit."""
        with services.uow.begin() as session:
            for row in session.execute(
                select(Observation).where(Observation.partition == "beta.example")
            ).scalars():
                row.payload = {**row.payload, "price": "call for price"}
                row.source_attempt_id = "attempt-in-between"
                row.shape = None
            session.flush()
            version = run_rows.count_import(session, run_id)
            run_rows.record_import(session, run_id, "attempt-in-between", version)
            session.commit()

    class SyncInBetween:
        """A sync that starts writing garbage once, between the evaluation's read and its
        write, and commits when it can."""

        def reached(self, name: str) -> None:
            if name != "mid-evaluation" or between:
                return
            between.append(threading.Thread(target=rewrite))
            between[0].start()
            _until_waiting_for_a_lock(services)

    racing = replace(offline, killpoints=SyncInBetween())  # type: ignore[arg-type]
    result = evaluation.evaluate_run(racing, run_id)
    between[0].join(timeout=30)
    assert not between[0].is_alive()
    assert result.outcome == "published"
    assert states_of(services, run_id)["beta.example"] == {"pending": 10}
    assert published(services) == run_id
    rows = current_rows(services)
    assert len(rows) == 40
    assert "call for price" not in {r["price"] for r in rows.values()}
    again = evaluation.evaluate_run(offline, run_id)
    assert again.outcome == "rejected"
    assert states_of(services, run_id)["beta.example"] == {"quarantined": 10}
    assert published(services) is None


def _until_waiting_for_a_lock(services: Services) -> None:
    """Return once another session of the database waits for a lock (at most 10 s)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with services.uow.engine.connect() as conn:
            waiting = conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
        if waiting:
            return
        time.sleep(0.02)
    raise AssertionError("the sync never waited for the evaluation")


def test_the_verdict_reads_as_plain_values_for_status(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """Status gives a rejected run's verdict as JSON-able values, each reason with its code,
    partition and figures; the rejection is announced; a run never seen is not listed."""
    job_id = finished_job(cloud, product_records(100), jobs_empty=20)
    sync(web, services, job_id)
    listed = {r["run_id"]: r for r in json.loads(json.dumps(status.overview(services)))["runs"]}
    shown = listed[run_id_of(job_id)]
    assert shown["state"] == "rejected"
    assert isinstance(shown["evaluated_at"], str)
    assert {"code", "text", "got", "allowed", "partition"} <= set(shown["reason_details"][0])
    assert verdict(services, run_id_of(job_id)).events[0]["type"] == "run.rejected"
    assert "no-such-run" not in listed
