"""Identity: the same real thing gets the same key in every job; Cloud's order never counts."""

from __future__ import annotations

from typing import Any

import pytest

from sync.identity import (
    RecordIdentity,
    canonical_json,
    entity_key,
    normalise_url,
    observation_key,
    partition_of,
    payload_hash,
    payload_of,
)
from tests.harness import datasets_from

DATASETS = datasets_from(
    """
    [datasets.products]
    sitemap = "products"
    entity_key = ["sku"]
    partition = "retailer"
    [datasets.pages]
    sitemap = "pages"
    entity_key = ["url"]
    [datasets.pairs]
    sitemap = "pairs"
    entity_key = ["shop", "sku"]
    """
)


def test_urls_are_normalised_to_one_spelling() -> None:
    """Case, default ports, fragments, trailing slashes and tracking parameters do not matter."""
    assert (
        normalise_url("HTTPS://Shop.Example:443/p/1/?utm_source=x&b=2&a=1#top")
        == "https://shop.example/p/1?a=1&b=2"
    )
    assert normalise_url("http://shop.example") == "http://shop.example/"
    assert normalise_url("http://shop.example:8080/x") == "http://shop.example:8080/x"


def test_entity_keys_come_from_business_fields_not_cloud_order() -> None:
    """Two jobs with different web-scraper-order values give the same keys."""
    products = DATASETS.get("products")
    one = {"web-scraper-order": "1700000000-1", "sku": " SKU-1 ", "price": "1"}
    two = {"web-scraper-order": "1800000000-9", "sku": "SKU-1", "price": "2"}
    assert entity_key(one, products) == entity_key(two, products) == "SKU-1"
    assert observation_key("products", "2026-12-02", "SKU-1") == observation_key(
        "products", "2026-12-02", "SKU-1"
    )
    assert observation_key("products", "2026-12-02", "SKU-1") != observation_key(
        "products", "2026-12-03", "SKU-1"
    )


def test_url_keys_are_normalised_and_multi_field_keys_are_unambiguous() -> None:
    """A URL key ignores spelling; a two-field key keeps its fields apart."""
    pages = DATASETS.get("pages")
    assert entity_key({"url": "https://A.example/x/"}, pages) == entity_key(
        {"url": "https://a.example/x?utm_medium=e"}, pages
    )
    pairs = DATASETS.get("pairs")
    assert entity_key({"shop": "a|b", "sku": "c"}, pairs) != entity_key(
        {"shop": "a", "sku": "b|c"}, pairs
    )


def test_a_record_without_its_key_has_no_entity_key() -> None:
    """Empty or missing key fields give None, so the record is counted, not stored."""
    products = DATASETS.get("products")
    assert entity_key({"sku": ""}, products) is None
    assert entity_key({"price": "1"}, products) is None


def test_the_payload_hash_ignores_cloud_meta_fields_and_key_order() -> None:
    """Only business fields are hashed, in one canonical spelling."""
    a = payload_of({"web-scraper-order": "1-1", "web-scraper-start-url": "u", "b": 1, "a": 2})
    b = payload_of({"a": 2, "b": 1, "web-scraper-order": "2-7"})
    assert payload_hash(canonical_json(a)) == payload_hash(canonical_json(b))


def test_partition_is_the_field_or_the_start_url_host() -> None:
    """The partition field wins; without it the start URL's host splits the run."""
    products = DATASETS.get("products")
    pages = DATASETS.get("pages")
    assert partition_of({"retailer": "alpha"}, products) == "alpha"
    assert (
        partition_of({"web-scraper-start-url": "https://Beta.example/x"}, pages) == "beta.example"
    )


def test_the_canonical_spelling_is_stable_for_every_json_value() -> None:
    """Unicode, nesting, floats and integers beyond 64 bits all get one deterministic text."""
    payload = {"b": [1, 2.5, None, True], "a": "Grüße \u2028 /x", "big": 2**70, "n": {"z": 1}}
    text = canonical_json(payload)
    assert text == canonical_json(dict(reversed(list(payload.items()))))
    assert text.startswith('{"a":"Grüße')
    assert str(2**70) in text
    small = {"b": 1, "a": "é"}
    assert canonical_json(small) == '{"a":"é","b":1}'


RECORDS: list[dict[str, Any]] = [
    {"sku": "A-1", "retailer": "alpha", "title": "Kettle", "price": "9.99"},
    {"sku": "  A-2 ", "retailer": " ", "web-scraper-start-url": "https://Beta.example/x"},
    {"sku": 17, "retailer": 3.5, "web-scraper-order": "1-1", "web-scraper-start-url": 5},
    {"sku": ["x", {"b": 1, "a": None}], "retailer": {"z": [True, False]}},
    {"sku": "", "retailer": "alpha"},
    {"sku": None, "url": "https://Shop.example/p/1/?utm_source=x#top"},
    {"url": "HTTP://shop.example:80/p/2", "shop": "s", "sku": "B-1", "big": 2**70},
    {"shop": "s", "sku": True, "a": "Grüße \u2028 \t\\", "n": {"y": [1, 2.5]}},
    {"shop": " ", "sku": "B-2", "web-scraper-start-url": ""},
    {"title": "no key at all", "web-scraper-start-url": "https://gamma.example/"},
]


@pytest.mark.parametrize("dataset", ["products", "pages", "pairs"])
@pytest.mark.parametrize("record", RECORDS)
def test_a_sync_stages_the_same_identity_as_the_identity_rules(
    record: dict[str, Any], dataset: str
) -> None:
    """The one-call identity a sync uses per record agrees with every identity rule above."""
    config = DATASETS.get(dataset)
    staged = RecordIdentity(config, "2026-12-03")(record)
    key = entity_key(record, config)
    if key is None:
        assert staged is None
        return
    canonical = canonical_json(payload_of(record))
    start = record.get("web-scraper-start-url")
    assert staged == (
        observation_key(dataset, "2026-12-03", key),
        key,
        partition_of(record, config),
        start if isinstance(start, str) else None,
        canonical,
        payload_hash(canonical),
    )
