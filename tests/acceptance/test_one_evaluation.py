"""One evaluation per change: at most one evaluation of a run at a time, and no evaluation of a
run that nothing changed since its verdict."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sqlalchemy import text

from simulator import CloudState
from sync.bootstrap import Services
from sync.ingest import store, tasks
from sync.models import Run
from sync.queue import RecordingDispatcher
from sync.runs import evaluation
from tests.acceptance.flow import finished_job, product_records, run_id_of


def _synced_offline(services: Services, cloud: CloudState) -> str:
    """A new job synced with nothing queued after it; its run, not yet evaluated."""
    offline = replace(services, dispatcher=RecordingDispatcher())
    job_id = finished_job(cloud, product_records(40))
    with services.uow.begin() as session:
        wish = store.want_sync(session, job_id, now=services.clock())
        session.commit()
    assert tasks.run_sync(offline, wish.task_key).outcome == "committed"
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
