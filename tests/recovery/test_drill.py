"""The user's drill (``python -m scrapesync.drill``) run as a user runs it, shortened: the
Procfile's processes under random faults, then the exact end state within the deadline."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scrapesync.processes import SOURCE_TREE

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]

RECORDS = 300


def test_the_drill_runs_the_procfile_under_faults_and_finds_the_exact_end_state(
    tmp_path: Path,
) -> None:
    """Twenty-four seconds of faults every 2-4 s on small jobs every 1.5-3 s, with short maintenance
    intervals (sweep 4 s, lease 12 s, reconcile 15 s): the drill exits 0, and its report counts
    every job's task committed, one observation per record, no key twice, every run decided
    and every outbox event received, within the two-minute deadline, and no run judged more
    than once per committed sync beyond one evaluation per fault."""
    report = tmp_path / "report.json"
    result = subprocess.run(
        [
            *(sys.executable, "-m", "scrapesync.drill", "--minutes", "0.4"),
            *("--records", str(RECORDS), "--jobs-every", "1.5-3", "--faults-every", "2-4"),
            *("--sweep", "4", "--lease", "12", "--reconcile", "15"),
            *("--seed", "32", "--deadline", "120", "--report", str(report)),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=SOURCE_TREE,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    found = json.loads(report.read_text())
    counts, jobs = found["counts"], found["jobs"]
    assert (found["ok"], found["misses"]) == (True, [])
    assert jobs >= 8
    assert sum(found["faults"].values()) >= 5
    assert counts["tasks_committed"] == jobs
    assert counts["observations"] == found["records"] == RECORDS * jobs
    assert counts["duplicate_observation_keys"] == 0
    assert counts["runs_accepted"] + counts["runs_rejected"] == jobs
    assert counts["events_received"] == counts["events"] > 0
    assert found["settled_after"] <= 120
    # the workers' logs: every run judged, and never judged again without a new sync or a fault
    assert found["committed_syncs"] >= jobs
    assert found["evaluations"] >= jobs
    assert found["evaluations_beyond_one_per_sync"] <= sum(found["faults"].values())
    assert "result: OK" in result.stdout
