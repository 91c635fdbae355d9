"""Partitions by start URL host, as a dataset without a partition field gets them from Cloud."""

from __future__ import annotations

from flask import Flask

from simulator import CloudState
from sync.bootstrap import Services
from tests.acceptance.flow import (
    DATASETS_TOML,
    product_records,
    published,
    run_id_of,
    settle,
    use_datasets,
    verdict,
)
from tests.harness import notify, products_sitemap

HOSTS = ["https://alpha.example/", "https://beta.example/", "https://gamma.example/"]


def test_a_job_over_three_start_urls_is_judged_per_host(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """Without a partition field each start URL's host is a partition: the host whose prices
    are junk is quarantined, the other two are published."""
    text = DATASETS_TOML.replace('partition = "retailer"\n', "").replace(
        'policy = "reject"', 'policy = "publish_passing"'
    )
    services = use_datasets(services, text)
    records = product_records(60, retailers=("alpha.example", "beta.example", "gamma.example"))
    for record in records:
        if record["retailer"] == "gamma.example":
            record["price"] = "call for price"
    job_id = cloud.create_job(products_sitemap(cloud), start_urls=HOSTS)
    cloud.run_job(job_id, records=records)
    notify(web, job_id)
    settle(services)
    found = verdict(services, run_id_of(job_id))
    states = {p["partition"]: (p["state"], p["records"]) for p in found.partitions}
    assert states == {
        "alpha.example": ("passed", 20),
        "beta.example": ("passed", 20),
        "gamma.example": ("quarantined", 20),
    }
    assert found.state == "published"
    assert published(services) == run_id_of(job_id)
