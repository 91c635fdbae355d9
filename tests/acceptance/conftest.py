"""Fixtures for acceptance, publication and delivery: the sync fixtures (simulator as Cloud, real
databases and Redis) with a dataset of one run per job that announces to a signed HTTP
receiver."""

from __future__ import annotations

import pytest

from config.datasets import Datasets
from sync.bootstrap import Services
from tests.acceptance.flow import DATASETS_TOML, SECRET, wire_receiver
from tests.fakes import Receiver
from tests.harness import datasets_from


@pytest.fixture
def datasets() -> Datasets:
    """One run per scraping job (window = "job"), so consecutive jobs make consecutive runs."""
    return datasets_from(DATASETS_TOML)


@pytest.fixture
def receiver() -> Receiver:
    """The HTTP destination of the test dataset (signature-checking)."""
    return Receiver(secret=SECRET)


@pytest.fixture
def services(services: Services, receiver: Receiver) -> Services:
    """The sync fixtures' services with the receiver wired as the relay's transport (the pure
    rule tests ask for neither and stay free of databases)."""
    return wire_receiver(services, receiver)
