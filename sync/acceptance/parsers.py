"""Value parsers: whether a field holds a value, and whether it reads as a number, an integer
or a URL. A dataset names one per field (``[datasets.x.quality.parsers]``)."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

_CURRENCY = re.compile(
    r"^(?:[A-Z]{3}|[$€£¥₹₽₩]|US\$|R\$|kr)?\s*(.*?)\s*(?:[A-Z]{3}|[$€£¥₹₽₩]|kr)?$"
)
_PLAIN_NUMBER = re.compile(r"^[+-]?(?:\d+(?:[.,]\d+)?|[.,]\d+)$")
_GROUPED_POINT = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_GROUPED_COMMA = re.compile(r"^[+-]?\d{1,3}(?:\.\d{3})+(?:,\d+)?$")
_INTEGER = re.compile(r"^[+-]?(?:\d+|\d{1,3}(?:,\d{3})+)$")
_GROUP_SPACES = re.compile(r"(?<=\d)[\s\u00a0\u202f'](?=\d{3}\b)")


def is_filled(value: Any) -> bool:
    """Whether a field holds a value: not None, not blank text, not an empty list or object."""
    if value is None:
        return False
    if isinstance(value, str):
        return bool(value.strip())
    if isinstance(value, list | dict):
        return bool(value)
    return True


def parses_as_number(value: Any) -> bool:
    """A price-like number: 12, 12.5, "1,234.50", "1.234,50", "$ 9.99", "12,99 EUR"."""
    if type(value) is str:  # the commonest case, "982.10", told by two string methods
        whole, point, fraction = value.partition(".")
        if whole.isdecimal() and (not point or fraction.isdecimal()):  # what \d matches
            return True
    return _reads_as_number(value)


def _reads_as_number(value: Any) -> bool:
    """:func:`parses_as_number` without its shortcut (which accepts nothing this rejects)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return value == value and value not in (float("inf"), float("-inf"))
    if not isinstance(value, str):
        return False
    if _PLAIN_NUMBER.match(value):  # the commonest case, "982.10": no symbol, code or spaces
        return True
    match = _CURRENCY.match(value.strip())
    text = _GROUP_SPACES.sub("", match.group(1) if match else value.strip())
    return bool(
        _PLAIN_NUMBER.match(text) or _GROUPED_POINT.match(text) or _GROUPED_COMMA.match(text)
    )


def parses_as_integer(value: Any) -> bool:
    """A whole number: 3, "3", "1,200", "1 200"."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    if isinstance(value, float):
        return value.is_integer()
    return isinstance(value, str) and bool(_INTEGER.match(_GROUP_SPACES.sub("", value.strip())))


def parses_as_url(value: Any) -> bool:
    """An absolute http(s) URL with a host and no whitespace."""
    if not isinstance(value, str) or any(c.isspace() for c in value.strip()):
        return False
    parts = urlsplit(value.strip())
    return parts.scheme in ("http", "https") and bool(parts.hostname)


PARSERS = {
    "number": parses_as_number,
    "integer": parses_as_integer,
    "url": parses_as_url,
    "nonempty": is_filled,
}
