"""JSON Lines, CSV and XLSX downloads, gzip, and lazily generated records."""

from __future__ import annotations

import gzip
import io
import json
import sys
import time
import zipfile
from collections.abc import Callable

import httpx

from simulator import CloudState, generate_records
from simulator.records import php_json

PLAIN = {"Accept-Encoding": "identity"}


def test_jsonl_puts_meta_keys_first_escapes_slashes_and_ends_each_line(
    client: httpx.Client, state: CloudState, make_job: Callable[..., int]
) -> None:
    """Each record is one PHP-style JSON line: order and start URL first, \\/ escaped, \\n end."""
    job_id = make_job()
    records = [{"title": 'A/B "quoted"\nnext', "price": "1.50"}, {"title": "Ünïcode"}]
    state.run_job(job_id, records=records)
    response = client.get(f"scraping-job/{job_id}/json", headers=PLAIN)
    assert response.status_code == 200
    assert "content-encoding" not in response.headers
    body = response.text
    t = state.jobs[job_id].time_created
    assert body.startswith(
        f'{{"web-scraper-order":"{t}-1","web-scraper-start-url":"https:\\/\\/shop.example\\/",'
        '"title":"A\\/B \\"quoted\\"\\nnext","price":"1.50"}\n'
    )
    assert body.endswith("\n")
    assert body.count("\n") == 2
    assert "\\u00dcn\\u00efcode" in body
    parsed = [json.loads(line) for line in body.splitlines()]
    assert list(parsed[1]) == ["web-scraper-order", "web-scraper-start-url", "title"]
    assert parsed[1]["title"] == "Ünïcode"


def test_a_job_without_records_downloads_an_empty_body(
    client: httpx.Client, make_job: Callable[..., int]
) -> None:
    """JSON of a job with no records is 200 with an empty body, in any status."""
    response = client.get(f"scraping-job/{make_job()}/json", params={"raw": "true"})
    assert response.status_code == 200
    assert response.content == b""


def test_downloads_are_gzipped_when_the_client_accepts_gzip(
    client: httpx.Client, state: CloudState, make_job: Callable[..., int]
) -> None:
    """Accept-Encoding: gzip gets a gzip body with Content-Encoding: gzip."""
    job_id = make_job()
    state.run_job(job_id, n=500)
    plain = client.get(f"scraping-job/{job_id}/json", headers=PLAIN).content
    with client.stream(
        "GET", f"scraping-job/{job_id}/json", headers={"Accept-Encoding": "gzip"}
    ) as response:
        assert response.headers["content-encoding"] == "gzip"
        raw = b"".join(response.iter_raw())
    assert raw[:2] == b"\x1f\x8b"
    assert gzip.decompress(raw) == plain
    assert len(raw) < len(plain) / 3


def test_csv_has_a_bom_an_unquoted_header_quoted_cells_and_crlf(
    client: httpx.Client, state: CloudState, make_job: Callable[..., int]
) -> None:
    """CSV follows Cloud: BOM, bare header, every cell quoted with "" escapes, CRLF, null."""
    job_id = make_job()
    state.run_job(job_id, records=[{"title": 'say "hi"', "price": None}, {"title": "b,c"}])
    body = client.get(f"scraping-job/{job_id}/csv", headers=PLAIN).content.decode("utf-8")
    t = state.jobs[job_id].time_created
    assert body == (
        "\ufeffweb-scraper-order,web-scraper-start-url,title,price\r\n"
        f'"{t}-1","https://shop.example/","say ""hi""","null"\r\n'
        f'"{t}-2","https://shop.example/","b,c","null"\r\n'
    )


def test_the_csv_bom_can_be_switched_off(
    client: httpx.Client, state: CloudState, make_job: Callable[..., int]
) -> None:
    """With csv_bom off the file starts with the header; an empty job is just the header."""
    state.csv_bom = False
    body = client.get(f"scraping-job/{make_job()}/csv", headers=PLAIN).text
    assert body == "web-scraper-order,web-scraper-start-url\r\n"


def test_xlsx_is_a_workbook_with_a_header_row(
    client: httpx.Client, state: CloudState, make_job: Callable[..., int]
) -> None:
    """The XLSX download is a zip holding one worksheet with the records."""
    job_id = make_job()
    state.run_job(job_id, records=[{"title": "<b>&"}])
    response = client.get(f"scraping-job/{job_id}/xlsx")
    assert response.headers["content-type"].endswith("spreadsheetml.sheet")
    with zipfile.ZipFile(io.BytesIO(response.content)) as workbook:
        sheet = workbook.read("xl/worksheets/sheet1.xml").decode()
    assert "web-scraper-order" in sheet
    assert "&lt;b&gt;&amp;" in sheet


def test_generated_records_are_deterministic_product_rows() -> None:
    """generate_records renders the same sku, title, price, url and retailer per seed and index."""
    rows = generate_records(4, seed=7)
    assert list(rows) == list(generate_records(4, seed=7))
    assert rows[2]["sku"] == "SKU-000002"
    assert rows[2]["url"] == "https://gamma.example/p/2"
    assert rows[2]["retailer"] == "gamma.example"
    assert list(rows[0]) == ["sku", "title", "price", "url", "retailer"]
    assert all(f"{float(row['price']):.2f}" == row["price"] for row in rows)
    other_seed = [row["price"] for row in generate_records(20, seed=8)]
    assert other_seed != [row["price"] for row in generate_records(20, seed=7)]
    assert generate_records(2, start=2, seed=7)[0] == rows[2]
    for index in range(50):
        assert rows.json_body(index) == php_json(rows.record(index))


def test_a_million_generated_records_are_not_materialised(
    client: httpx.Client, state: CloudState, make_job: Callable[..., int]
) -> None:
    """set_generated stores only (n, seed, partitions); the download streams lazily."""
    job_id = make_job()
    started = time.perf_counter()
    state.set_generated(job_id, 1_000_000, seed=3)
    state.finish_job(job_id)
    assert time.perf_counter() - started < 0.05
    batch = state.jobs[job_id].records.batches[0]
    assert sys.getsizeof(batch) < 1024
    assert len(state.jobs[job_id].records) == 1_000_000
    assert client.get(f"scraping-job/{job_id}").json()["data"]["stored_record_count"] == 1_000_000
    quality = client.get(f"scraping-job/{job_id}/data-quality").json()["data"]
    assert quality["overall_data_quality_success"] is True
    with client.stream("GET", f"scraping-job/{job_id}/json") as response:
        lines = response.iter_lines()
        first = [json.loads(next(lines)) for _ in range(3)]
    assert [row["sku"] for row in first] == ["SKU-000000", "SKU-000001", "SKU-000002"]
    assert time.perf_counter() - started < 2


def test_added_records_keep_their_order_after_generated_ones(
    client: httpx.Client, state: CloudState, make_job: Callable[..., int]
) -> None:
    """add_records appends explicit or generated batches; order numbers keep counting."""
    job_id = make_job()
    state.set_generated(job_id, 2)
    state.add_records(job_id, [{"sku": "X-1", "note": "extra"}])
    state.add_records(job_id, generate_records(1, start=10))
    rows = [
        json.loads(line) for line in client.get(f"scraping-job/{job_id}/json").text.splitlines()
    ]
    assert [row["sku"] for row in rows] == ["SKU-000000", "SKU-000001", "X-1", "SKU-000010"]
    assert [row["web-scraper-order"].split("-")[1] for row in rows] == ["1", "2", "3", "4"]
    header = client.get(f"scraping-job/{job_id}/csv").text.splitlines()[0]
    assert header.endswith("sku,title,price,url,retailer,note")
