"""The SQL face of a dataset in the datasets file: its typed columns, the changes that matter,
and how many collection windows of observations it keeps.

```toml
[datasets.products.columns]
sku = "text"
price = { type = "numeric", decimal = "," }      # "1 299,99 €" -> 1299.99
in_stock = { field = "availability", type = "boolean" }

[datasets.products.watch]                         # what the change feed reports
price = { percent = 1 }                           # a move of more than 1 percent
title = true                                      # any change
```

With no ``columns`` table every business field of the records becomes a ``text`` column named
after it (see :func:`column_name_for`); with no ``watch`` table a change of any column counts.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

TYPES = ("text", "integer", "numeric", "boolean", "timestamp", "json")
DECIMAL_MARKS = (".", ",")
NUMERIC_TYPES = ("integer", "numeric")
# the columns a dataset's table and its history have besides the typed ones: a typed column
# may not take their names
RESERVED_COLUMNS = frozenset(
    {
        "entity_key",
        "partition",
        "run_id",
        "collection_window",
        "first_seen_at",
        "last_changed_at",
        "cast_failures",
        "payload_hash",
        "id",
        "valid_from",
        "valid_to",
        "closed_by_run_id",
        "changed_by_run_id",
        "stale",
        "set_aside",
    }
)
MAX_NAME = 63  # PostgreSQL's identifier limit
MAX_DATASET_NAME = 50  # room for the "_history" and "_changes" suffixes (and "datasets_")
DEFAULT_MAX_CHANGES_PER_EVENT = 1000
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]*$")
_NOT_WORD = re.compile(r"[^a-z0-9]+")


class ColumnsError(ValueError):
    """A ``columns`` or ``watch`` table cannot be used; the message names where and why."""


@dataclass(frozen=True)
class Column:
    """One typed column of a dataset's tables: its SQL name, the record field it is cast from,
    its type, and (for ``integer`` and ``numeric``) the decimal mark the site writes."""

    name: str
    field: str
    type: str = "text"
    decimal: str = "."


@dataclass(frozen=True)
class Watch:
    """A column whose changes the change feed reports: any change (no tolerance), or one of more
    than ``percent`` of the old value, or of more than ``absolute``."""

    column: str
    percent: float | None = None
    absolute: float | None = None

    def matters(self, before: Any, after: Any) -> bool:
        """Whether a change from ``before`` to ``after`` is reported. A value that appears or
        disappears always is; numbers are compared with the tolerance, if any."""
        if before == after:
            return False
        if before is None or after is None:
            return True
        if self.percent is None and self.absolute is None:
            return True
        try:
            delta = abs(float(after) - float(before))
        except (TypeError, ValueError):
            return True
        if self.absolute is not None:
            return delta > self.absolute
        assert self.percent is not None
        base = abs(float(before))
        if base == 0:
            return True
        return delta * 100 > self.percent * base


def column_name_for(field: str) -> str:
    """The SQL column a record field becomes when the dataset names no columns: lower case,
    runs of other characters as one underscore (``"Product name"`` -> ``product_name``); a name
    that would start with a digit, be empty or take a reserved column gets ``f_`` in front, and
    one longer than PostgreSQL allows is cut and suffixed with a short hash of the field."""
    name = _NOT_WORD.sub("_", field.lower()).strip("_")
    if not name or name[0].isdigit() or name in RESERVED_COLUMNS:
        name = f"f_{name}"
    if len(name) > MAX_NAME:
        digest = hashlib.sha256(field.encode()).hexdigest()[:8]
        name = f"{name[: MAX_NAME - 9]}_{digest}"
    return name


def default_columns(fields: Iterable[str], *, known: tuple[Column, ...] = ()) -> tuple[Column, ...]:
    """One ``text`` column per field that no ``known`` column is cast from, in field order, when
    the dataset names no columns. A name already taken gets a short hash of its field name."""
    taken = {c.name for c in known}
    seen = {c.field for c in known}
    columns: list[Column] = []
    for field in sorted(set(fields) - seen):
        name = column_name_for(field)
        if name in taken:
            digest = hashlib.sha256(field.encode()).hexdigest()[:8]
            name = f"{name[: MAX_NAME - 9]}_{digest}"
        taken.add(name)
        columns.append(Column(name=name, field=field))
    return tuple(columns)


def parse_columns(where: str, raw: Any) -> tuple[Column, ...]:
    """The ``[datasets.X.columns]`` table: name -> type, or name -> {field, type, decimal}."""
    if raw is None:
        return ()
    if not isinstance(raw, dict) or not raw:
        raise ColumnsError(f"{where} must be a table of column = type")
    columns: list[Column] = []
    fields: dict[str, str] = {}
    for name, spec in raw.items():
        here = f"{where}.{name}"
        if not isinstance(name, str) or not _IDENTIFIER.match(name) or len(name) > MAX_NAME:
            raise ColumnsError(
                f"{here}: a column name is lower case letters, digits and underscores, "
                f"starting with a letter or underscore, at most {MAX_NAME} characters"
            )
        if name in RESERVED_COLUMNS:
            raise ColumnsError(f"{here}: {name!r} is a column every dataset table has already")
        if isinstance(spec, str):
            spec = {"type": spec}
        if not isinstance(spec, dict):
            raise ColumnsError(f"{here} must be a type name or a table with type (and field)")
        unknown = set(spec) - {"type", "field", "decimal"}
        if unknown:
            raise ColumnsError(f"{here} has unknown keys {sorted(unknown)}")
        kind = spec.get("type", "text")
        if kind not in TYPES:
            raise ColumnsError(f"{here}: type must be one of {', '.join(TYPES)}, got {kind!r}")
        field = spec.get("field", name)
        if not isinstance(field, str) or not field:
            raise ColumnsError(f"{here}.field must name a record field")
        decimal = spec.get("decimal", ".")
        if decimal not in DECIMAL_MARKS:
            raise ColumnsError(
                f"{here}.decimal must be one of {', '.join(map(repr, DECIMAL_MARKS))}, "
                f"got {decimal!r}"
            )
        if "decimal" in spec and kind not in NUMERIC_TYPES:
            raise ColumnsError(f"{here}.decimal applies to integer and numeric columns only")
        if field in fields:
            raise ColumnsError(f"{here}: field {field!r} is already column {fields[field]!r}")
        fields[field] = name
        columns.append(Column(name=name, field=field, type=kind, decimal=decimal))
    return tuple(columns)


def parse_watch(where: str, raw: Any, columns: tuple[Column, ...]) -> tuple[Watch, ...]:
    """The ``[datasets.X.watch]`` table: column -> true | {percent = N} | {absolute = N}."""
    if raw is None:
        return ()
    if not isinstance(raw, dict) or not raw:
        raise ColumnsError(f"{where} must be a table of column = true or a tolerance")
    types = {c.name: c.type for c in columns}
    watches: list[Watch] = []
    for name, spec in raw.items():
        here = f"{where}.{name}"
        if types and name not in types:
            raise ColumnsError(f"{here}: no such column (columns: {', '.join(sorted(types))})")
        if spec is True:
            watches.append(Watch(column=name))
            continue
        if not isinstance(spec, dict) or len(spec) != 1 or set(spec) - {"percent", "absolute"}:
            raise ColumnsError(f"{here} must be true, {{ percent = N }} or {{ absolute = N }}")
        ((kind, amount),) = spec.items()
        if isinstance(amount, bool) or not isinstance(amount, int | float) or amount < 0:
            raise ColumnsError(f"{here}.{kind} must be a non-negative number")
        if types and types[name] not in NUMERIC_TYPES:
            raise ColumnsError(
                f"{here}: a tolerance needs an integer or numeric column, {name!r} is {types[name]}"
            )
        watches.append(Watch(column=name, **{kind: float(amount)}))
    return tuple(watches)


def parse_positive(where: str, raw: Any, default: int | None) -> int | None:
    """A whole number of at least 1 (``retain_windows``, ``max_changes_per_event``)."""
    if raw is None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise ColumnsError(f"{where} must be a whole number, at least 1")
    return raw


def watch_by_column(watches: Iterable[Watch]) -> Mapping[str, Watch]:
    """The watched columns by name."""
    return {w.column: w for w in watches}
