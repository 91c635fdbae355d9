"""The datasets file: what each dataset scrapes, how its records are identified and judged."""

from __future__ import annotations

import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from config.alerts import (
    DEFAULT_ALERT_INTERVAL,
    AlertChannel,
    AlertsConfigError,
    parse_channels,
    parse_duration,
    parse_stale_after,
)
from config.columns import (
    DEFAULT_MAX_CHANGES_PER_EVENT,
    MAX_DATASET_NAME,
    Column,
    ColumnsError,
    Watch,
    parse_columns,
    parse_positive,
    parse_watch,
)

WINDOWS = ("daily", "weekly", "job")
POLICIES = ("reject", "publish_passing")
PARSERS = ("number", "integer", "url", "nonempty")
DATASET_KEYS = frozenset(
    {
        "sitemap",
        "sitemap_id",
        "entity_key",
        "window",
        "partition",
        "required",
        "url_fields",
        "policy",
        "quality",
        "destinations",
        "columns",
        "watch",
        "retain_windows",
        "max_changes_per_event",
        "stale_after",
    }
)


class DatasetsFileError(Exception):
    """The datasets file cannot be used; the message names the file, dataset and field."""


@dataclass(frozen=True)
class Quality:
    """Acceptance thresholds of one dataset (Cloud's data-quality result counts too).

    The history rules (record, fill-rate, field and partition drops) compare a run with the
    median of the dataset's last ``baseline_runs`` accepted runs once there are at least
    ``min_history`` of them, and with the last accepted run before that."""

    min_records: int = 1
    max_failed_pages_percent: float = 5.0
    max_empty_pages_percent: float = 5.0
    max_no_value_pages_percent: float = 5.0
    max_record_drop_percent: float | None = 25.0
    max_invalid_records_percent: float = 5.0
    max_conflicting_duplicates_percent: float = 1.0
    use_cloud_quality: bool = True
    baseline_runs: int = 7
    min_history: int = 3
    max_fill_rate_drop_points: float | None = 15.0
    max_partition_drop_percent: float | None = 50.0
    fail_on_missing_fields: bool = True
    consent_markers: tuple[str, ...] = (
        "before you continue",
        "accept all cookies",
        "we use cookies",
        "are you a robot",
        "access denied",
    )
    parsers: Mapping[str, str] = field(default_factory=dict)


DEFAULT_RETRY_DAYS = 3.0
DEFAULT_MAX_WAIT_MINUTES = 60.0


@dataclass(frozen=True)
class Destination:
    """Where a dataset's accepted runs are announced: a signed HTTP POST or a file folder,
    with how long and how patiently a failing delivery to it is retried."""

    url: str | None = None
    secret_env: str | None = None
    path: str | None = None
    name: str | None = None
    retry_days: float = DEFAULT_RETRY_DAYS
    max_wait_minutes: float = DEFAULT_MAX_WAIT_MINUTES

    @property
    def key(self) -> str:
        """A stable name for this destination, used in delivery rows."""
        return self.url or f"file:{self.path}"

    @property
    def label(self) -> str:
        """How the operator names this destination: its ``name``, else its key."""
        return self.name or self.key


