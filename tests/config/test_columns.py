"""The datasets file's columns, watch, retain_windows and max_changes_per_event tables."""

from __future__ import annotations

import pytest

from config.columns import Column, Watch, column_name_for, default_columns
from config.datasets import DatasetsFileError, parse_datasets

BASE = """
[datasets.products]
sitemap = "products"
entity_key = ["sku"]
"""


def test_columns_name_a_type_or_a_field_and_type() -> None:
    """A column is a type, or a table naming the record field, the type and the decimal mark."""
    products = parse_datasets(
        BASE
        + """
        retain_windows = 7
        max_changes_per_event = 50
        [datasets.products.columns]
        sku = "text"
        price = { type = "numeric", decimal = "," }
        in_stock = { field = "availability", type = "boolean" }
        [datasets.products.watch]
        price = { percent = 1 }
        in_stock = true
        """
    ).get("products")
    assert products.columns == (
        Column("sku", "sku", "text"),
        Column("price", "price", "numeric", ","),
        Column("in_stock", "availability", "boolean"),
    )
    assert products.watch == (Watch("price", percent=1.0), Watch("in_stock"))
    assert products.retain_windows == 7
    assert products.max_changes_per_event == 50


def test_defaults_keep_everything_and_watch_every_column() -> None:
    """With no columns, watch or retention the dataset keeps every window and every column
    counts; events carry at most 1000 changes."""
    products = parse_datasets(BASE).get("products")
    assert products.columns == ()
    assert products.watch == ()
    assert products.retain_windows is None
    assert products.max_changes_per_event == 1000


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('[datasets.products.columns]\nprice = "money"', "type must be one of"),
        ('[datasets.products.columns]\nPrice = "numeric"', "a column name is lower case"),
        ('[datasets.products.columns]\nrun_id = "text"', "every dataset table has already"),
        ('[datasets.products.columns]\nprice = { type = "text", decimal = "," }', "decimal"),
        ('[datasets.products.columns]\nprice = { type = "numeric", decimal = ";" }', "decimal"),
        (
            '[datasets.products.columns]\na = { field = "x" }\nb = { field = "x" }',
            "already column 'a'",
        ),
        (
            '[datasets.products.columns]\nprice = "numeric"\n[datasets.products.watch]\n'
            "cost = true",
            "no such column",
        ),
        (
            '[datasets.products.columns]\ntitle = "text"\n[datasets.products.watch]\n'
            "title = { percent = 1 }",
            "needs an integer or numeric column",
        ),
        ("[datasets.products.watch]\nprice = { percent = -1 }", "non-negative"),
        ("[datasets.products.watch]\nprice = false", "must be true"),
        ("retain_windows = 0", "retain_windows must be a whole number"),
        ("max_changes_per_event = 2.5", "max_changes_per_event must be a whole number"),
    ],
)
def test_a_wrong_table_is_a_clear_error(table: str, message: str) -> None:
    """Each mistake names the dataset, the key and what is expected."""
    before, _, after = table.partition("[")
    text = BASE + before + ("[" + after if after else "")
    with pytest.raises(DatasetsFileError, match=message) as caught:
        parse_datasets(text, source="datasets.toml")
    assert "datasets.toml: [datasets.products]" in str(caught.value)


def test_a_dataset_name_leaves_room_for_its_table_names() -> None:
    """Table names carry the dataset name and a suffix, so a very long name is refused."""
    with pytest.raises(DatasetsFileError, match="at most 50 characters"):
        parse_datasets(BASE.replace("products", "p" * 51))


def test_fields_become_plain_sql_column_names() -> None:
    """With no columns table each field is a text column with a name SQL needs no quotes for."""
    assert column_name_for("Product name") == "product_name"
    assert column_name_for("price-€") == "price"
    assert column_name_for("2nd price") == "f_2nd_price"
    assert column_name_for("run_id") == "f_run_id"
    assert len(column_name_for("x" * 100)) == 63
    columns = default_columns(["title", "Title", "price"])
    assert {"price", "title"} <= {c.name for c in columns}
    assert {c.field for c in columns} == {"title", "Title", "price"}
    assert len({c.name for c in columns}) == 3  # the clash gets a distinct name
    assert all(c.type == "text" for c in columns)


def test_watch_tolerances() -> None:
    """A percent or absolute tolerance lets small moves pass; appearing values always count."""
    percent, absolute, anything = Watch("p", percent=1), Watch("p", absolute=0.05), Watch("t")
    assert percent.matters(100, 101.5)
    assert not percent.matters(100, 100.5)
    assert not percent.matters(100, 101)  # exactly the tolerance is within it
    assert absolute.matters(10, 10.1)
    assert not absolute.matters(10, 10.04)
    assert percent.matters(None, 5)
    assert percent.matters(5, None)
    assert percent.matters(0, 1)
    assert anything.matters("a", "b")
    assert not anything.matters("a", "a")
