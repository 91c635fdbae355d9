"""Notifications, attempts and delivered outbox events are kept for their settings' days; 0
days keeps them all; each task's latest attempt and every undelivered event stay."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sync.bootstrap import Services
from sync.models import Attempt, Delivery, Notification, OutboxEvent
from sync.operations import maintenance, retention
from tests.operations.conftest import NOW

pytestmark = pytest.mark.redis

OLD = NOW - timedelta(days=120)
RECENT = NOW - timedelta(days=5)


def _days(services: Services, **days: float) -> Services:
    settings = dataclasses.replace(services.settings, **days)
    return dataclasses.replace(services, settings=settings)


def _notifications(services: Services, *moments: object) -> None:
    with services.uow.begin() as session:
        for moment in moments:
            session.add(Notification(received_at=moment, form={"scrapingjob_id": "1"}))
        session.commit()


def _ids(services: Services, column: object) -> list[object]:
    with services.uow.begin() as session:
        return sorted(session.execute(select(column)).scalars())  # type: ignore[call-overload]


def test_notifications_older_than_their_days_go(kept: Services) -> None:
    """Notifications received before the 90 days go; later ones stay."""
    _notifications(kept, OLD, OLD, NOW - timedelta(days=89), RECENT)
    assert retention.prune_notifications(kept) == 2
    with kept.uow.begin() as session:
        left = list(session.execute(select(Notification.received_at)).scalars())
    assert sorted(left) == [NOW - timedelta(days=89), RECENT]


def _attempt(task_key: str, n: int, started: object) -> Attempt:
    return Attempt(
        attempt_id=f"{task_key}-{n}",
        task_key=task_key,
        job_id=1,
        generation=1,
        lease_token=n,
        worker="w",
        started_at=started,
    )


def test_old_attempts_go_but_each_tasks_latest_stays(kept: Services) -> None:
    """Of a task tried long ago only its last attempt is kept; a task tried recently keeps its
    recent attempts and loses only the old ones; two attempts started at the same moment keep
    one."""
    with kept.uow.begin() as session:
        session.add_all(
            [
                _attempt("job-1", 1, OLD - timedelta(days=3)),
                _attempt("job-1", 2, OLD - timedelta(days=2)),
                _attempt("job-1", 3, OLD),
                _attempt("job-2", 1, OLD),
                _attempt("job-2", 2, RECENT),
                _attempt("job-2", 3, NOW),
                _attempt("job-3", 1, OLD),
                _attempt("job-3", 2, OLD),
            ]
        )
        session.commit()
    assert retention.prune_attempts(kept) == 4
    assert _ids(kept, Attempt.attempt_id) == ["job-1-3", "job-2-2", "job-2-3", "job-3-2"]


def _event(
    session: Session, event_id: str, state: str, delivered: object, destinations: int
) -> None:
    session.add(
        OutboxEvent(
            event_id=event_id,
            run_id="products-2026-08-01",
            dataset="products",
            event_type="dataset.published",
            payload={},
            state=state,
            delivered_at=delivered,
        )
    )
    session.flush()  # the event before its deliveries (the foreign key)
    session.add_all(
        Delivery(event_id=event_id, destination=f"https://d{n}.example/", state=state)
        for n in range(destinations)
    )
    session.flush()


def test_delivered_events_go_with_their_deliveries_and_undelivered_ones_stay(
    kept: Services,
) -> None:
    """An event delivered before the 30 days goes with its deliveries; one delivered since,
    and an old one that failed or was never sent, stay with theirs."""
    with kept.uow.begin() as session:
        _event(session, "evt-old", "delivered", OLD, 2)
        _event(session, "evt-old-local", "delivered", OLD, 0)
        _event(session, "evt-recent", "delivered", RECENT, 2)
        _event(session, "evt-failed", "failed", None, 1)
        _event(session, "evt-dead", "dead", None, 1)
        _event(session, "evt-unsent", "unsent", None, 1)
        session.commit()
    assert retention.prune_outbox(kept) == {"outbox_pruned": 2, "deliveries_pruned": 2}
    assert _ids(kept, OutboxEvent.event_id) == [
        "evt-dead",
        "evt-failed",
        "evt-recent",
        "evt-unsent",
    ]
    assert _ids(kept, Delivery.event_id) == [
        "evt-dead",
        "evt-failed",
        "evt-recent",
        "evt-recent",
        "evt-unsent",
    ]


def test_zero_days_keeps_everything(kept: Services) -> None:
    """With every setting at 0 nothing is deleted, however old."""
    forever = _days(
        kept, notifications_retention_days=0, attempts_retention_days=0, outbox_retention_days=0
    )
    _notifications(forever, OLD)
    with forever.uow.begin() as session:
        session.add_all([_attempt("job-1", 1, OLD), _attempt("job-1", 2, OLD + timedelta(1))])
        _event(session, "evt-old", "delivered", OLD, 1)
        session.commit()
    report = maintenance.run_pass(forever)
    assert report.failed == []
    assert {k: v for k, v in report.counts.items() if k.endswith("_pruned")} == {
        "observations_pruned": 0,
        "notifications_pruned": 0,
        "attempts_pruned": 0,
        "outbox_pruned": 0,
        "deliveries_pruned": 0,
    }
    with forever.uow.begin() as session:
        for model in (Notification, Attempt, OutboxEvent, Delivery):
            assert session.execute(select(func.count()).select_from(model)).scalar_one() > 0


def test_one_pass_deletes_at_most_its_batches_from_each_table(kept: Services) -> None:
    """With batches of 3 rows and 2 batches a pass, no table loses more than 6 rows in one pass,
    and the next passes go on until what is old is gone."""
    limits = retention.Limits(batch_size=3, batches=2)
    _notifications(kept, *[OLD - timedelta(minutes=n) for n in range(10)])
    with kept.uow.begin() as session:
        session.add_all([_attempt("job-1", n, OLD + timedelta(minutes=n)) for n in range(9)])
        for n in range(4):
            _event(session, f"evt-{n}", "delivered", OLD, 2)
        session.commit()
    passes = [
        (
            retention.prune_notifications(kept, limits),
            retention.prune_attempts(kept, limits),
            retention.prune_outbox(kept, limits),
        )
        for _ in range(3)
    ]
    assert passes == [
        (6, 6, {"outbox_pruned": 3, "deliveries_pruned": 6}),
        (4, 2, {"outbox_pruned": 1, "deliveries_pruned": 2}),
        (0, 0, {"outbox_pruned": 0, "deliveries_pruned": 0}),
    ]
    assert _ids(kept, Attempt.attempt_id) == ["job-1-8"]
