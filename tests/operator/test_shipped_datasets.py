"""The shipped ``config/datasets.toml`` says what the manual says: every key it shares with the
manual's example has the same value and the same comment, and its thresholds are the defaults
the code applies."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path
from typing import Any

from config.datasets import Quality, load_datasets

ROOT = Path(__file__).parents[2]
SHIPPED = ROOT / "config" / "datasets.toml"
MANUAL = ROOT / "docs" / "datasets-file.md"
LINE = re.compile(r"^(?P<key>[a-z_]+)\s*=\s*(?P<value>.+?)\s*(?:#\s*(?P<comment>.*))?$")


def _manual_example() -> str:
    text = MANUAL.read_text(encoding="utf-8")
    match = re.search(r"```toml\n(.*?)```", text, re.S)
    assert match is not None, "docs/datasets-file.md has no TOML example"
    return match.group(1)


def _commented(text: str, table: str) -> dict[str, str]:
    """The trailing comment of each ``key = value`` line of ``[table]``."""
    comments: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        header = re.match(r"^\[\[?([^\]]+)\]\]?", line)
        if header:
            current = header.group(1)
            continue
        found = LINE.match(line)
        if current == table and found and found.group("comment"):
            comments[found.group("key")] = found.group("comment").strip()
    return comments


def _tables(text: str) -> dict[str, Any]:
    products: dict[str, Any] = tomllib.loads(text)["datasets"]["products"]
    return products


def test_shared_keys_have_the_manuals_values_and_comments() -> None:
    """max_record_drop_percent and every other key the two share: one value, one comment."""
    shipped_text, manual_text = SHIPPED.read_text(encoding="utf-8"), _manual_example()
    shipped, manual = _tables(shipped_text), _tables(manual_text)
    for table in ("", "quality"):
        ours = shipped.get(table, {}) if table else shipped
        theirs = manual.get(table, {}) if table else manual
        for key in sorted(set(ours) & set(theirs)):
            if isinstance(ours[key], dict) or key == "destinations":  # tables, compared apart
                continue
            assert ours[key] == theirs[key], f"{table or 'dataset'}.{key}"
        name = "datasets.products" + (f".{table}" if table else "")
        ours_said, theirs_said = _commented(shipped_text, name), _commented(manual_text, name)
        for key in sorted(set(ours_said) & set(theirs_said)):
            assert ours_said[key] == theirs_said[key], f"the comment on {name}.{key}"


def test_the_shipped_thresholds_are_the_codes_defaults() -> None:
    """A threshold the shipped file sets is the default the code would apply without it."""
    quality = _tables(SHIPPED.read_text(encoding="utf-8"))["quality"]
    defaults = {f.name: f.default for f in dataclasses.fields(Quality)}
    for key, value in quality.items():
        if key.startswith(("max_", "min_")):
            assert value == defaults[key], key
    assert load_datasets(SHIPPED).get("products").quality.max_record_drop_percent == 25
