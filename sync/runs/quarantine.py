"""Runs no evaluation settles by itself: one whose evaluation failed every time it was tried is
``quarantined`` with the error class as its reason, and one an operator cancelled stays
``cancelled``. Neither is judged again unless an operator decides (``accept``, ``reject``);
new data for it is recorded as judged, so the sweep stops asking, and never turns it into an
accepted run by accident.

An evaluation that raises counts one failure on its run (a database that went away does not:
that is not the run's fault, and the next sweep tries again); a finished evaluation clears the
count. ``EVALUATION_TRIES`` failures in a row quarantine the run.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.exc import DBAPIError, OperationalError

from sync import logs
from sync.bootstrap import Services
from sync.models import Run
from sync.states import RunState

log = logs.get("runs")

EVALUATION_TRIES = 5
HELD = (RunState.QUARANTINED, RunState.CANCELLED)


@dataclass(frozen=True)
class Held:
    """A run that is not judged again by itself: its state, revision and reasons."""

    state: str
    revision: int
    reasons: tuple[dict[str, object], ...]


def held(services: Services, run_id: str) -> Held | None:
    """The run, if it is quarantined with no operator decision or cancelled; its data as it
    stands is recorded as judged, so the sweep stops queueing it."""
    with services.uow.begin() as session:
        run = session.get(Run, run_id)
        if run is None or run.state not in HELD:
            return None
        if run.state == RunState.QUARANTINED and run.decision is not None:
            return None  # an operator decided: the evaluation applies it
        if run.evaluated_version != run.data_version:
            run.evaluated_version = run.data_version
            session.commit()
        return Held(run.state, run.revision, tuple(run.reasons or []))


def counts_against_the_run(exc: BaseException) -> bool:
    """Whether a failure of an evaluation is the run's: not a database that went away or
    refused for a while (a lock timeout, a serialization failure)."""
    if isinstance(exc, OperationalError):
        return False
    return not (isinstance(exc, DBAPIError) and exc.connection_invalidated)


def record_failure(services: Services, run_id: str, exc: BaseException) -> Held | None:
    """Count one failed evaluation of the run; the run, quarantined, once it has failed
    ``EVALUATION_TRIES`` times in a row (else None)."""
    error_class = type(exc).__name__
    now = services.clock()
    with services.uow.begin() as session:
        run = session.get(Run, run_id)
        if run is None:
            return None
        run.evaluation_failures = (run.evaluation_failures or 0) + 1
        tries = run.evaluation_failures
        quarantined = tries >= EVALUATION_TRIES and run.state != RunState.CANCELLED
        if quarantined and run.state == RunState.QUARANTINED:
            # still failing after an operator's decision: stays as it is, and the sweep stops
            run.evaluated_version = run.data_version
        elif quarantined:
            run.state = RunState.QUARANTINED
            run.reasons = [
                {
                    "code": "evaluation_failed",
                    "message": f"its evaluation failed {tries} times in a row ({error_class}); "
                    "it is not judged again by itself: see what broke, then accept, reject "
                    "or cancel it",
                    "got": tries,
                    "expected": f"< {EVALUATION_TRIES}",
                    "partition": None,
                    "detail": {"error_class": error_class, "tries": tries},
                }
            ]
            run.evaluated_at = now
            run.evaluated_version = run.data_version
            run.revision += 1
        session.commit()
        found = Held(run.state, run.revision, tuple(run.reasons or []))
    log.warning(
        "evaluation.failed",
        extra={
            "run_id": run_id,
            "error_class": error_class,
            "tries": tries,
            "quarantined": quarantined,
        },
    )
    return found if quarantined else None
