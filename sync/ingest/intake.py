"""Wanting a sync and queueing it: the one use case behind Cloud's notifications, the reconcile
pass and ``scrapesync sync``.

The wish is committed before its RQ job is queued, so a lost job (or Redis away) loses nothing:
the task row is durable and the sweeper queues it. A notification is stored with its wish in ONE
transaction; on PostgreSQL that is one statement on an autocommit connection, one round trip.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sync.bootstrap import Services
from sync.ingest import store
from sync.ingest.store import Wish


@dataclass(frozen=True)
class Intake:
    """A wanted sync, and whether this call queued it; a notification also says whether it
    created the task or coalesced into a sync already pending."""

    wish: Wish
    queued: bool
    created: bool = False
    coalesced: bool = False


def accept_notification(
    services: Services,
    *,
    form: dict[str, Any],
    remote_addr: str | None,
    job_id: int,
    now: datetime,
) -> Intake:
    """Store Cloud's notification and want its job's sync in one transaction, commit, then
    queue the sync; a database failure raises with nothing stored, a queue failure is logged."""
    status = form.get("status")
    created = coalesced = False
    if services.uow.dialect == "postgresql":
        # One statement on an autocommit connection: one round trip, one transaction.
        with services.uow.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            accepted = store.accept_notification(
                conn, form=form, remote_addr=remote_addr, job_id=job_id, status=status, now=now
            )
        wish, created, coalesced = accepted.wish, accepted.created, accepted.coalesced
    else:
        with services.uow.begin() as session:
            wish = store.want_sync(session, job_id, now=now)
            store.record_notification(
                session,
                form=form,
                remote_addr=remote_addr,
                job_id=job_id,
                status=status,
                outcome=f"task {wish.state} (generation {wish.requested_generation})",
                now=now,
            )
            session.commit()
    services.killpoints.reached("intake-after-commit")
    # A repeat that coalesced into a pending sync changed nothing: whoever made the task pending
    # queued it (or the sweeper will), so Redis is not asked again.
    queued = not coalesced and _queue(services, wish, now, "notification.enqueue_failed")
    return Intake(wish, queued, created=created, coalesced=coalesced)


def want_sync(
    services: Services,
    job_id: int,
    *,
    queue: bool = True,
    failure_event: str = "sync.enqueue_failed",
) -> Intake:
    """Want a sync of Cloud job ``job_id`` and commit it, then queue it (unless ``queue`` is
    false: the caller runs it in the foreground)."""
    now = services.clock()
    with services.uow.begin() as session:
        wish = store.want_sync(session, job_id, now=now)
        session.commit()
    return Intake(wish, queue and _queue(services, wish, now, failure_event))


def _queue(services: Services, wish: Wish, now: datetime, failure_event: str) -> bool:
    """Queue the wished sync if it can be claimed (at its retry time, if that is later)."""
    if wish.state not in store.CLAIMABLE:
        return False
    queued = services.dispatcher.sync(
        wish.task_key,
        generation=wish.requested_generation,
        attempts=wish.attempt_count,
        at=wish.next_attempt_at if wish.next_attempt_at > now else None,
        failure_event=failure_event,
    )
    return bool(queued)
