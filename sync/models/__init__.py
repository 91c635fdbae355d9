"""The system of record: the tables of a sync's work (:mod:`sync.models.work`) and of what
leaves it (:mod:`sync.models.outputs`), on one declarative base (:mod:`sync.models.base`)."""

from sync.models.base import (
    NAMING,
    Base,
    Payload,
    ScrubbedPayload,
    ScrubbedText,
    UTCDateTime,
    utcnow,
)
from sync.models.outputs import (
    Alert,
    AlertCondition,
    DatasetColumn,
    Delivery,
    DestinationState,
    OutboxEvent,
    Publication,
)
from sync.models.work import (
    Attempt,
    Launch,
    MaintenanceRun,
    Notification,
    Observation,
    OperatorDecision,
    PartitionVerdict,
    Run,
    RunProfile,
    ScrapingJob,
    SetAsideRecord,
    SyncTask,
)

__all__ = [
    "NAMING",
    "Alert",
    "AlertCondition",
    "Attempt",
    "Base",
    "DatasetColumn",
    "Delivery",
    "DestinationState",
    "Launch",
    "MaintenanceRun",
    "Notification",
    "Observation",
    "OperatorDecision",
    "OutboxEvent",
    "PartitionVerdict",
    "Payload",
    "Publication",
    "Run",
    "RunProfile",
    "ScrapingJob",
    "ScrubbedPayload",
    "ScrubbedText",
    "SetAsideRecord",
    "SyncTask",
    "UTCDateTime",
    "utcnow",
]