@dataclass(frozen=True)
class Dataset:
    """One dataset: a Cloud sitemap plus identity, window, partitioning and acceptance rules."""

    name: str
    entity_key: tuple[str, ...]
    sitemap: str | None = None
    sitemap_id: int | None = None
    window: str = "daily"
    partition: str | None = None
    required: tuple[str, ...] = ()
    url_fields: tuple[str, ...] = ()
    policy: str = "reject"
    quality: Quality = field(default_factory=Quality)
    destinations: tuple[Destination, ...] = ()
    # the typed columns of the dataset's tables (none named: every field is a text column)
    columns: tuple[Column, ...] = ()
    # the columns whose changes the change feed reports (none named: every column's)
    watch: tuple[Watch, ...] = ()
    # how many collection windows of observations to keep (None: all of them)
    retain_windows: int | None = None
    max_changes_per_event: int = DEFAULT_MAX_CHANGES_PER_EVENT
    # how long the dataset may go without an accepted run before the alert channels are told
    stale_after: float | None = None

    def matches_sitemap(self, sitemap_id: int | None, sitemap_name: str | None) -> bool:
        """Whether a Cloud job of this sitemap belongs to this dataset."""
        if self.sitemap_id is not None:
            return sitemap_id == self.sitemap_id
        return self.sitemap is not None and sitemap_name == self.sitemap

    def window_for(self, created: datetime, job_id: int) -> str:
        """The collection window a job created at ``created`` falls in."""
        created = created.astimezone(UTC)
        if self.window == "daily":
            return created.strftime("%Y-%m-%d")
        if self.window == "weekly":
            year, week, _ = created.isocalendar()
            return f"{year}-W{week:02d}"
        return f"job-{job_id}"

    def run_id_for(self, window: str) -> str:
        """The run id of one intended collection of this dataset."""
        return f"{self.name}-{window}"


@dataclass(frozen=True)
class Datasets:
    """All datasets of one deployment, looked up by name or by Cloud sitemap."""

    by_name: Mapping[str, Dataset]
    alerts: tuple[AlertChannel, ...] = ()
    alert_interval: float = DEFAULT_ALERT_INTERVAL

    def __iter__(self) -> Iterator[Dataset]:
        return iter(self.by_name.values())

    def __len__(self) -> int:
        return len(self.by_name)

    def get(self, name: str) -> Dataset:
        """The dataset called ``name``, or an error listing the known ones."""
        try:
            return self.by_name[name]
        except KeyError:
            known = ", ".join(sorted(self.by_name)) or "none"
            raise DatasetsFileError(f"unknown dataset {name!r} (known: {known})") from None

    def for_sitemap(self, sitemap_id: int | None, sitemap_name: str | None) -> Dataset | None:
        """The dataset a Cloud sitemap feeds, if any."""
        for dataset in self.by_name.values():
            if dataset.matches_sitemap(sitemap_id, sitemap_name):
                return dataset
        return None


def _strings(where: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str) and value:
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) and v for v in value):
        return tuple(value)
    raise DatasetsFileError(f"{where} must be a string or a list of strings, none empty")


def _quality(where: str, raw: Any) -> Quality:
    if raw is None:
        return Quality()
    if not isinstance(raw, dict):
        raise DatasetsFileError(f"{where} must be a table")
    known = set(Quality.__dataclass_fields__)
    unknown = set(raw) - known
    if unknown:
        raise DatasetsFileError(f"{where} has unknown keys {sorted(unknown)}")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "consent_markers":
            values[key] = tuple(m.lower() for m in _strings(f"{where}.{key}", value))
        elif key == "parsers":
            if not isinstance(value, dict) or any(p not in PARSERS for p in value.values()):
                raise DatasetsFileError(
                    f"{where}.parsers maps fields to one of {', '.join(PARSERS)}"
                )
            values[key] = dict(value)
        elif key in ("use_cloud_quality", "fail_on_missing_fields"):
            if not isinstance(value, bool):
                raise DatasetsFileError(f"{where}.{key} must be true or false")
            values[key] = value
        elif key in ("baseline_runs", "min_history"):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DatasetsFileError(f"{where}.{key} must be a whole number of runs, at least 1")
            values[key] = value
        else:
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise DatasetsFileError(f"{where}.{key} must be a non-negative number")
            if key.endswith(("_percent", "_points")) and value > 100:
                raise DatasetsFileError(f"{where}.{key} is a percentage: at most 100")
            values[key] = int(value) if key == "min_records" else float(value)
    quality = Quality(**values)
    if quality.min_history > quality.baseline_runs:
        raise DatasetsFileError(
            f"{where}.min_history ({quality.min_history}) is more than baseline_runs "
            f"({quality.baseline_runs}): the history rules would never apply"
        )
    return quality


