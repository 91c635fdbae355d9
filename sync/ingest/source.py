"""What every observation of one sync carries besides the record's own values, and the columns
in which a sync stages and writes its records (shared by the stager and its write strategies)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

# in the order of RecordIdentity's values and the line's digest, the payload left out when keys
# go first
STAGED_COLUMNS = (
    "ord, observation_key, entity_key, partition, start_url, payload, payload_hash, line_digest"
)
KEY_COLUMNS = "ord, observation_key, entity_key, partition, start_url, payload_hash, line_digest"
# every column a sync writes, in the order of each statement that inserts an observation
WRITTEN_COLUMNS = (
    "observation_key, dataset, entity_key, run_id, collection_window, partition, start_url, "
    "payload, payload_hash, line_digest, source_job_id, source_attempt_id, first_seen_at, "
    "last_changed_at"
)


@dataclass(frozen=True)
class Source:
    """What every observation of one sync carries besides the record's own values (``now``:
    when rows copied straight in were first seen; a merge is stamped with its own time)."""

    dataset: str
    run_id: str
    window: str
    job_id: int
    attempt_id: str
    now: datetime

    @property
    def stored_now(self) -> datetime:
        """``now`` as observations store it: naive UTC."""
        return self.now.astimezone(UTC).replace(tzinfo=None)
