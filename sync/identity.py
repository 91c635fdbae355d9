"""Stable identity of what was scraped: entity keys from business fields, observation keys from
entity key and collection window, and payload hashes that tell a change from a repeat.

Cloud's ``web-scraper-order`` changes with every job and never takes part in identity.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import orjson

from config.datasets import Dataset

META_FIELDS = ("web-scraper-order", "web-scraper-start-url")
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
_ORJSON_CANONICAL = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS
TRACKING_PARAMS = ("utm_", "gclid", "fbclid", "mc_cid", "mc_eid", "_ga")


def normalise_url(url: str) -> str:
    """One spelling per page: lower-case scheme and host, no default port, no fragment, no
    tracking parameters, sorted query, no trailing slash except the root."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    port = parts.port
    if port and not ((scheme == "http" and port == 80) or (scheme == "https" and port == 443)):
        host = f"{host}:{port}"
    path = parts.path or "/"
    if len(path) > 1 and path.endswith("/"):
        path = path.rstrip("/")
    query = sorted(
        (k, v)
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
        if not k.lower().startswith(TRACKING_PARAMS)
    )
    return urlunsplit((scheme, host, path, urlencode(query), ""))


def _key_value(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = value.strip()
        return value or None
    if isinstance(value, bool | int | float):
        return json.dumps(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def entity_key(record: Mapping[str, Any], dataset: Dataset) -> str | None:
    """The identity of the real thing a record describes, or None when a key field is empty."""
    values: list[str] = []
    for name in dataset.entity_key:
        value = _key_value(record.get(name))
        if value is None:
            return None
        if name in dataset.url_fields:
            value = normalise_url(value)
        values.append(value)
    if len(values) == 1:
        return values[0]
    return json.dumps(values, separators=(",", ":"), ensure_ascii=False)


def observation_key(dataset: str, window: str, key: str) -> str:
    """The stable key of one entity in one collection window (64 hex characters)."""
    return hashlib.sha256(f"{dataset}\x1f{window}\x1f{key}".encode()).hexdigest()


def payload_of(record: Mapping[str, Any]) -> dict[str, Any]:
    """The business fields of a record, without Cloud's per-job meta fields."""
    payload = dict(record)
    for name in META_FIELDS:
        payload.pop(name, None)
    return payload


def canonical_json(payload: Mapping[str, Any]) -> str:
    """The one JSON spelling of a payload that its hash is taken over: sorted keys, no spaces,
    UTF-8 as is. orjson writes it several times faster than the standard library (it is most of
    a repeat sync's cost); what orjson refuses (integers beyond 64 bits) takes the standard
    spelling, so the same payload always gets the same text."""
    try:
        return orjson.dumps(payload, option=_ORJSON_CANONICAL).decode()
    except orjson.JSONEncodeError:
        return _CANONICAL.encode(payload)


def payload_hash(canonical: str) -> str:
    """The SHA-256 of a payload's canonical JSON."""
    return hashlib.sha256(canonical.encode()).hexdigest()


def start_url_host(start: Any) -> str | None:
    """The lower-case host of a record's start URL, or None."""
    if isinstance(start, str) and start:
        return (urlsplit(start).hostname or "").lower() or None
    return None


def partition_of(record: Mapping[str, Any], dataset: Dataset) -> str | None:
    """The partition a record belongs to: its partition field, else its start URL's host."""
    if dataset.partition:
        value = _key_value(record.get(dataset.partition))
        if value is not None:
            return value
    return start_url_host(record.get("web-scraper-start-url"))


Identified = tuple[str, str, str | None, str | None, str, str]


class RecordIdentity:
    """Everything the sync stages for a record of one dataset and window, in one call: the
    observation key, entity key, partition, start URL, canonical payload and its hash. Same
    values as the functions above, in a fraction of their Python steps (a sync makes this call
    once per record)."""

    def __init__(self, dataset: Dataset, window: str) -> None:
        self.dataset = dataset
        self._prefix = f"{dataset.name}\x1f{window}\x1f"
        fields = dataset.entity_key
        self._single = (
            fields[0] if len(fields) == 1 and fields[0] not in dataset.url_fields else None
        )
        self._partition = dataset.partition

    def __call__(
        self, record: Mapping[str, Any], payload: dict[str, Any] | None = None
    ) -> Identified | None:
        """The record's staged values, or None when a key field is empty. ``payload``: the
        record without Cloud's metadata fields, when the caller has it."""
        single = self._single
        if single is None:
            key = entity_key(record, self.dataset)
        else:
            value = record.get(single)
            key = (value.strip() or None) if type(value) is str else _key_value(value)
        if key is None:
            return None
        start = record.get("web-scraper-start-url")
        partition = None
        if self._partition:
            value = record.get(self._partition)
            partition = (value.strip() or None) if type(value) is str else _key_value(value)
        if partition is None:
            partition = start_url_host(start)
        if payload is None:
            payload = payload_of(record)
        try:
            canonical = orjson.dumps(payload, option=_ORJSON_CANONICAL)
        except orjson.JSONEncodeError:
            canonical = _CANONICAL.encode(payload).encode()
        return (
            hashlib.sha256((self._prefix + key).encode()).hexdigest(),
            key,
            partition,
            start if isinstance(start, str) else None,
            canonical.decode(),
            hashlib.sha256(canonical).hexdigest(),
        )
