"""The datasets file: what users write, and clear errors when it is wrong."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from config.datasets import DatasetsFileError, load_datasets, parse_datasets

ROOT = Path(__file__).resolve().parents[2]


def test_the_shipped_datasets_file_loads() -> None:
    """config/datasets.toml, the default, is valid and describes the products dataset."""
    datasets = load_datasets(ROOT / "config" / "datasets.toml")
    products = datasets.get("products")
    assert products.entity_key == ("sku",)
    assert products.partition == "retailer"
    assert products.quality.parsers == {"price": "number"}
    assert products.destinations[0].secret_env == "PRODUCTS_HOOK_SECRET"


def test_the_shipped_files_commented_examples_are_valid() -> None:
    """The typed columns, watch and retention the shipped file shows in comments work as
    written once a user uncomments them."""
    text = (ROOT / "config" / "datasets.toml").read_text(encoding="utf-8")
    uncommented = re.sub(r"(?m)^# (?=\[|[a-z_]+ = )", "", text)
    products = parse_datasets(uncommented).get("products")
    assert [(c.name, c.type) for c in products.columns] == [
        ("sku", "text"),
        ("title", "text"),
        ("price", "numeric"),
    ]
    assert [w.column for w in products.watch] == ["price", "title"]
    assert products.retain_windows == 30


def test_windows_name_the_collection_a_job_belongs_to() -> None:
    """daily, weekly and per-job windows give stable run ids."""
    text = """
    [datasets.d]
    sitemap = "s"
    entity_key = "url"
    window = "%s"
    """
    when = datetime(2026, 12, 2, 23, 30, tzinfo=UTC)
    daily = parse_datasets(text % "daily").get("d")
    weekly = parse_datasets(text % "weekly").get("d")
    per_job = parse_datasets(text % "job").get("d")
    assert daily.run_id_for(daily.window_for(when, 7)) == "d-2026-12-02"
    assert weekly.window_for(when, 7) == "2026-W49"
    assert per_job.window_for(when, 7) == "job-7"
    assert daily.url_fields == ("url",)  # a url key field is normalised


def test_a_dataset_is_found_by_its_sitemap_name_or_id() -> None:
    """Jobs map to datasets by sitemap_id when given, else by sitemap name."""
    datasets = parse_datasets(
        """
        [datasets.a]
        sitemap = "alpha"
        entity_key = ["sku"]
        [datasets.b]
        sitemap_id = 42
        entity_key = ["sku"]
        """
    )
    assert datasets.for_sitemap(1, "alpha") is datasets.get("a")
    assert datasets.for_sitemap(42, "anything") is datasets.get("b")
    assert datasets.for_sitemap(5, "unknown") is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[datasets.x]\nsitemap = "s"\n', "needs entity_key"),
        ('[datasets.x]\nentity_key = ["sku"]\n', "needs sitemap"),
        ('[datasets.x]\nsitemap = "s"\nentity_key = ["web-scraper-order"]\n', "business fields"),
        (
            '[datasets.x]\nsitemap = "s"\nentity_key = "k"\nwindow = "hourly"\n',
            r"window must be one of daily, weekly, job, got 'hourly'",
        ),
        # no key would give every record one entity: the dataset would hold one row
        ('[datasets.x]\nsitemap = "s"\nentity_key = []\n', r"entity_key names no field"),
        ('[datasets.x]\nsitemap = "s"\nentity_key = ""\n', r"entity_key must be .*none empty"),
        ('[datasets.x]\nsitemap = "s"\nentity_key = ["sku", ""]\n', r"entity_key must be"),
        ('[datasets.x]\nsitemap = "s"\nentity_key = "k"\nrequired = [""]\n', r"required must"),
        ('[datasets.x]\nsitemap = "s"\nentity_key = "k"\ncolour = 1\n', "unknown keys"),
        (
            '[datasets.x]\nsitemap = "s"\nentity_key = "k"\n'
            "[datasets.x.quality]\nmin_records = -1\n",
            "min_records",
        ),
        (
            '[datasets.x]\nsitemap = "s"\nentity_key = "k"\n[[datasets.x.destinations]]\n'
            'url = "https://h"\n',
            "secret_env",
        ),
        ("[datasets.x\n", "not valid TOML"),
    ],
)
def test_mistakes_get_an_error_naming_the_dataset_and_field(text: str, message: str) -> None:
    """A wrong datasets file is refused with the place and the reason."""
    with pytest.raises(DatasetsFileError, match=message):
        parse_datasets(text, source="datasets.toml")


def test_a_missing_file_names_the_variable_to_set(tmp_path: Path) -> None:
    """A datasets file that does not exist says where it looked and what to set."""
    with pytest.raises(DatasetsFileError, match="SCRAPESYNC_DATASETS"):
        load_datasets(tmp_path / "nope.toml")
