"""Casting scraped values to a column's type, the way scraped values are written.

A cast never raises: it gives the typed value, or ``None`` and a :class:`CastFailure` that says
which column, the raw value and why. An empty value (missing, ``null``, blank text, an empty
list) is NULL and no failure.

=========  ==========================================  =================================
type       accepts                                     examples
=========  ==========================================  =================================
text       any value; numbers and booleans as JSON     ``12`` -> ``"12"``
           text, lists and objects as JSON
integer    whole numbers, with grouping marks          ``"1,200"`` -> 1200, ``"3 pcs"`` fails
numeric    numbers with currency signs or codes and    ``"$1,299.00"`` -> 1299.00
           grouping; ``decimal = ","`` for sites       ``"1 299,99 €"`` -> 1299.99
           that write a decimal comma
boolean    true/false, yes/no, y/n, on/off, 1/0        ``"Yes"`` -> true
timestamp  ISO 8601 (a date alone is midnight UTC,     ``"2026-12-03T10:00:00+01:00"``
           no offset is UTC), Unix seconds             ``1764756000``
json       any value, kept as JSON                     ``["a", "b"]``
=========  ==========================================  =================================
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

import orjson

from config.columns import Column

RAW_KEPT = 200  # characters of a raw value kept with its failure
_SIGNS = "$€£¥₹₽₩¢"
_CURRENCY_AROUND = re.compile(
    rf"^(?:(?:[A-Z]{{3}}|US\$|R\$|kr|zł|[{_SIGNS}])\s*)?(.*?)(?:\s*(?:[A-Z]{{3}}|kr|zł|[{_SIGNS}]))?$"
)
_GROUP_SPACE = re.compile(r"(?<=\d)[\s\u00a0\u202f'\u2019](?=\d{3}(?!\d))")
_POINT_DECIMAL = re.compile(r"^[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?$")
_COMMA_DECIMAL = re.compile(r"^[+-]?(?:\d{1,3}(?:\.\d{3})+|\d+)?(?:,\d+)?$")
_PLAIN_NUMBER = re.compile(r"^-?\d{1,15}(?:\.\d{1,15})?$")
_TRUE = frozenset({"true", "yes", "y", "on", "1"})
_FALSE = frozenset({"false", "no", "n", "off", "0"})


@dataclass(frozen=True)
class CastFailure:
    """A value that did not cast: the column, the raw value (cut to ``RAW_KEPT`` characters when
    it is text) and why."""

    column: str
    raw: Any
    why: str

    def as_dict(self) -> dict[str, Any]:
        """The failure as kept on the row (``cast_failures``)."""
        return {"column": self.column, "raw": self.raw, "why": self.why}


def is_empty(value: Any) -> bool:
    """Whether a value is no value at all: NULL in any column, and never a failure."""
    if value is None:
        return True
    if isinstance(value, str):
        return not value.strip()
    return isinstance(value, list | dict) and not value


def cast(column: Column, value: Any) -> tuple[Any, CastFailure | None]:
    """``value`` as ``column``'s type, or ``(None, failure)`` when it does not read as one."""
    if is_empty(value):
        return None, None
    try:
        return _CASTS[column.type](column, value), None
    except _RefusedError as refused:
        kept = value[:RAW_KEPT] if isinstance(value, str) else value
        return None, CastFailure(column.name, kept, str(refused))


def cast_record(
    columns: tuple[Column, ...], record: dict[str, Any]
) -> tuple[dict[str, Any], list[CastFailure]]:
    """Every column's value from one record's fields, with the failures."""
    values: dict[str, Any] = {}
    failures: list[CastFailure] = []
    for column in columns:
        raw = record.get(column.field)
        if column.type == "text" and isinstance(raw, str) and raw.strip():
            values[column.name] = raw  # what cast() gives, without its dispatch (the common case)
            continue
        value, failure = cast(column, raw)
        values[column.name] = value
        if failure is not None:
            failures.append(failure)
    return values, failures


def to_json(value: Any) -> Any:
    """A typed value as JSON would carry it (change feed, ``diff --json``): numerics as numbers
    (integral ones as integers), timestamps as ISO 8601 text."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    return value


class _RefusedError(ValueError):
    """A value that does not read as the column's type; the message says why."""


