"""`scrapesync simulator`: a local Web Scraper Cloud in the foreground, for staging and demos."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

pytestmark = pytest.mark.slow


def test_the_simulator_command_serves_the_cloud_api_with_its_sitemaps() -> None:
    """It prints its API URL, answers with the sitemaps it was asked to create, and the token
    it was given is the one it accepts."""
    command = "from scrapesync.cli import run; run()"
    args = ["simulator", "--port", "0", "--token", "t-123", "--sitemap", "products"]
    process = subprocess.Popen(
        [sys.executable, "-u", "-c", command, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("simulated Web Scraper Cloud at http://127.0.0.1:"), line
        api_url = line.split(" at ", 1)[1].split()[0]
        listed = httpx.get(f"{api_url}sitemaps", params={"api_token": "t-123"}, timeout=5)
        assert listed.status_code == 200
        assert [s["name"] for s in listed.json()["data"]] == ["products"]
        refused = httpx.get(f"{api_url}sitemaps", params={"api_token": "other"}, timeout=5)
        assert refused.status_code == 401
    finally:
        process.terminate()
        process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()
        if process.stderr is not None:
            process.stderr.close()
