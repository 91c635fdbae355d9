"""Scraped records as the simulated Cloud keeps them: compact, append-only, rendered lazily.

A job's records are a list of batches. An explicit batch holds each record already encoded as
PHP-style JSON bytes (Cloud escapes ``/`` as ``\\/``), so a large batch costs one ``bytes``
object per record instead of a dict. A generated batch holds only ``(n, seed, partitions,
start)`` and renders each product record on demand, so a million-record job costs a few bytes
until it is downloaded.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, overload

DEFAULT_PARTITIONS: tuple[str, ...] = ("alpha.example", "beta.example", "gamma.example")
GENERATED_COLUMNS: tuple[str, ...] = ("sku", "title", "price", "url", "retailer")
CONSENT_TITLE = "Before you continue to our site"
META_COLUMNS: tuple[str, ...] = ("web-scraper-order", "web-scraper-start-url")

_HOST = re.compile(r"[A-Za-z0-9.-]+(:[0-9]+)?")
_MASK64 = (1 << 64) - 1
_ADJECTIVES = (
    "Compact", "Deluxe", "Classic", "Smart", "Rugged", "Slim", "Quiet", "Bright",
    "Eco", "Pro", "Mini", "Ultra", "Solar", "Wireless", "Modular", "Vintage",
)  # fmt: skip
_NOUNS = (
    "Kettle", "Lamp", "Backpack", "Blender", "Headphones", "Toaster", "Drill", "Speaker",
    "Monitor", "Keyboard", "Camera", "Heater", "Router", "Watch", "Grinder", "Tent",
)  # fmt: skip


def php_json(value: object) -> str:
    """Encode a value the way Cloud's PHP backend does: compact, ASCII-only, slashes escaped."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True).replace("/", "\\/")