def _text(column: Column, value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except orjson.JSONEncodeError:  # integers beyond 64 bits
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _number_text(column: Column, value: str) -> str:
    """Scraped number text in plain form (``-1234.5``): currency and grouping removed, the
    column's decimal mark read as the point."""
    text = value.strip()
    match = _CURRENCY_AROUND.match(text)
    if match:
        text = match.group(1)
    text = _GROUP_SPACE.sub("", text.strip())
    if text.startswith("(") and text.endswith(")"):  # accounting negative: (12.50)
        text = "-" + text[1:-1]
    pattern = _COMMA_DECIMAL if column.decimal == "," else _POINT_DECIMAL
    if not text or not pattern.match(text) or not any(c.isdigit() for c in text):
        mark = "decimal comma" if column.decimal == "," else "decimal point"
        raise _RefusedError(f"not a number (read with a {mark})")
    if column.decimal == ",":
        return text.replace(".", "").replace(",", ".")
    return text.replace(",", "")


def _numeric(column: Column, value: Any) -> Decimal:
    if isinstance(value, bool):
        raise _RefusedError("a boolean is not a number")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _RefusedError("not a finite number")
        return Decimal(repr(value))
    if not isinstance(value, str):
        raise _RefusedError(f"a {type(value).__name__} is not a number")
    if column.decimal == "." and _PLAIN_NUMBER.match(value):
        return Decimal(value)  # "12.50": nothing to strip (the common case, read quickly)
    try:
        number = Decimal(_number_text(column, value))
    except InvalidOperation:
        raise _RefusedError("not a number") from None
    if not number.is_finite():
        raise _RefusedError("not a finite number")
    return number


def _integer(column: Column, value: Any) -> int:
    number = _numeric(column, value)
    if number != number.to_integral_value():
        raise _RefusedError("not a whole number")
    if not -(2**63) <= number < 2**63:  # an integer column is 64-bit
        raise _RefusedError("out of the 64-bit integer range")
    return int(number)


def _boolean(column: Column, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
    raise _RefusedError("not true/false, yes/no, y/n, on/off or 1/0")


def _timestamp(column: Column, value: Any) -> datetime:
    if isinstance(value, bool):
        raise _RefusedError("a boolean is not a time")
    if isinstance(value, int | float):
        try:
            return datetime.fromtimestamp(value, UTC)
        except (OverflowError, OSError, ValueError):
            raise _RefusedError("Unix seconds out of range") from None
    if not isinstance(value, str):
        raise _RefusedError(f"a {type(value).__name__} is not a time")
    text = value.strip()
    try:
        if len(text) == 10:
            day = date.fromisoformat(text)
            return datetime(day.year, day.month, day.day, tzinfo=UTC)
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise _RefusedError("not an ISO 8601 date or time") from None
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def _json(column: Column, value: Any) -> Any:
    return value


_CASTS = {
    "text": _text,
    "integer": _integer,
    "numeric": _numeric,
    "boolean": _boolean,
    "timestamp": _timestamp,
    "json": _json,
}


# What a record's values must be for the database to cast them as :func:`cast` does, each read
# with the simple cast of its column's type (sync.datasets.first_publication reads them so). A
# value checked here as the record is imported spares the database the check, which is most of
# the time a first publication spends reading values.
_PLAIN_VERSION = 1
_PLAIN_DECIMAL = re.compile(r"-?[0-9]{1,30}(?:\.[0-9]{1,30})?")
_PLAIN_WHOLE = re.compile(r"-?[0-9]{1,18}")
_NOT_BLANK_FIRST = frozenset(chr(c) for c in range(33, 127))  # printable ASCII but a space


def _plain_decimal(v: Any) -> bool:
    # a string, or a whole JSON number (always within 64 bits once stored), of up to 30 digits
    return type(v) is int or (type(v) is str and _PLAIN_DECIMAL.fullmatch(v) is not None)


def _plain_whole(v: Any) -> bool:
    if type(v) is int:
        return -(10**18) < v < 10**18
    return type(v) is str and _PLAIN_WHOLE.fullmatch(v) is not None


def _plain_boolean(v: Any) -> bool:
    return type(v) is bool


def _never(v: Any) -> bool:
    return False  # only an absent value is plain


_PLAIN_OF: dict[str, Callable[[Any], bool]] = {
    "numeric": _plain_decimal,
    "integer": _plain_whole,
    "boolean": _plain_boolean,
    "none": _never,
}


@dataclass(frozen=True)
class PlainValues:
    """Which records a database reads as :func:`cast` would, with one simple cast per column:
    every value absent (missing, ``null`` or ``""``) or plain for the column it fills. Plain
    is a string that is not blank (kept as it is, as :func:`cast` keeps it), for a ``text``
    column; a string ``-?digits(.digits)?`` (at most 30 digits on either side) or a whole JSON
    number, for a ``numeric`` column with a decimal point; a string or a JSON number of at most
    18 digits, for an ``integer`` column; ``true`` or ``false`` for a ``boolean`` column; nothing
    else. ``kinds`` names the fields read otherwise than as text; every other field is read as
    text, whether a column takes it or not."""

    kinds: tuple[tuple[str, str], ...] = ()
    _by_field: dict[str, str] = field(init=False, repr=False, compare=False)
    # the columns last asked about by :meth:`unsettled`, and its answer
    _asked: tuple[tuple[Column, ...], tuple[Column, ...]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_field", dict(self.kinds))

    @classmethod
    def of(cls, columns: tuple[Column, ...]) -> PlainValues | None:
        """The plain values of a table with ``columns``; None when two columns read one field
        as two types (a value plain for one may not be for the other)."""
        kinds: dict[str, str] = {}
        for column in columns:
            kind = _plain_kind(column)
            if kinds.setdefault(column.field, kind) != kind:
                return None
        return cls(tuple(sorted((f, k) for f, k in kinds.items() if k != "text")))

    @property
    def fingerprint(self) -> str:
        """A short digest of these rules: a record is marked plain under it."""
        described = repr((_PLAIN_VERSION, self.kinds))
        return hashlib.blake2b(described.encode(), digest_size=8).hexdigest()

    @property
    def typed_fields(self) -> Mapping[str, str]:
        """The fields read otherwise than as text, each with its kind."""
        return self._by_field

    def holds_typed(self, record: Mapping[str, Any]) -> bool:
        """Whether every field read otherwise than as text is absent or plain in ``record``."""
        for name, kind in self._by_field.items():
            value = record.get(name)
            if value is not None and value != "" and not _PLAIN_OF[kind](value):
                return False
        return True

    def unsettled(self, columns: tuple[Column, ...]) -> tuple[Column, ...]:
        """Those of ``columns`` whose cast a record that :meth:`holds` may still fail: a value
        plain for a column's own kind always casts (the tests hold this), so the columns whose
        field is read here as the column reads it need no cast to tell. (Asked once per record
        with the same columns, it answers from the last call.)"""
        asked = self._asked
        if asked is not None and asked[0] is columns:
            return asked[1]
        kinds = self._by_field
        left = tuple(c for c in columns if kinds.get(c.field, "text") != _plain_kind(c))
        object.__setattr__(self, "_asked", (columns, left))
        return left

    def holds(self, record: Mapping[str, Any]) -> bool:
        """Whether every value of ``record`` (a stored payload) is absent or plain: the rule.
        The import finds the same in the tally's pass over the record's fields
        (:func:`sync.acceptance.records.profile_record`)."""
        kinds = self._by_field
        for name, value in record.items():
            if name in kinds:
                if value is not None and value != "" and not _PLAIN_OF[kinds[name]](value):
                    return False
            elif type(value) is str:
                if value and value[0] not in _NOT_BLANK_FIRST and not value.strip():
                    return False  # blank: the casts read it as NULL
            elif value is not None:
                return False
        return True


def _plain_kind(column: Column) -> str:
    if column.type in ("text", "integer", "boolean"):
        return column.type
    if column.type == "numeric" and column.decimal == ".":
        return "numeric"
    return "none"
