"""Fixtures for delivery: the acceptance fixtures, and a real loopback receiver for what only a
socket can show (a timeout after the request was received)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.acceptance.conftest import datasets, receiver, services  # noqa: F401 - shared fixtures
from tests.acceptance.flow import SECRET
from tests.fakes import Receiver


@pytest.fixture
def loopback() -> Iterator[Receiver]:
    """A signature-checking receiver on a loopback port, answering 204."""
    found = Receiver(secret=SECRET)
    with found.serve():
        yield found