DESTINATION_KEYS = {"url", "secret_env", "path", "name", "retry_days", "max_wait_minutes"}


def _destination(where: str, raw: Any) -> Destination:
    if not isinstance(raw, dict) or not (raw.get("url") or raw.get("path")):
        raise DatasetsFileError(f"{where} needs url (signed HTTP POST) or path (file export)")
    unknown = set(raw) - DESTINATION_KEYS
    if unknown:
        raise DatasetsFileError(f"{where} has unknown keys {sorted(unknown)}")
    if raw.get("url") and not raw.get("secret_env"):
        raise DatasetsFileError(f"{where} needs secret_env naming the signing secret's variable")
    name = raw.get("name")
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise DatasetsFileError(f"{where}.name must be a non-empty text")
    return Destination(
        url=raw.get("url"),
        secret_env=raw.get("secret_env"),
        path=raw.get("path"),
        name=name,
        retry_days=_positive(f"{where}.retry_days", raw.get("retry_days", DEFAULT_RETRY_DAYS)),
        max_wait_minutes=_positive(
            f"{where}.max_wait_minutes", raw.get("max_wait_minutes", DEFAULT_MAX_WAIT_MINUTES)
        ),
    )


def _positive(where: str, value: Any) -> float:
    """A positive finite number of the datasets file."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e9:
        raise DatasetsFileError(f"{where} must be a positive number, got {value!r}")
    return float(value)


def _dataset(source: str, name: str, raw: Any) -> Dataset:
    where = f"{source}: [datasets.{name}]"
    _check_table(where, name, raw)
    sitemap_id = _sitemap_id(where, raw.get("sitemap_id"))
    window = _choice(f"{where}.window", raw.get("window", "daily"), WINDOWS)
    policy = _choice(f"{where}.policy", raw.get("policy", "reject"), POLICIES)
    partition = raw.get("partition")
    if partition is not None and not isinstance(partition, str):
        raise DatasetsFileError(f"{where}.partition must be a field name")
    entity_key = _entity_key(where, raw["entity_key"])
    destinations = raw.get("destinations", [])
    if not isinstance(destinations, list):
        raise DatasetsFileError(f"{where}.destinations must be an array of tables")
    columns, watch, retain_windows, max_changes = _table_settings(where, raw)
    return Dataset(
        name=name,
        entity_key=entity_key,
        sitemap=raw.get("sitemap"),
        sitemap_id=sitemap_id,
        window=window,
        partition=partition,
        required=_strings(f"{where}.required", raw.get("required", []))
        if raw.get("required")
        else (),
        url_fields=_url_fields(where, raw.get("url_fields"), entity_key),
        policy=policy,
        quality=_quality(f"{where}.quality", raw.get("quality")),
        destinations=tuple(
            _destination(f"{where}.destinations[{i}]", d) for i, d in enumerate(destinations)
        ),
        columns=columns,
        watch=watch,
        retain_windows=retain_windows,
        max_changes_per_event=max_changes,
        stale_after=_stale_after(where, raw.get("stale_after"), window),
    )


def _stale_after(where: str, raw: Any, window: str) -> float | None:
    try:
        return parse_stale_after(f"{where}.stale_after", raw, window)
    except AlertsConfigError as exc:
        raise DatasetsFileError(str(exc)) from None


def _check_table(where: str, name: str, raw: Any) -> None:
    """Refuse a dataset's table that is no table, has unknown keys, a name too long for its SQL
    tables, or lacks its entity key or sitemap."""
    if not isinstance(raw, dict):
        raise DatasetsFileError(f"{where} must be a table")
    unknown = set(raw) - DATASET_KEYS
    if unknown:
        raise DatasetsFileError(f"{where} has unknown keys {sorted(unknown)}")
    if len(name) > MAX_DATASET_NAME:
        raise DatasetsFileError(
            f"{where}: a dataset name is at most {MAX_DATASET_NAME} characters (it names the "
            "dataset's SQL tables)"
        )
    if "entity_key" not in raw:
        raise DatasetsFileError(f"{where} needs entity_key (the fields that identify a record)")
    if "sitemap" not in raw and "sitemap_id" not in raw:
        raise DatasetsFileError(f"{where} needs sitemap (name) or sitemap_id")


def _sitemap_id(where: str, sitemap_id: Any) -> int | None:
    if sitemap_id is not None and (isinstance(sitemap_id, bool) or not isinstance(sitemap_id, int)):
        raise DatasetsFileError(f"{where}.sitemap_id must be a whole number")
    return sitemap_id


def _choice(where: str, value: Any, options: tuple[str, ...]) -> str:
    if value not in options:
        raise DatasetsFileError(f"{where} must be one of {', '.join(options)}, got {value!r}")
    return str(value)


def _entity_key(where: str, raw: Any) -> tuple[str, ...]:
    entity_key = _strings(f"{where}.entity_key", raw)
    if not entity_key:
        raise DatasetsFileError(
            f"{where}.entity_key names no field (the fields that identify a record)"
        )
    if any(k.startswith("web-scraper-") for k in entity_key):
        raise DatasetsFileError(
            f"{where}.entity_key must use business fields: Cloud's web-scraper-* fields change "
            "with every job"
        )
    return entity_key


def _url_fields(where: str, raw: Any, entity_key: tuple[str, ...]) -> tuple[str, ...]:
    """The fields named as URLs, or by default the entity key's fields that are URLs by name."""
    if raw is not None:
        return _strings(f"{where}.url_fields", raw)
    return tuple(k for k in entity_key if k in ("url", "link", "href") or k.endswith("_url"))