def _mix(seed: int, index: int) -> int:
    """Return a well-spread 64-bit hash of (seed, index) (splitmix64 finaliser)."""
    z = (seed * 0x9E3779B97F4A7C15 + index * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


@dataclass(frozen=True)
class GeneratedRecords(Sequence[dict[str, str]]):
    """A lazily rendered run of product records, deterministic per (seed, index)."""

    n: int
    seed: int = 0
    partitions: tuple[str, ...] = DEFAULT_PARTITIONS
    start: int = 0

    def __post_init__(self) -> None:
        if self.n < 0 or self.start < 0:
            raise ValueError(f"generated records need n >= 0 and start >= 0, got {self}")
        if not self.partitions:
            raise ValueError("generated records need at least one partition")

    def __len__(self) -> int:
        """Return the number of records in the run."""
        return self.n

    @overload
    def __getitem__(self, position: int) -> dict[str, str]: ...

    @overload
    def __getitem__(self, position: slice) -> list[dict[str, str]]: ...

    def __getitem__(self, position: int | slice) -> dict[str, str] | list[dict[str, str]]:
        """Return the record at a position of the run (or a list for a slice)."""
        if isinstance(position, slice):
            return [self.record(self.start + i) for i in range(*position.indices(self.n))]
        if position < 0:
            position += self.n
        if not 0 <= position < self.n:
            raise IndexError(position)
        return self.record(self.start + position)

    def __iter__(self) -> Iterator[dict[str, str]]:
        """Render the records one by one."""
        for index in range(self.start, self.start + self.n):
            yield self.record(index)

    def record(self, index: int) -> dict[str, str]:
        """Render the product record with this absolute index."""
        h = _mix(self.seed, index)
        partition = self.partitions[index % len(self.partitions)]
        cents = 199 + (h >> 16) % 99_800
        return {
            "sku": f"SKU-{index:06d}",
            "title": f"{_ADJECTIVES[h & 15]} {_NOUNS[(h >> 4) & 15]} {index}",
            "price": f"{cents // 100}.{cents % 100:02d}",
            "url": f"https://{partition}/p/{index}",
            "retailer": partition,
        }

    def json_body(self, index: int) -> str:
        """Render one record as PHP-style JSON without building a dict (the fast path)."""
        h = _mix(self.seed, index)
        partition = self.partitions[index % len(self.partitions)]
        cents = 199 + (h >> 16) % 99_800
        return (
            f'{{"sku":"SKU-{index:06d}",'
            f'"title":"{_ADJECTIVES[h & 15]} {_NOUNS[(h >> 4) & 15]} {index}",'
            f'"price":"{cents // 100}.{cents % 100:02d}",'
            f'"url":"https:\\/\\/{partition}\\/p\\/{index}",'
            f'"retailer":"{partition}"}}'
        )


def generate_records(
    n: int,
    *,
    seed: int = 0,
    partitions: Sequence[str] = DEFAULT_PARTITIONS,
    start: int = 0,
) -> GeneratedRecords:
    """Describe n product records (sku, title, price, url, retailer) without rendering them."""
    for host in partitions:
        if not _HOST.fullmatch(host):
            raise ValueError(f"partition must be a bare ASCII host name, got {host!r}")
    return GeneratedRecords(n=n, seed=seed, partitions=tuple(partitions), start=start)


@dataclass(frozen=True)
class ExplicitRecords:
    """Records supplied by a test, each kept as PHP-style JSON bytes of its business fields,
    with the ``web-scraper-start-url`` a record was given, if any (empty when none was)."""

    lines: tuple[bytes, ...]
    columns: tuple[str, ...]
    filled: Mapping[str, int]
    start_urls: tuple[str | None, ...] = ()

    @classmethod
    def encode(cls, records: Iterable[Mapping[str, Any]]) -> ExplicitRecords:
        """Encode records once, noting their columns and how often each column is filled."""
        lines: list[bytes] = []
        columns: dict[str, None] = {}
        filled: dict[str, int] = {}
        starts: list[str | None] = []
        for record in records:
            if not isinstance(record, Mapping):
                raise TypeError(f"a record must be a mapping of fields, got {type(record)}")
            business = {str(k): v for k, v in record.items() if k not in META_COLUMNS}
            lines.append(php_json(business).encode("ascii"))
            supplied = record.get("web-scraper-start-url")
            starts.append(supplied if isinstance(supplied, str) else None)
            for key, value in business.items():
                columns.setdefault(key)
                if is_filled(value):
                    filled[key] = filled.get(key, 0) + 1
        kept = tuple(starts) if any(url is not None for url in starts) else ()
        return cls(tuple(lines), tuple(columns), filled, kept)

    def __len__(self) -> int:
        """Return the number of records in the batch."""
        return len(self.lines)


RecordBatch = GeneratedRecords | ExplicitRecords


def is_filled(value: object) -> bool:
    """Tell whether a field counts as filled for Cloud's per-column data-quality check."""
    return value is not None and value != "" and value != [] and value != {}


def consent_shell(record: Mapping[str, Any]) -> dict[str, Any]:
    """Turn a record into what a consent interstitial yields: empty fields but a title."""
    shell: dict[str, Any] = dict.fromkeys(record, "")
    shell["title"] = CONSENT_TITLE
    return shell


@dataclass
class RecordSet:
    """All records of one scraping job, in scrape order."""

    batches: list[RecordBatch] = field(default_factory=list)

    def __len__(self) -> int:
        """Return the number of records stored for the job."""
        return sum(len(batch) for batch in self.batches)

    def replace(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Drop the job's records and store these instead."""
        self.batches = []
        self.append(records)

    def append(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Store more records after the existing ones."""
        batch: RecordBatch
        if isinstance(records, GeneratedRecords):
            batch = records
        else:
            batch = ExplicitRecords.encode(records)
        if len(batch):
            self.batches.append(batch)

    def snapshot(self) -> RecordSet:
        """Return a view that later appends do not change (batches themselves are frozen)."""
        return RecordSet(list(self.batches))

    def columns(self, *, consent: bool = False) -> list[str]:
        """Return the business columns in first-seen order."""
        seen: dict[str, None] = {}
        for batch in self.batches:
            names = GENERATED_COLUMNS if isinstance(batch, GeneratedRecords) else batch.columns
            seen.update(dict.fromkeys(names))
        if consent and self.batches:
            seen.setdefault("title")
        return list(seen)

    def filled_counts(self, *, consent: bool = False) -> dict[str, int]:
        """Count, per business column, the records where it is filled (O(batches))."""
        counts: dict[str, int] = dict.fromkeys(self.columns(consent=consent), 0)
        if consent:
            counts["title"] = len(self)
            return counts
        for batch in self.batches:
            if isinstance(batch, GeneratedRecords):
                for name in GENERATED_COLUMNS:
                    counts[name] += batch.n
            else:
                for name, count in batch.filled.items():
                    counts[name] += count
        return counts

    def iter_records(self, *, consent: bool = False) -> Iterator[dict[str, Any]]:
        """Yield each record's business fields as a dict."""
        for batch in self.batches:
            source: Iterable[dict[str, Any]]
            if isinstance(batch, GeneratedRecords):
                source = batch
            else:
                source = (json.loads(line) for line in batch.lines)
            for record in source:
                yield consent_shell(record) if consent else record

    def iter_start_urls(self) -> Iterator[str | None]:
        """Yield, per record, the start URL it was supplied with, or None (Cloud picks one)."""
        for batch in self.batches:
            if isinstance(batch, ExplicitRecords) and batch.start_urls:
                yield from batch.start_urls
            else:
                yield from repeat(None, len(batch))

    def iter_json_bodies(self, *, consent: bool = False) -> Iterator[str]:
        """Yield each record's business fields as PHP-style JSON text (no meta keys)."""
        if consent:
            for record in self.iter_records(consent=True):
                yield php_json(record)
            return
        for batch in self.batches:
            if isinstance(batch, GeneratedRecords):
                render = batch.json_body
                for index in range(batch.start, batch.start + batch.n):
                    yield render(index)
            else:
                for line in batch.lines:
                    yield line.decode("ascii")
