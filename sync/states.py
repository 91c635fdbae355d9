"""The values of every state column, one ``StrEnum`` per state machine.

Members are ``str``: they compare equal to the stored text, bind as plain strings and
serialise unchanged, so the values users read in the database and the status API stay as
they were. Name a state through its member so a typo is an ``AttributeError``, not a row
that no query ever finds.
"""

from __future__ import annotations

from enum import StrEnum


class TaskState(StrEnum):
    """``sync_tasks.state``: one job's journey from wanted to settled."""

    PENDING = "pending"
    LEASED = "leased"
    RETRY_WAIT = "retry_wait"
    COMMITTED = "committed"
    QUARANTINED = "quarantined"
    DEAD = "dead"
    GONE = "gone"
    IGNORED = "ignored"  # the job's sitemap feeds no dataset of the datasets file


class AttemptOutcome(StrEnum):
    """``attempts.outcome``: how one try ended; a failed try records the task state it left."""

    RUNNING = "running"
    COMMITTED = "committed"
    UNCHANGED = "unchanged"
    STALE = "stale"
    ABANDONED = "abandoned"
    RETRY_WAIT = "retry_wait"
    QUARANTINED = "quarantined"
    DEAD = "dead"
    GONE = "gone"
    IGNORED = "ignored"


class RunState(StrEnum):
    """``runs.state``: a run collects, becomes a candidate, and is judged."""

    COLLECTING = "collecting"
    CANDIDATE = "candidate"
    ACCEPTED = "accepted"
    PUBLISHED = "published"
    REJECTED = "rejected"
    # its evaluation failed every time it was tried: never judged again by itself
    QUARANTINED = "quarantined"
    # an operator stopped waiting for it
    CANCELLED = "cancelled"


class Decision(StrEnum):
    """``runs.decision`` and ``operator_decisions.action``: what an operator decided."""

    ACCEPT = "accept"
    REJECT = "reject"
    CANCEL = "cancel"
    BASELINE_RESET = "baseline_reset"


class PartitionState(StrEnum):
    """``partition_verdicts.state``: one partition's verdict within a run's evaluation."""

    PASSED = "passed"
    QUARANTINED = "quarantined"


class ValidationState(StrEnum):
    """``observations.validation_state``: whether a staged row may be exported."""

    PENDING = "pending"
    VALID = "valid"
    QUARANTINED = "quarantined"


class DeliveryState(StrEnum):
    """``deliveries.state`` and ``outbox.state``: an event's delivery to its destinations."""

    UNSENT = "unsent"
    SENDING = "sending"
    DELIVERED = "delivered"
    FAILED = "failed"
    DEAD = "dead"


# An outbox event's state is summarised from its deliveries' states: one vocabulary.
OutboxState = DeliveryState


class LaunchState(StrEnum):
    """``launches.state``: the intent to create a Cloud job, then what became of it."""

    INTENDED = "intended"
    CREATING = "creating"
    UNCERTAIN = "uncertain"
    CREATED = "created"
    FAILED = "failed"


class LaunchKind(StrEnum):
    """``launches.kind``: a collection scrapesync started, or a rerun under an existing run."""

    LAUNCH = "launch"
    RERUN = "rerun"


class PassKind(StrEnum):
    """``maintenance_runs.kind``: which periodic pass a row records."""

    MAINTENANCE = "maintenance"
    SWEEP = "sweep"
    RECONCILE = "reconcile"


class EventType(StrEnum):
    """``outbox.event_type``: what an outbox event announces."""

    RUN_ACCEPTED = "run.accepted"
    RUN_REJECTED = "run.rejected"
    DATASET_PUBLISHED = "dataset.published"
    DATASET_WITHDRAWN = "dataset.withdrawn"
    DATASET_CHANGED = "dataset.changed"
    RUN_CANCELLED = "run.cancelled"
    DATASET_BASELINE_RESET = "dataset.baseline_reset"


class EvaluationOutcome(StrEnum):
    """What an evaluation did when it wrote no new verdict (otherwise: the run's new state)."""

    UNCHANGED = "unchanged"
    WAITING = "waiting"
    BUSY = "busy"
    UNKNOWN = "unknown"
    UNCONFIGURED = "unconfigured"
    QUARANTINED = "quarantined"


class ClaimOutcome(StrEnum):
    """A sync that made no attempt: the task was not due or not found."""

    NOT_CLAIMED = "not_claimed"
    UNKNOWN = "unknown"
