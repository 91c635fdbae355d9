"""Fixtures for the typed tables: the acceptance tests' dataset (one run per job, announcing
to a signed HTTP receiver), switched to typed columns by each test that needs them."""

from __future__ import annotations

import pytest

from config.datasets import Datasets
from sync.bootstrap import Services
from tests.acceptance.flow import SECRET, wire_receiver
from tests.datasets.flow import typed_datasets
from tests.fakes import Receiver
from tests.harness import datasets_from


@pytest.fixture
def datasets() -> Datasets:
    """The products dataset with typed columns and a watch list."""
    return datasets_from(typed_datasets())


@pytest.fixture
def receiver() -> Receiver:
    """The HTTP destination of the test dataset (signature-checking)."""
    return Receiver(secret=SECRET)


@pytest.fixture
def services(services: Services, receiver: Receiver) -> Services:
    """The sync fixtures' services with the receiver wired as the relay's transport."""
    return wire_receiver(services, receiver)
