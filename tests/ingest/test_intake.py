"""Notification intake: stored and acknowledged at once, repeats coalesced, bad input refused."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
from flask import Flask
from sqlalchemy import select, text

from simulator import CloudState
from sync import bootstrap
from sync.bootstrap import Services
from sync.ingest.store import count_rows
from sync.models import Notification, SyncTask
from sync.queue import RQDispatcher, sync_job_id
from tests.harness import WEBHOOK_TOKEN, notify
from webhooks import create_app

URL = f"/webhooks/webscraper/{WEBHOOK_TOKEN}"


def _tasks(services: Services) -> list[SimpleNamespace]:
    with services.uow.begin() as session:
        rows = session.execute(select(SyncTask.__table__)).mappings().all()
        return [SimpleNamespace(**row) for row in rows]


def test_a_notification_is_stored_and_its_sync_queued(web: Flask, services: Services) -> None:
    """One notification: an inbox row, a pending task, an RQ job with a deterministic id."""
    response = notify(web, 1001)
    assert response.status_code == 200
    assert response.json == {"ok": True, "task_key": "job-1001", "state": "pending"}
    (task,) = _tasks(services)
    assert (task.task_key, task.state, task.requested_generation) == ("job-1001", "pending", 1)
    with services.uow.begin() as session:
        (row,) = session.execute(select(Notification)).scalars()
        assert row.form["scrapingjob_id"] == "1001"
        assert row.job_id == 1001
    dispatcher = services.dispatcher
    assert isinstance(dispatcher, RQDispatcher)
    assert dispatcher.queue.job_ids == [sync_job_id("job-1001", 1, 0)]


def test_repeated_notifications_coalesce_into_one_pending_sync(
    web: Flask, services: Services
) -> None:
    """Cloud's repeats while a sync is pending keep one task, one generation, one queued job."""
    for _ in range(5):
        assert notify(web, 1001).status_code == 200
    (task,) = _tasks(services)
    assert task.requested_generation == 1
    assert isinstance(services.dispatcher, RQDispatcher)
    assert services.dispatcher.queue.count == 1
    with services.uow.begin() as session:
        assert count_rows(session, Notification) == 5


@pytest.mark.postgres
def test_a_repeat_of_a_pending_sync_is_stored_without_rewriting_its_task(
    web: Flask, services: Services
) -> None:
    """Repeats that find the sync already pending are each kept in the inbox, and leave the task
    row as it was: no new row version, so repeats of one job never wait on each other's lock."""
    assert notify(web, 1001).status_code == 200

    def version() -> tuple[str, object]:
        with services.uow.begin() as session:
            row = session.execute(
                text("SELECT xmin::text, updated_at FROM sync_tasks WHERE task_key = 'job-1001'")
            ).one()
            return row[0], row[1]

    before = version()
    for _ in range(3):
        response = notify(web, 1001)
        assert response.status_code == 200
        assert response.json == {"ok": True, "task_key": "job-1001", "state": "pending"}
    assert version() == before
    with services.uow.begin() as session:
        outcomes = session.execute(select(Notification.outcome)).scalars().all()
    assert outcomes == ["task pending (generation 1)"] * 4
    assert isinstance(services.dispatcher, RQDispatcher)
    assert services.dispatcher.queue.job_ids == [sync_job_id("job-1001", 1, 0)]


def test_json_and_multipart_bodies_are_accepted(web: Flask, services: Services) -> None:
    """The same fields as JSON or multipart make the same task."""
    client = web.test_client()
    assert client.post(URL, json={"scrapingjob_id": 7, "status": "finished"}).status_code == 200
    multipart = client.post(
        URL, data={"scrapingjob_id": "8", "status": "finished"}, content_type="multipart/form-data"
    )
    assert multipart.status_code == 200
    assert sorted(t.task_key for t in _tasks(services)) == ["job-7", "job-8"]


def test_a_wrong_token_is_not_found_and_stores_nothing(web: Flask, services: Services) -> None:
    """Only the configured token opens the door; a guess stores no row."""
    response = web.test_client().post(
        "/webhooks/webscraper/guess", data={"scrapingjob_id": "1", "status": "finished"}
    )
    assert response.status_code == 404
    with services.uow.begin() as session:
        assert count_rows(session, Notification) == 0
        assert count_rows(session, SyncTask) == 0