def _table_settings(
    where: str, raw: dict[str, Any]
) -> tuple[tuple[Column, ...], tuple[Watch, ...], int | None, int]:
    """The dataset's typed columns, watched columns, retention and change-event size."""
    try:
        columns = parse_columns(f"{where}.columns", raw.get("columns"))
        watch = parse_watch(f"{where}.watch", raw.get("watch"), columns)
        retain_windows = parse_positive(f"{where}.retain_windows", raw.get("retain_windows"), None)
        max_changes = parse_positive(
            f"{where}.max_changes_per_event",
            raw.get("max_changes_per_event"),
            DEFAULT_MAX_CHANGES_PER_EVENT,
        )
    except ColumnsError as exc:
        raise DatasetsFileError(str(exc)) from None
    assert max_changes is not None
    return columns, watch, retain_windows, max_changes


def parse_datasets(text: str, *, source: str = "<datasets>") -> Datasets:
    """Parse a datasets file's TOML text."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise DatasetsFileError(f"{source}: not valid TOML: {exc}") from None
    tables = doc.get("datasets", {})
    if not isinstance(tables, dict):
        raise DatasetsFileError(f"{source}: [datasets] must be a table of tables")
    by_name = {name: _dataset(source, name, raw) for name, raw in tables.items()}
    try:
        alerts = parse_channels(source, doc.get("alerts"), frozenset(by_name))
        interval = doc.get("alert_interval")
        alert_interval = (
            DEFAULT_ALERT_INTERVAL
            if interval is None
            else parse_duration(f"{source}: alert_interval", interval)
        )
    except AlertsConfigError as exc:
        raise DatasetsFileError(str(exc)) from None
    return Datasets(by_name, alerts=alerts, alert_interval=alert_interval)


def load_datasets(path: Path) -> Datasets:
    """Read the datasets file at ``path``."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DatasetsFileError(
            f"datasets file {path} not found (set SCRAPESYNC_DATASETS to its path)"
        ) from None
    return parse_datasets(text, source=str(path))
