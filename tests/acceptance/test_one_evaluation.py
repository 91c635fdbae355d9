"""One evaluation per change: at most one evaluation of a run at a time, and no evaluation of a
run that nothing changed since its verdict."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
import redis
from flask import Flask
from sqlalchemy import text

from simulator import CloudState
from sync.bootstrap import Services
from sync.models import Run
from sync.queue import RecordingDispatcher, RQDispatcher
from sync.runs import due, evaluation, evidence
from tests.acceptance.flow import finished_job, product_records, run_id_of, sync_offline, verdict
from tests.harness import DrainWorker, drain, notify


def _synced_offline(services: Services, cloud: CloudState) -> str:
    """A new job synced with nothing queued after it; its run, not yet evaluated."""
    job_id = finished_job(cloud, product_records(40))
    sync_offline(services, job_id)
    return run_id_of(job_id)


@pytest.mark.postgres
def test_an_evaluation_that_finds_another_under_way_leaves_at_once_and_writes_nothing(
    services: Services, cloud: CloudState
) -> None:
    """While another process evaluates the run (holds its evaluation lock), a second evaluation
    answers ``busy`` without reading or writing anything; once it is free the run is judged."""
    run_id = _synced_offline(services, cloud)
    offline = replace(services, dispatcher=RecordingDispatcher())
    with services.uow.engine.connect() as other:
        other.execute(
            text("SELECT pg_advisory_xact_lock(:space, hashtext(:run))"),
            {"space": evaluation._LOCK_SPACE, "run": run_id},
        )
        busy = evaluation.evaluate_run(offline, run_id)
        assert (busy.outcome, busy.events) == ("busy", ())
        with services.uow.begin() as session:
            run = session.get(Run, run_id)
            assert run is not None
            assert (run.state, run.evaluated_at, run.revision) == ("collecting", None, 0)
        other.rollback()
    judged = evaluation.evaluate_run(offline, run_id)
    assert judged.outcome == "published"
    assert evaluation.evaluate_run(offline, run_id).outcome == "unchanged"


def _evaluation_jobs(services: Services) -> list[str]:
    """The evaluation jobs waiting on the queue."""
    dispatcher = services.dispatcher
    assert isinstance(dispatcher, RQDispatcher)
    return [j for j in dispatcher.queue.job_ids if j.startswith("evaluate-")]


@pytest.mark.redis
def test_a_sync_and_a_sweep_ask_for_one_evaluation_and_a_judged_run_is_not_asked_again(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """The evaluation a committed sync queues and the one the sweep queues for the same change
    are one job; once it ran, sweeps queue nothing until the run's data changes again (Cloud's
    "Continue"), and then exactly one more."""
    job_id = finished_job(cloud, product_records(40))
    notify(web, job_id)
    dispatcher = services.dispatcher
    assert isinstance(dispatcher, RQDispatcher)
    worker = DrainWorker(
        [dispatcher.queue], connection=dispatcher.redis, serializer=dispatcher.queue.serializer
    )
    worker.work(burst=True, max_jobs=1)  # the sync only: it queues its evaluation
    assert len(_evaluation_jobs(services)) == 1
    assert due.redrive(services) == 0  # the same change: the waiting job serves
    assert len(_evaluation_jobs(services)) == 1
    drain(services)
    assert verdict(services, run_id_of(job_id)).state == "published"
    for _ in range(3):
        assert due.redrive(services) == 0
    assert _evaluation_jobs(services) == []

    cloud.continue_job(job_id, extra_records=product_records(5, start=900))
    cloud.run_job(job_id)
    notify(web, job_id)
    worker.work(burst=True, max_jobs=1)
    assert len(_evaluation_jobs(services)) == 1
    assert due.redrive(services) == 0
    drain(services)
    judged = verdict(services, run_id_of(job_id))
    assert (judged.state, judged.revision) == ("published", 2)
    assert due.redrive(services) == 0


def test_an_evaluation_of_a_run_judged_as_it_stands_reads_nothing_unless_forced(
    services: Services, cloud: CloudState, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asked again with nothing new, an evaluation answers from the stored verdict without
    reading the run's observations; the operator's forced re-judgement reads them."""
    run_id = _synced_offline(services, cloud)
    offline = replace(services, dispatcher=RecordingDispatcher())
    assert evaluation.evaluate_run(offline, run_id).outcome == "published"
    tallies: list[str] = []
    real = evidence.tally
    monkeypatch.setattr(
        evidence, "tally", lambda s, r, d, **kw: tallies.append(r) or real(s, r, d, **kw)
    )
    again = evaluation.evaluate_run(offline, run_id)
    assert (again.outcome, again.state, tallies) == ("unchanged", "published", [])
    forced = evaluation.evaluate_run(offline, run_id, force=True)
    assert (forced.outcome, tallies) == ("unchanged", [run_id])


class _RedisGone(RecordingDispatcher):
    """A dispatcher whose Redis went away after the verdict was committed."""

    def delivery(self, event_id: str, **kwargs: object) -> bool | None:
        raise redis.exceptions.ConnectionError("Connection refused")


def test_a_committed_verdict_is_logged_even_when_announcing_it_then_fails(
    services: Services, cloud: CloudState, caplog: pytest.LogCaptureFixture
) -> None:
    """The ``run.evaluated`` line is written once the verdict is committed, before its events are
    queued on Redis: when Redis fails there, the log still shows the judgement the run holds (and
    the evaluation after it finds the run unchanged)."""
    run_id = _synced_offline(services, cloud)
    caplog.set_level(logging.INFO)
    scrapesync = logging.getLogger("scrapesync")
    scrapesync.addHandler(caplog.handler)  # it may not propagate once logs.configure() ran
    try:
        with pytest.raises(redis.exceptions.ConnectionError):
            evaluation.evaluate_run(replace(services, dispatcher=_RedisGone()), run_id)
    finally:
        scrapesync.removeHandler(caplog.handler)
    judged = [r for r in caplog.records if r.getMessage() == "run.evaluated"]
    assert [(r.run_id, r.outcome) for r in judged] == [(run_id, "published")]  # type: ignore[attr-defined]
    assert verdict(services, run_id).state == "published"
    again = evaluation.evaluate_run(replace(services, dispatcher=RecordingDispatcher()), run_id)
    assert again.outcome == "unchanged"
