"""``GET /metrics``: scrapesync's figures in the Prometheus text format, behind the status token.

Every figure that lives in SQL (notifications, attempts, tasks, leases, the outbox, runs, the
last reconcile and maintenance passes) is read from SQL when Prometheus scrapes, by a custom
collector, never counted in the process: any web process answers the same numbers, and a
restart loses none. The collector reads them through :func:`sync.operations.status.figures`,
as the status report does, so the two never disagree. The API budget comes from the budget
every process shares (Redis). An age of something that never happened is ``+Inf``, so "older
than" alerts fire on it too.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from flask import Blueprint, Response, current_app
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from sqlalchemy.exc import SQLAlchemyError

from sync import logs
from sync.bootstrap import Services
from sync.operations import status
from sync.states import AttemptOutcome
from webhooks import refusals, services_of
from webhooks.status import _private, _refusal

bp = Blueprint("metrics", __name__)
log = logs.get("metrics")
NEVER = float("inf")


def _age(now: datetime, moment: datetime | None, *, none: float) -> float:
    return none if moment is None else max(0.0, (now - moment).total_seconds())


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
                shown: status.Figures | None = status.figures(session, self.services.clock())
        except SQLAlchemyError:
            log.warning("metrics.database_unreachable", exc_info=True)
            shown = None
        up.add_metric([], 1.0 if shown is not None else 0.0)
        yield up
        if shown is not None:
            yield from _activity(shown)
            yield from _backlog(shown)
            yield from _passes(shown)
        yield from self._budget()
        yield from refusals.metrics(self.services)

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


def _activity(shown: status.Figures) -> Iterator[Metric]:
    """Notifications received, attempts by outcome, and tasks by state."""
    received = CounterMetricFamily(
        "scrapesync_notifications_received", "Finished-job notifications stored from Cloud"
    )
    received.add_metric([], float(shown.notifications))
    yield received
    # A running attempt still changes outcome, so it is a gauge; ended ones only add up.
    outcomes = dict(shown.attempts_by_outcome)
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
    for state, count in shown.tasks_by_state.items():
        tasks.add_metric([state], float(count))
    yield tasks


def _backlog(shown: status.Figures) -> Iterator[Metric]:
    """The oldest lease, the outbox backlog and its oldest event, and runs by state."""
    yield GaugeMetricFamily(
        "scrapesync_oldest_lease_age_seconds",
        "Age of the oldest lease a worker holds on a sync task (0: none held)",
        value=_age(shown.now, shown.oldest_lease_at, none=0.0),
    )
    yield GaugeMetricFamily(
        "scrapesync_destinations_disabled",
        "Destinations disabled by a 410 Gone until `scrapesync deliveries enable`",
        value=float(shown.destinations_disabled),
    )
    yield GaugeMetricFamily(
        "scrapesync_destinations_failing",
        "Destinations whose latest delivery attempt failed (their retry window is running)",
        value=float(shown.destinations_failing),
    )
    yield GaugeMetricFamily(
        "scrapesync_outbox_backlog",
        "Outbox events not yet delivered to every destination",
        value=float(shown.outbox_backlog),
    )
    yield GaugeMetricFamily(
        "scrapesync_outbox_oldest_undelivered_age_seconds",
        "Age of the oldest undelivered outbox event (0: none waiting)",
        value=_age(shown.now, shown.oldest_undelivered_at, none=0.0),
    )
    runs = GaugeMetricFamily("scrapesync_runs", "Runs by state", labels=["state"])
    for state, count in shown.runs_by_state.items():
        runs.add_metric([state], float(count))
    yield runs


def _passes(shown: status.Figures) -> Iterator[Metric]:
    """How long ago the last reconcile and maintenance passes ran."""
    reconciled = shown.last_reconcile.started_at if shown.last_reconcile is not None else None
    yield GaugeMetricFamily(
        "scrapesync_last_reconcile_age_seconds",
        "Seconds since the last reconcile pass started (+Inf: never)",
        value=_age(shown.now, reconciled, none=NEVER),
    )
    yield GaugeMetricFamily(
        "scrapesync_last_maintenance_age_seconds",
        "Seconds since the worker's last maintenance pass completed (+Inf: never)",
        value=_age(shown.now, shown.last_maintenance_at, none=NEVER),
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
