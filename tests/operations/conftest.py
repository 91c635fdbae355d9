"""Fixtures for operations: the sync path's services, web app and simulated Cloud, reused."""

from __future__ import annotations

from tests.sync.conftest import cloud, datasets, services, sleeps, web  # noqa: F401 - fixtures

API_TOKEN = "sim-token"
