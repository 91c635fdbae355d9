"""A faithful local Web Scraper Cloud: the API, notifications, the rate limit and faults."""

from __future__ import annotations

from simulator.app import create_app
from simulator.records import generate_records
from simulator.server import SimServer, serve
from simulator.state import CloudState

__all__ = ["CloudState", "SimServer", "create_app", "generate_records", "serve"]
