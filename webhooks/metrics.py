"""``GET /metrics``: scrapesync's figures in the Prometheus text format, behind the status token.

Every figure that lives in SQL (notifications, attempts, tasks, leases, the outbox, runs, the
last reconcile and maintenance passes) is read from SQL when Prometheus scrapes, by a custom
collector, never counted in the process: any web process answers the same numbers, and a
restart loses none. The API budget comes from the budget every process shares (Redis). An age
of something that never happened is ``+Inf``, so "older than" alerts fire on it too.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from flask import Blueprint, Response, current_app
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from sync import logs
from sync.bootstrap import Services
from sync.models import (
    Attempt,
    MaintenanceRun,
    Notification,
    OutboxEvent,
    Run,
    SyncTask,
)
from sync.operations import heartbeat
from sync.operations.status import RUN_STATES, TASK_STATES
from sync.states import AttemptOutcome, OutboxState, TaskState
from webhooks import services_of
from webhooks.status import _private, _refusal

bp = Blueprint("metrics", __name__)
log = logs.get("metrics")
NEVER = float("inf")


def _age(now: datetime, moment: datetime | None, *, none: float) -> float:
    return none if moment is None else max(0.0, (now - moment).total_seconds())


def _grouped(session: Session, column: Any) -> dict[str, int]:
    return {
        str(key): int(count)
        for key, count in session.execute(select(column, func.count()).group_by(column))
    }


class ScrapesyncCollector:
    """Reads scrapesync's figures from SQL (and the shared API budget) at every scrape."""

    def __init__(self, services: Services) -> None:
        self.services = services

    def collect(self) -> Iterator[Metric]:
        """The metric families of one scrape."""
        up = GaugeMetricFamily(
            "scrapesync_database_up", "1 when the database answered this scrape, else 0"
        )
        try:
            with self.services.uow.begin() as session:
                families = list(self._from_sql(session, self.services.clock()))
        except SQLAlchemyError:
            log.warning("metrics.database_unreachable", exc_info=True)
            families = []
        up.add_metric([], 1.0 if families else 0.0)
        yield up
        yield from families
        yield from self._budget()

    def _from_sql(self, session: Session, now: datetime) -> Iterator[Metric]:
        notifications = session.execute(select(func.count()).select_from(Notification))
        received = CounterMetricFamily(
            "scrapesync_notifications_received", "Finished-job notifications stored from Cloud"
        )
        received.add_metric([], float(notifications.scalar_one()))
        yield received

        # A running attempt still changes outcome, so it is a gauge; ended ones only add up.
        outcomes = _grouped(session, Attempt.outcome)
        running = outcomes.pop(AttemptOutcome.RUNNING, 0)
        attempts = CounterMetricFamily(
            "scrapesync_attempts", "Ended sync attempts by outcome", labels=["outcome"]
        )
        for outcome, count in sorted(outcomes.items()):
            attempts.add_metric([outcome], float(count))
        yield attempts
        yield GaugeMetricFamily(
            "scrapesync_attempts_running",
            "Sync attempts under way (or whose worker died before ending them)",
            value=float(running),
        )

        tasks = GaugeMetricFamily("scrapesync_tasks", "Sync tasks by state", labels=["state"])
        by_state = dict.fromkeys(TASK_STATES, 0) | _grouped(session, SyncTask.state)
        for state, count in by_state.items():
            tasks.add_metric([state], float(count))
        yield tasks

        oldest_lease = session.execute(
            select(func.min(Attempt.started_at))
            .select_from(Attempt)
            .join(
                SyncTask,
                (SyncTask.task_key == Attempt.task_key)
                & (SyncTask.lease_token == Attempt.lease_token),
            )
            .where(SyncTask.state == TaskState.LEASED, Attempt.outcome == AttemptOutcome.RUNNING)
        ).scalar_one()
        yield GaugeMetricFamily(
            "scrapesync_oldest_lease_age_seconds",
            "Age of the oldest lease a worker holds on a sync task (0: none held)",
            value=_age(now, oldest_lease, none=0.0),
        )

        backlog = session.execute(
            select(func.count(), func.min(OutboxEvent.created_at)).where(
                OutboxEvent.state != OutboxState.DELIVERED
            )
        ).one()
        yield GaugeMetricFamily(
            "scrapesync_outbox_backlog",
            "Outbox events not yet delivered to every destination",
            value=float(backlog[0]),
        )
        yield GaugeMetricFamily(
            "scrapesync_outbox_oldest_undelivered_age_seconds",
            "Age of the oldest undelivered outbox event (0: none waiting)",
            value=_age(now, backlog[1], none=0.0),
        )

        runs = GaugeMetricFamily("scrapesync_runs", "Runs by state", labels=["state"])
        for state, count in (dict.fromkeys(RUN_STATES, 0) | _grouped(session, Run.state)).items():
            runs.add_metric([state], float(count))
        yield runs

        last_reconcile = session.execute(
            select(func.max(MaintenanceRun.started_at)).where(MaintenanceRun.kind == "reconcile")
        ).scalar_one()
        yield GaugeMetricFamily(
            "scrapesync_last_reconcile_age_seconds",
            "Seconds since the last reconcile pass started (+Inf: never)",
            value=_age(now, last_reconcile, none=NEVER),
        )
        yield GaugeMetricFamily(
            "scrapesync_last_maintenance_age_seconds",
            "Seconds since the worker's last maintenance pass completed (+Inf: never)",
            value=_age(now, heartbeat.last(session), none=NEVER),
        )

    def _budget(self) -> Iterator[Metric]:
        settings = self.services.settings
        yield GaugeMetricFamily(
            "scrapesync_api_budget_limit",
            "Cloud API calls allowed per window, shared by every process",
            value=float(settings.api_budget_limit),
        )
        if self.services.budget is None:
            return
        try:
            remaining = self.services.budget.remaining()
        except Exception:  # Redis away: the SQL figures still matter most
            log.warning("metrics.budget_unreadable", exc_info=True)
            return
        yield GaugeMetricFamily(
            "scrapesync_api_budget_remaining",
            "Cloud API calls left in the current window, shared by every process",
            value=float(remaining),
        )


def registry_for(services: Services) -> CollectorRegistry:
    """A registry holding only scrapesync's collector (nothing is read until a scrape)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ScrapesyncCollector(services))
    return registry


@bp.get("/metrics")
def metrics() -> Any:
    """scrapesync's figures for Prometheus (needs the status token)."""
    refusal = _refusal()
    if refusal is not None:
        return refusal
    body = generate_latest(registry_for(services_of(current_app)))
    return _private(Response(body, content_type=CONTENT_TYPE_LATEST))
