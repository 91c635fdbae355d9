"""Cloud's per-job data-quality check: thresholds against page counters and column fill rates.

Defaults are what Cloud answers for a sitemap nobody configured: at least 1 record, at most 5%
failed, empty and no-value pages, and every column filled in at least 95% of records. ``min_*``
criteria pass when ``got >= expected``, ``max_*`` when ``got <= expected``; the overall result is
the AND of every criterion.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

DEFAULT_MIN_COLUMN_PERCENT = 95


@dataclass(frozen=True)
class QualityThresholds:
    """The data-quality criteria configured for one sitemap."""

    min_record_count: float = 1
    max_failed_pages_percent: float = 5
    max_empty_pages_percent: float = 5
    max_no_value_pages_percent: float = 5
    min_column_records: Mapping[str, float] = field(default_factory=dict)

    def with_overrides(self, overrides: Mapping[str, Any]) -> QualityThresholds:
        """Return these thresholds with some criteria replaced (unknown names are an error)."""
        allowed = {
            "min_record_count",
            "max_failed_pages_percent",
            "max_empty_pages_percent",
            "max_no_value_pages_percent",
            "min_column_records",
        }
        unknown = set(overrides) - allowed
        if unknown:
            raise ValueError(f"unknown data-quality criteria {sorted(unknown)}")
        changes = dict(overrides)
        if "min_column_records" in changes:
            changes["min_column_records"] = dict(changes["min_column_records"])
        return replace(self, **changes)


@dataclass(frozen=True)
class QualityInput:
    """What a finished job offers to the check: page counters and per-column fill counts."""

    record_count: int
    jobs_scheduled: int
    jobs_failed: int
    jobs_empty: int
    jobs_no_value: int
    filled: Mapping[str, int]


def evaluate(facts: QualityInput, thresholds: QualityThresholds) -> dict[str, Any]:
    """Compute the data-quality payload exactly as Cloud's API shapes it."""
    result: dict[str, Any] = {
        "min_record_count": _at_least(facts.record_count, thresholds.min_record_count),
        "max_failed_pages_percent": _at_most(
            _percent(facts.jobs_failed, facts.jobs_scheduled), thresholds.max_failed_pages_percent
        ),
        "max_empty_pages_percent": _at_most(
            _percent(facts.jobs_empty, facts.jobs_scheduled), thresholds.max_empty_pages_percent
        ),
        "max_no_value_pages_percent": _at_most(
            _percent(facts.jobs_no_value, facts.jobs_scheduled),
            thresholds.max_no_value_pages_percent,
        ),
    }
    columns: dict[str, Any] = {}
    names = dict.fromkeys([*facts.filled, *thresholds.min_column_records])
    for name in names:
        expected = thresholds.min_column_records.get(name, DEFAULT_MIN_COLUMN_PERCENT)
        got = _percent(facts.filled.get(name, 0), facts.record_count)
        columns[name] = _at_least(got, expected)
    result["min_column_records"] = columns
    leaves = [result[key] for key in list(result) if key != "min_column_records"]
    leaves.extend(columns.values())
    result["overall_data_quality_success"] = all(leaf["success"] for leaf in leaves)
    return result


def _number(value: float) -> float | int:
    """Round to two decimals and show whole numbers as integers, as PHP's JSON does."""
    rounded = round(float(value), 2)
    return int(rounded) if rounded.is_integer() else rounded


def _percent(part: int, whole: int) -> float:
    """Return part as a percentage of whole (0 when whole is 0)."""
    return 100.0 * part / whole if whole else 0.0


def _at_least(got: float, expected: float) -> dict[str, Any]:
    """Build a criterion leaf that passes when got reaches expected."""
    return {"got": _number(got), "expected": _number(expected), "success": got >= expected}


def _at_most(got: float, expected: float) -> dict[str, Any]:
    """Build a criterion leaf that passes when got stays within expected."""
    return {"got": _number(got), "expected": _number(expected), "success": got <= expected}
