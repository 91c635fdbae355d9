"""A simulated sitemap: the definition as posted, verbatim, and the columns its selectors make."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from simulator.quality import QualityThresholds
from simulator.records import GENERATED_COLUMNS

DERIVED_COLUMNS = {"SelectorLink": "-href", "SelectorPopupLink": "-href", "SelectorImage": "-src"}


def product_selectors() -> list[dict[str, Any]]:
    """Return text selectors for the columns of generated product records."""
    return [
        {"id": name, "type": "SelectorText", "parentSelectors": ["_root"], "selector": f".{name}"}
        for name in GENERATED_COLUMNS
    ]


def sitemap_name(definition: Mapping[str, Any]) -> str:
    """Return a sitemap definition's ``_id``, which Cloud uses as its name."""
    name = definition.get("_id")
    if not isinstance(name, str) or not name:
        raise ValueError("a sitemap needs a non-empty string _id")
    return name


@dataclass
class Sitemap:
    """A sitemap as Cloud stores it: the posted object, verbatim, plus its settings."""

    id: int
    name: str
    definition: dict[str, Any]
    quality: QualityThresholds = field(default_factory=QualityThresholds)
    scheduler: dict[str, Any] = field(default_factory=dict)
    scheduler_enabled: bool = False

    @property
    def start_urls(self) -> list[str]:
        """Return the sitemap's start URLs as a list."""
        start = self.definition.get("startUrl", [])
        return [start] if isinstance(start, str) else [str(url) for url in start]

    def encoded(self) -> str:
        """Return the definition as Cloud echoes it: compact JSON, slashes unescaped."""
        return json.dumps(self.definition, separators=(",", ":"))

    @property
    def columns(self) -> list[str]:
        """Return the record columns the selectors produce: each selector's id, and the
        ``<id>-href`` of a link or ``<id>-src`` of an image selector."""
        columns: list[str] = []
        for selector in self.definition.get("selectors") or []:
            if isinstance(selector, Mapping) and isinstance(selector.get("id"), str):
                columns.append(selector["id"])
                suffix = DERIVED_COLUMNS.get(str(selector.get("type")))
                if suffix:
                    columns.append(selector["id"] + suffix)
        return columns