@pytest.mark.parametrize(
    ("kwargs", "status"),
    [
        ({"data": {"status": "finished"}}, 400),
        ({"data": {"scrapingjob_id": "12abc", "status": "finished"}}, 400),
        ({"data": "scrapingjob_id=1", "content_type": "text/plain"}, 415),
        ({"json": ["not", "an", "object"]}, 415),
        ({"data": {"scrapingjob_id": "1", "pad": "x" * 70_000}}, 413),
    ],
    ids=["missing-id", "non-numeric-id", "unknown-content-type", "json-array", "oversize"],
)
def test_bad_input_gets_a_short_json_4xx_and_no_task(
    web: Flask, services: Services, kwargs: dict[str, object], status: int
) -> None:
    """Malformed notifications are refused with a JSON error, never a 500, and make no task."""
    response = web.test_client().post(URL, **kwargs)  # type: ignore[arg-type]
    assert response.status_code == status
    assert response.is_json
    assert "error" in response.json
    with services.uow.begin() as session:
        assert count_rows(session, SyncTask) == 0


def test_a_notification_with_a_bad_job_id_is_kept_in_the_inbox(
    web: Flask, services: Services
) -> None:
    """A malformed notification is kept as evidence, with the reason it was refused."""
    web.test_client().post(URL, data={"scrapingjob_id": "abc", "status": "finished"})
    with services.uow.begin() as session:
        (row,) = session.execute(select(Notification)).scalars()
        assert row.outcome.startswith("rejected")
        assert row.form["scrapingjob_id"] == "abc"


def test_wrong_method_is_refused_with_json(web: Flask) -> None:
    """A GET on the notification URL is 405 with a JSON body."""
    response = web.test_client().get(URL)
    assert response.status_code == 405
    assert response.is_json


def test_redis_down_still_acknowledges_and_keeps_the_task_pending(
    services: Services,
) -> None:
    """With Redis unreachable the answer is still 200; the task waits in SQL for the sweeper."""
    # The dispatcher is wired as a deployed process wires it, from a REDIS_URL nothing answers.
    unreachable = dataclasses.replace(services.settings, redis_url="redis://127.0.0.1:1/0")
    dispatcher = bootstrap.build(unreachable, datasets=services.datasets).dispatcher
    broken = dataclasses.replace(services, dispatcher=dispatcher)
    response = notify(create_app(broken), 1001)
    assert response.status_code == 200
    (task,) = _tasks(services)
    assert task.state == "pending"


def test_database_down_answers_503_so_cloud_retries(services: Services) -> None:
    """With the database unreachable the answer is 503, which Cloud treats as a failure."""
    from sync.db import UnitOfWork, make_engine

    dead = UnitOfWork(
        make_engine(
            "postgresql+psycopg://postgres@127.0.0.1:1/test", connect_args={"connect_timeout": 1}
        )
    )
    broken = dataclasses.replace(services, uow=dead)
    response = notify(create_app(broken), 1001)
    assert response.status_code == 503
    assert response.json["detail"] == "database unavailable"


def test_healthz_reports_database_and_redis(web: Flask) -> None:
    """The health check says both stores answer."""
    response = web.test_client().get("/healthz")
    assert response.status_code == 200
    assert response.json["checks"] == {"database": "ok", "redis": "ok"}


def test_the_web_process_refuses_to_start_without_a_webhook_token(services: Services) -> None:
    """A missing WEBHOOK_TOKEN is a start-up error that names the variable."""
    from config.settings import ConfigError

    no_token = dataclasses.replace(
        services, settings=dataclasses.replace(services.settings, webhook_token=None)
    )
    with pytest.raises(ConfigError, match="WEBHOOK_TOKEN"):
        create_app(no_token)


def test_simulated_cloud_notifications_reach_the_intake(web: Flask, services: Services) -> None:
    """The simulator's notifier, posting a form like Cloud, makes a pending task."""
    import httpx

    cloud = CloudState(
        notify_url=f"http://web.test{URL}", notify_transport=httpx.WSGITransport(app=web)
    )
    try:
        job_id = cloud.create_job(cloud.add_sitemap("products"))
        cloud.run_job(job_id, n=3)
        assert cloud.wait_for_notifications(timeout=5)
    finally:
        cloud.close()
    (task,) = _tasks(services)
    assert task.task_key == f"job-{job_id}"


def test_an_unexpected_error_answers_500_and_never_logs_the_token(
    web: Flask,
    services: Services,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A bug behind the intake gives Cloud a short JSON 500 (it will retry), and the error's
    log line shows the path with the token replaced."""
    from sync.ingest import store

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(store, "want_sync", broken)
    monkeypatch.setattr(store, "accept_notification", broken)
    with caplog.at_level("ERROR"):
        response = notify(web, 1001)
    assert response.status_code == 500
    assert response.json["error"] == "Internal Server Error"
    assert "a bug" in caplog.text
    assert "/webhooks/webscraper/*** [POST]" in caplog.text
    assert WEBHOOK_TOKEN not in caplog.text
