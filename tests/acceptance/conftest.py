"""Fixtures for acceptance, publication and delivery: the sync fixtures (simulator as Cloud, real
databases and Redis) with a dataset of one run per job that announces to a signed HTTP
receiver."""

from __future__ import annotations

import pytest

from config.datasets import Datasets, parse_datasets
from tests.acceptance.flow import DATASETS_TOML, Receiver, wire_receiver


@pytest.fixture
def datasets() -> Datasets:
    """One run per scraping job (window = "job"), so consecutive jobs make consecutive runs."""
    return parse_datasets(DATASETS_TOML, source="tests")


@pytest.fixture(autouse=True)
def receiver(request: pytest.FixtureRequest) -> Receiver | None:
    """The HTTP destination of the test dataset, wired as the relay's transport, for every test
    that has services (the pure rule tests stay free of databases)."""
    if "services" not in request.fixturenames:
        return None
    return wire_receiver(request.getfixturevalue("services"))
