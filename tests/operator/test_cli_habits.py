"""CLI habits people already have: ``-h``, ``--json`` on every verb that prints a result, log
lines on standard error and results on standard output, and ``--out -``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from flask import Flask

from scrapesync.cli import main
from simulator import CloudState, SimServer, generate_records
from sync.bootstrap import Services
from sync.runs import launch
from tests.harness import BIN, deployment_env, drain, notify

# Long-running sessions, not results: a server until Ctrl-C, and the narrated demo.
NO_RESULT = {"simulator", "demo"}


def _verbs(group: click.Group, prefix: str = "") -> list[tuple[str, click.Command]]:
    found: list[tuple[str, click.Command]] = []
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            found += _verbs(command, f"{prefix}{name} ")
        else:
            found.append((f"{prefix}{name}", command))
    return found


def _paths(group: click.Group, prefix: tuple[str, ...] = ()) -> list[list[str]]:
    """Every command and group under ``group``, as the words that name it."""
    found: list[list[str]] = []
    for name, command in sorted(group.commands.items()):
        found.append([*prefix, name])
        if isinstance(command, click.Group):
            found += _paths(command, (*prefix, name))
    return found


@pytest.mark.parametrize("verb", [[], *_paths(main)], ids=" ".join)
def test_dash_h_works_like_help(verb: list[str]) -> None:
    """`scrapesync -h` and `scrapesync VERB -h`, for every verb and group, print what `--help`
    prints."""
    short = CliRunner().invoke(main, [*verb, "-h"])
    long = CliRunner().invoke(main, [*verb, "--help"])
    assert short.exit_code == long.exit_code == 0
    assert short.output == long.output
    assert "Usage:" in short.output


def test_every_verb_that_prints_a_result_has_json() -> None:
    """Each command, db's included, takes --json, but the simulator and the demo."""
    missing = [
        name
        for name, command in _verbs(main)
        if name not in NO_RESULT and "--json" not in {o for p in command.params for o in p.opts}
    ]
    assert missing == []


def _published(web: Flask, services: Services, cloud: CloudState, n: int = 12) -> str:
    outcome = launch.launch(services, "products", window="2026-12-02")
    assert outcome.job_id is not None
    cloud.set_records(outcome.job_id, [dict(r) for r in generate_records(n)])
    cloud.run_job(outcome.job_id)
    notify(web, outcome.job_id, custom_id=outcome.run_id)
    drain(services)
    return outcome.run_id


@pytest.mark.redis
@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_export_out_dash_writes_the_records_to_standard_output(
    web: Flask, services: Services, cloud: CloudState, tmp_path: Path, fmt: str
) -> None:
    """`export products --out -` writes the file to stdout (and nothing else), the summary to
    stderr, and leaves no file behind; `--json` says where a file export went."""
    run_id = _published(web, services, cloud)
    result = CliRunner().invoke(main, ["export", "products", "--out", "-", "--format", fmt])
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    if fmt == "jsonl":
        assert len(lines) == 12
        assert all("entity_key" in json.loads(line) for line in lines)
    else:
        assert len(lines) == 13
        assert lines[0].startswith("entity_key")
    assert f"run={run_id}" in result.stderr
    assert "records=12" in result.stderr
    shown = CliRunner().invoke(main, ["export", "products", "--out", str(tmp_path), "--json"])
    assert shown.exit_code == 0, shown.output
    described = json.loads(shown.stdout)
    assert described["records"] == 12
    assert Path(described["path"]).parent == tmp_path


@pytest.mark.redis
def test_sync_json_pipes_into_a_json_reader_with_log_lines_on_stderr(
    tmp_path: Path, database_url: str, sim: SimServer, cloud: CloudState, services: Services
) -> None:
    """`scrapesync sync JOB --json | jq`: standard output is one JSON document (the outcome and
    the run's verdict), the JSON log lines go to standard error."""
    job_id = cloud.create_job(next(iter(cloud.sitemaps)))
    cloud.set_records(job_id, [dict(r) for r in generate_records(8)])
    cloud.run_job(job_id)
    env = deployment_env(tmp_path, database_url=database_url, sim=sim)
    done = subprocess.run(
        [str(BIN / "scrapesync"), "sync", str(job_id), "--json"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout)
    assert outcome["outcome"] == "committed"
    assert outcome["counts"]["inserted"] == 8
    assert outcome["verdict"]["state"] in ("published", "accepted", "rejected")
    logged = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    assert any(entry["event"] == "attempt.started" for entry in logged)


def _json_of(*args: str) -> dict[str, object]:
    """`scrapesync ARGS --json`: standard output is one JSON document."""
    result = CliRunner().invoke(main, [*args, "--json"])
    assert result.exit_code == 0, result.output
    values: dict[str, object] = json.loads(result.stdout)
    return values


@pytest.mark.redis
def test_launch_and_the_decisions_print_one_json_document_with_json(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """`launch`, `cancel`, `reject`, `accept` and `baseline reset` with --json: standard output
    parses as one JSON document that says what was done."""
    published = _published(web, services, cloud)
    launched = _json_of("launch", "products", "--window", "2026-12-03")
    assert (launched["run_id"], launched["state"], launched["created_job"]) == (
        "products-2026-12-03",
        "created",
        True,
    )
    cancelled = _json_of("cancel", "products-2026-12-03", "--reason", "the site is down")
    assert (cancelled["action"], cancelled["state"], cancelled["decided_by"]) == (
        "cancel",
        "cancelled",
        "operator",
    )
    rejected = _json_of("reject", published, "--reason", "wrong currency")
    assert (rejected["state"], rejected["reason"], rejected["changed"]) == (
        "rejected",
        "wrong currency",
        True,
    )
    accepted = _json_of("accept", published, "--reason", "the currency was right")
    assert (accepted["action"], accepted["state"]) == ("accept", "published")
    reset = _json_of("baseline", "reset", "products", "--reason", "the new normal")
    assert (reset["action"], reset["dataset"], reset["changed"]) == (
        "baseline_reset",
        "products",
        True,
    )
