"""A process made ready for work (the worker's main process before it forks its work horses,
``scrapesync sync`` before its attempt): what a sync would import and load on first use is in,
and the collector's full passes no longer walk what the process held at start-up."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import gc, json, sys
import sync.bootstrap
before = len(gc.get_objects())
from sync import http, warm
warm.warm()
print(json.dumps({
    "tracked_before": before,
    "tracked_after": len(gc.get_objects()),
    "frozen": gc.get_freeze_count(),
    "modules": [m for m in ("httpcore", "sync.ingest.tasks", "sync.runs.evaluation")
                if m in sys.modules],
    "tls_made": http.tls.cache_info().currsize,
}))
"""


def test_a_warmed_process_holds_what_a_sync_loads_and_its_heap_is_out_of_full_collections() -> None:
    """In a fresh interpreter: after warm(), the modules a sync and its evaluation import, the
    HTTP core httpx loads with its first client and the shared TLS context are there, and the
    objects the process holds are frozen, so a full collection walks almost none of them."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120
    )
    found = json.loads(done.stdout)
    assert found["modules"] == ["httpcore", "sync.ingest.tasks", "sync.runs.evaluation"]
    assert found["tls_made"] == 1
    assert found["frozen"] > found["tracked_before"]
    assert found["tracked_after"] < found["tracked_before"] // 20
