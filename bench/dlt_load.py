"""The peer of ``bench/pipeline_bench.py``: one dlt load of a Cloud export into PostgreSQL.

Run by the python of ``bench/.venv-dlt`` (dlt is no dependency of scrapesync), never imported by
the project. It reads the job's gzip JSON Lines export over HTTP with ``requests``, parses each
line with orjson, drops Web Scraper's two meta fields (scrapesync keeps them as provenance, not
as columns) and yields the records in lists of 1,000, as dlt's docs advise, to a resource with
``write_disposition="merge"``, primary key ``sku`` and ``price`` typed ``decimal``: the same typed
table scrapesync's ``[columns]`` arm publishes. dlt's defaults otherwise (PostgreSQL's
``insert_values`` file format, the ``delete-insert`` merge strategy).

What is timed: ``pipeline.run`` of the export (download, parse, extract, normalise, load and
merge), measured here with ``time.perf_counter``. Before it, untimed, the process imports dlt and
runs one 10-record load of the same resource shape into a throwaway dataset, so that dlt's lazy
imports and its first connection are start-up, as scrapesync's process start-up is. After it,
untimed, the table's row count and sum of prices are read back. One JSON object on stdout says
it all::

    bench/.venv-dlt/bin/python bench/dlt_load.py --export-url URL --database-url URL \\
        --pipelines-dir DIR --dataset dlt_products
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from typing import Any

BATCH = 1_000
META_FIELDS = ("web-scraper-order", "web-scraper-start-url")
PIPELINE = "scrapesync_pipeline_bench"
WARM_UP_RECORDS = 10


def products(records: Any, dlt: Any) -> Any:
    """The export's records as a dlt resource: merged on ``sku``, ``price`` a decimal."""
    return dlt.resource(
        records,
        name="products",
        write_disposition="merge",
        primary_key="sku",
        columns={"price": {"data_type": "decimal"}},
    )


def export_records(url: str) -> Iterator[list[dict[str, Any]]]:
    """The records of a gzip JSON Lines export, downloaded as a stream, in lists of BATCH."""
    import orjson
    import requests

    with requests.get(url, stream=True, timeout=60) as response:
        response.raise_for_status()
        batch: list[dict[str, Any]] = []
        for line in response.iter_lines(chunk_size=256 * 1024):
            if not line:
                continue
            record = orjson.loads(line)
            for field in META_FIELDS:
                record.pop(field, None)
            batch.append(record)
            if len(batch) >= BATCH:
                yield batch
                batch = []
        if batch:
            yield batch


def warm_up(dlt: Any, destination: Any, pipelines_dir: str, dataset: str) -> None:
    """A tiny load of the same shape into another dataset: pays dlt's lazy imports."""
    rows = [
        {"sku": f"WARM-{i}", "title": "t", "price": "1.00", "retailer": "warm.example"}
        for i in range(WARM_UP_RECORDS)
    ]
    pipeline = dlt.pipeline(
        pipeline_name=f"{PIPELINE}_warm",
        destination=destination,
        dataset_name=f"{dataset}_warm",
        pipelines_dir=pipelines_dir,
    )
    pipeline.run(products(rows, dlt))


def main(argv: list[str] | None = None) -> int:
    """Load the export once with dlt and print what it took and what the table holds."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--export-url", required=True)
    parser.add_argument("--database-url", required=True, help="postgresql://user@host:port/db")
    parser.add_argument("--pipelines-dir", required=True, help="dlt's local state, kept per run")
    parser.add_argument("--dataset", required=True, help="the schema dlt loads into")
    parser.add_argument("--loader-file-format", help="dlt's file format (default: dlt's choice)")
    args = parser.parse_args(argv)

    import dlt

    destination = dlt.destinations.postgres(credentials=args.database_url)
    warm_up(dlt, destination, args.pipelines_dir, args.dataset)
    pipeline = dlt.pipeline(
        pipeline_name=PIPELINE,
        destination=destination,
        dataset_name=args.dataset,
        pipelines_dir=args.pipelines_dir,
    )
    started_at = time.time()
    started = time.perf_counter()
    info = pipeline.run(
        products(export_records(args.export_url), dlt),
        loader_file_format=args.loader_file_format,
    )
    seconds = time.perf_counter() - started
    info.raise_on_failed_jobs()
    with pipeline.sql_client() as client:
        table = client.make_qualified_table_name("products")
        ((rows, price_sum),) = client.execute_sql(f"SELECT count(*), sum(price) FROM {table}")  # noqa: S608 - dlt's own table name
        (price_type,) = client.execute_sql(
            "SELECT data_type FROM information_schema.columns "
            "WHERE table_schema = %s AND table_name = 'products' AND column_name = 'price'",
            args.dataset,
        )[0]
    print(
        json.dumps(
            {
                "seconds": seconds,
                "started_at": started_at,
                "rows": int(rows),
                "price_sum": str(price_sum),
                "price_type": price_type,
                "load_ids": list(info.loads_ids),
                "dlt": dlt.__version__,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
