"""The exact end state a drill expects once the faults stop: every Cloud job it made synced, one
observation per record key per run and no observation key twice, every run decided and the
newest accepted one published, no attempt left running nor committed twice for one wish, every
outbox event delivered and received under its own id with a valid signature."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sync.db import UnitOfWork
from sync.models import Attempt, Observation, OutboxEvent, Run, SyncTask
from sync.runs.publication import published_run_id, window_order
from sync.states import AttemptOutcome, DeliveryState, RunState, TaskState

DECIDED = (RunState.ACCEPTED, RunState.PUBLISHED, RunState.REJECTED)
ACCEPTED = (RunState.ACCEPTED, RunState.PUBLISHED)


@dataclass
class EndState:
    """What a check found: the misses (none when the end state holds) and the counts."""

    misses: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def holds(self) -> bool:
        """Whether nothing was missed."""
        return not self.misses


def _sample(items: list[str], limit: int = 5) -> str:
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def _tasks(session: Session, jobs: Mapping[int, int], found: EndState) -> None:
    states = dict(session.execute(select(SyncTask.task_key, SyncTask.state)).tuples().all())
    unsettled = [
        f"job-{job} ({states.get(f'job-{job}', 'no task')})"
        for job in sorted(jobs)
        if states.get(f"job-{job}") != TaskState.COMMITTED
    ]
    found.counts["tasks_committed"] = len(jobs) - len(unsettled)
    if unsettled:
        found.misses.append(
            f"{len(unsettled)} of {len(jobs)} tasks not committed: {_sample(unsettled)}"
        )
    running = session.execute(
        select(func.count()).where(Attempt.outcome == AttemptOutcome.RUNNING)
    ).scalar_one()
    twice = session.execute(
        select(Attempt.task_key, Attempt.generation)
        .where(Attempt.outcome == AttemptOutcome.COMMITTED)
        .group_by(Attempt.task_key, Attempt.generation)
        .having(func.count() > 1)
    ).all()
    found.counts["attempts"] = session.execute(select(func.count(Attempt.attempt_id))).scalar_one()
    if running:
        found.misses.append(f"{running} attempts still running")
    if twice:
        found.misses.append(f"{len(twice)} wishes committed twice: {twice[:5]}")


def _observations(session: Session, jobs: Mapping[int, int], dataset: str, found: EndState) -> None:
    per_run = {
        run_id: (rows, entities)
        for run_id, rows, entities in session.execute(
            select(
                Observation.run_id,
                func.count(),
                func.count(func.distinct(Observation.entity_key)),
            ).group_by(Observation.run_id)
        ).tuples()
    }
    wrong = [
        f"{run_id} ({per_run.get(run_id, (0, 0))[0]} rows of {n})"
        for run_id, n in ((f"{dataset}-job-{job}", n) for job, n in sorted(jobs.items()))
        if per_run.get(run_id) != (n, n)
    ]
    expected = {f"{dataset}-job-{job}" for job in jobs}
    strangers = sorted(set(per_run) - expected)
    duplicated = session.execute(
        select(func.count()).select_from(
            select(Observation.observation_key)
            .group_by(Observation.observation_key)
            .having(func.count() > 1)
            .subquery()
        )
    ).scalar_one()
    found.counts["observations"] = sum(rows for rows, _ in per_run.values())
    found.counts["duplicate_observation_keys"] = duplicated
    if wrong:
        found.misses.append(
            f"{len(wrong)} runs without one observation per record: {_sample(wrong)}"
        )
    if strangers:
        found.misses.append(f"observations of runs no job made: {_sample(strangers)}")
    if duplicated:
        found.misses.append(f"{duplicated} observation keys stored twice")


def _runs(session: Session, jobs: Mapping[int, int], dataset: str, found: EndState) -> None:
    states = dict(session.execute(select(Run.run_id, Run.state)).tuples().all())
    runs = [f"{dataset}-job-{job}" for job in sorted(jobs)]
    open_runs = [f"{r} ({states.get(r, 'missing')})" for r in runs if states.get(r) not in DECIDED]
    tally = Counter(states.get(r) for r in runs)
    found.counts["runs_accepted"] = tally[RunState.ACCEPTED] + tally[RunState.PUBLISHED]
    found.counts["runs_rejected"] = tally[RunState.REJECTED]
    if open_runs:
        found.misses.append(f"{len(open_runs)} runs not decided: {_sample(open_runs)}")
    accepted = [r for r in runs if states.get(r) in ACCEPTED]
    newest = max(accepted, key=lambda r: window_order(r.removeprefix(f"{dataset}-")), default=None)
    published = published_run_id(session, dataset)
    if published != newest:
        found.misses.append(f"the published run is {published}, the newest accepted {newest}")


def _outbox(session: Session, received: Counter[str], bad: int, found: EndState) -> None:
    events = dict(session.execute(select(OutboxEvent.event_id, OutboxEvent.state)).tuples().all())
    undelivered = [f"{e} ({s})" for e, s in events.items() if s != DeliveryState.DELIVERED]
    missing = sorted(set(events) - set(received))
    strangers = sorted(set(received) - set(events))
    found.counts["events"] = len(events)
    found.counts["events_received"] = len(set(events) & set(received))
    found.counts["events_sent_again"] = sum(n - 1 for e, n in received.items() if e in events)
    if undelivered:
        found.misses.append(
            f"{len(undelivered)} outbox events not delivered: {_sample(undelivered)}"
        )
    if missing:
        found.misses.append(f"{len(missing)} events never received: {_sample(missing)}")
    if strangers:
        found.misses.append(f"events received that the outbox never held: {_sample(strangers)}")
    if bad:
        found.misses.append(f"{bad} announcements with a wrong signature")


def check(
    uow: UnitOfWork,
    jobs: Mapping[int, int],
    *,
    dataset: str,
    received: Counter[str] | None = None,
    bad_signatures: int = 0,
) -> EndState:
    """Compare the database (and the receiver's tally, when a destination is configured) with
    the Cloud jobs a drill made (job id -> records)."""
    found = EndState()
    with uow.begin() as session:
        _tasks(session, jobs, found)
        _observations(session, jobs, dataset, found)
        _runs(session, jobs, dataset, found)
        if received is not None:
            _outbox(session, received, bad_signatures, found)
    return found
