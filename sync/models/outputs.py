"""What leaves the system of record: publications and the typed columns they fill, the outbox,
its deliveries and their destinations, and alerts to people."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from sync.models.base import Base, ScrubbedPayload, ScrubbedText, utcnow
from sync.states import (
    DeliveryState,
    OutboxState,
)


class Publication(Base):
    """The published-dataset pointer and its history: one current row per dataset."""

    __tablename__ = "publications"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    dataset: Mapped[str] = mapped_column(String(100))
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.run_id"))
    is_current: Mapped[bool] = mapped_column(Boolean, default=True)
    published_at: Mapped[datetime] = mapped_column(default=utcnow)
    superseded_at: Mapped[datetime | None]
    event_id: Mapped[str | None] = mapped_column(String(100))
    # what this publication changed for readers: {"added", "removed", "changed": counts,
    # "baseline": the dataset's first publication, "previous_run_id"}
    changes: Mapped[dict[str, Any] | None]

    __table_args__ = (
        Index(
            "uq_publications_current",
            "dataset",
            unique=True,
            postgresql_where=text("is_current"),
            sqlite_where=text("is_current"),
        ),
    )


class DatasetColumn(Base):
    """One typed column of a dataset's tables as they stand: its source field and type, so that
    an upgrade knows what to add, drop or rebuild when the datasets file changes."""

    __tablename__ = "dataset_columns"

    dataset: Mapped[str] = mapped_column(String(100), primary_key=True)
    column_name: Mapped[str] = mapped_column(String(63), primary_key=True)
    field: Mapped[str] = mapped_column(Text)
    type: Mapped[str] = mapped_column(String(20))
    decimal: Mapped[str] = mapped_column(String(1))
    position: Mapped[int] = mapped_column(Integer)


class OutboxEvent(Base):
    """An announcement written in the same transaction as the change it announces."""

    __tablename__ = "outbox"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    event_id: Mapped[str] = mapped_column(String(100), unique=True)
    run_id: Mapped[str | None] = mapped_column(String(200), index=True)
    dataset: Mapped[str | None] = mapped_column(String(100))
    event_type: Mapped[str] = mapped_column(String(50))
    payload: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    state: Mapped[str] = mapped_column(String(20), default=OutboxState.UNSENT, index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(default=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column(index=True)  # retention
    last_error: Mapped[str | None] = mapped_column(ScrubbedText)
    # the event's place in the pull feed, given once it is committed, in commit order
    feed_position: Mapped[int | None] = mapped_column(BigInteger, unique=True)


class Delivery(Base):
    """One outbox event on its way to one destination."""

    __tablename__ = "deliveries"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    event_id: Mapped[str] = mapped_column(ForeignKey("outbox.event_id"))
    destination: Mapped[str] = mapped_column(String(500))
    state: Mapped[str] = mapped_column(String(20), default=DeliveryState.UNSENT)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(default=utcnow)
    lease_until: Mapped[datetime | None]
    delivered_at: Mapped[datetime | None]
    last_status: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(ScrubbedText)
    last_attempt_at: Mapped[datetime | None]

    __table_args__ = (
        UniqueConstraint("event_id", "destination"),
        # the relay's "oldest waiting delivery of this destination" (deliveries queue up)
        Index("ix_deliveries_destination_state", "destination", "state", "id"),
    )


class DestinationState(Base):
    """What the relay knows of one destination: since when it keeps failing, and whether it is
    disabled (it answered 410 Gone) until an operator enables it again."""

    __tablename__ = "destination_states"

    destination: Mapped[str] = mapped_column(String(500), primary_key=True)
    failing_since: Mapped[datetime | None]
    disabled_at: Mapped[datetime | None]
    disabled_reason: Mapped[str | None] = mapped_column(ScrubbedText)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class AlertCondition(Base):
    """What the alert channels were last told about one reason of one dataset ('' for the
    account): whether it is firing, since when, and when its last message was written."""

    __tablename__ = "alert_conditions"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    dataset: Mapped[str] = mapped_column(String(100))
    reason: Mapped[str] = mapped_column(String(40))
    firing: Mapped[bool] = mapped_column(Boolean, default=False)
    announced: Mapped[bool] = mapped_column(Boolean, default=False)
    since: Mapped[datetime | None]
    last_alerted_at: Mapped[datetime | None]
    messages: Mapped[int] = mapped_column(Integer, default=0)
    subject: Mapped[str | None] = mapped_column(String(200))
    # the last message it had to say (sent later if the alert interval held it back)
    notice: Mapped[dict[str, Any] | None] = mapped_column(ScrubbedPayload)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (UniqueConstraint("dataset", "reason"),)


class Alert(Base):
    """One message to one alert channel, written in the transaction of the state it reports
    and sent by :mod:`sync.alerts.sender` (``unsent -> sending -> delivered``, or ``failed``
    and retried, or ``dead``)."""

    __tablename__ = "alerts"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    alert_id: Mapped[str] = mapped_column(String(100), unique=True)
    channel: Mapped[str] = mapped_column(String(500))
    dataset: Mapped[str | None] = mapped_column(String(100))
    reason: Mapped[str] = mapped_column(String(40))
    status: Mapped[str] = mapped_column(String(20))
    subject: Mapped[str | None] = mapped_column(String(200))
    text: Mapped[str] = mapped_column(ScrubbedText)
    details: Mapped[dict[str, Any]] = mapped_column(ScrubbedPayload, default=dict)
    command: Mapped[str] = mapped_column(String(300))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    state: Mapped[str] = mapped_column(String(20), default=DeliveryState.UNSENT, index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(default=utcnow)
    lease_until: Mapped[datetime | None]
    sent_at: Mapped[datetime | None]
    last_error: Mapped[str | None] = mapped_column(ScrubbedText)
