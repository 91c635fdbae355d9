"""Operator decisions through the CLI and the real worker path: a rejected run accepted by the
operator is published and announced with the operator's reason, a baseline reset makes the next
run of the new size pass, a reject falls back to the last accepted run, a cancel stops waiting
for a run, and each is idempotent and shown by ``status`` and ``/status``."""

from __future__ import annotations

import dataclasses
import json

import pytest
from click.testing import CliRunner
from flask import Flask
from sqlalchemy import select

from scrapesync.cli import main
from simulator import CloudState
from sync.bootstrap import Services
from sync.models import OperatorDecision, OutboxEvent
from tests.acceptance.flow import (
    collect,
    history_datasets,
    product_records,
    published,
    settle,
    use_datasets,
    verdict,
)
from tests.fakes import Receiver
from webhooks import create_app

pytestmark = pytest.mark.redis

REASON = "the shop dropped its clearance range for good"


def cli(*args: str) -> tuple[int, str]:
    """Run ``scrapesync ARGS``; its exit code and output."""
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def status_page(services: Services) -> str:
    """The /status page as the operator reads it."""
    app = create_app(
        dataclasses.replace(
            services, settings=dataclasses.replace(services.settings, status_token="tok")
        )
    )
    return app.test_client().get("/status?token=tok").get_data(as_text=True)


def events_of(services: Services, run_id: str) -> list[str]:
    """The types of a run's outbox events, oldest first."""
    with services.uow.begin() as session:
        return list(
            session.execute(
                select(OutboxEvent.event_type)
                .where(OutboxEvent.run_id == run_id)
                .order_by(OutboxEvent.id)
            ).scalars()
        )


@pytest.fixture
def shrunk(web: Flask, services: Services, cloud: CloudState) -> tuple[Services, list[str], str]:
    """Two accepted runs of 400 records, then one of 240 rejected for a 40% record_drop."""
    services = use_datasets(services, history_datasets())
    accepted = [
        collect(web, services, cloud, product_records(400)),
        collect(web, services, cloud, product_records(400, start=400)),
    ]
    run_id = collect(web, services, cloud, product_records(240, start=800))
    found = verdict(services, run_id)
    assert found.state == "rejected"
    assert [r["code"] for r in found.reasons] == ["record_drop"]  # its figures: test_history
    return services, accepted, run_id


def test_accept_publishes_a_rejected_run_and_announces_the_operators_reason(
    web: Flask,
    cloud: CloudState,
    receiver: Receiver,
    shrunk: tuple[Services, list[str], str],
) -> None:
    """accept --reason: the run is published through the typed table and the outbox, the
    destination gets run.accepted with decided_by = operator and the reason, status and /status
    say who decided and why, and accepting again changes nothing."""
    services, _, run_id = shrunk
    code, out = cli("accept", run_id, "--reason", REASON)
    assert code == 0, out
    assert f"run {run_id}: accepted by the operator ({REASON}); now published" in out
    settle(services)
    found = verdict(services, run_id)
    assert (found.state, found.is_published) == ("published", True)
    assert found.reasons[0]["code"] == "operator_accepted"
    assert REASON in found.reasons[0]["message"]
    overridden = found.reasons[0]["detail"]["overridden"]
    assert [r["code"] for r in overridden] == ["record_drop"]
    (accepted,) = [
        r.body for r in receiver.of_type("run.accepted") if r.body["data"]["run_id"] == run_id
    ]
    assert accepted["data"]["decided_by"] == "operator"
    assert accepted["data"]["reason"] == REASON
    assert accepted["data"]["decision"] == "accept"
    assert any(r.body["data"]["run_id"] == run_id for r in receiver.of_type("dataset.published"))
    with services.uow.begin() as session:
        from sync.datasets import schema

        tables = schema.tables_in(session, "products", services.settings.data_schema)
        rows = session.execute(select(tables.current.c.run_id).distinct()).scalars().all()
    assert rows == [run_id]

    code, out = cli("status", run_id)
    assert code == 0, out
    assert "decided by: operator (accept at " in out
    assert REASON in out
    code, out = cli("status", run_id, "--json")
    shown = json.loads(out)
    assert (shown["decided_by"], shown["reason"], shown["state"]) == (
        "operator",
        REASON,
        "published",
    )
    assert [d["action"] for d in shown["decisions"]] == ["accept"]
    code, out = cli("status")
    assert REASON in out
    page = status_page(services)
    assert "Decided by the operator" in page
    assert REASON in page

    events = events_of(services, run_id)
    code, out = cli("accept", run_id, "--reason", "again")
    assert code == 0, out
    assert "already accepted by the operator" in out
    assert events_of(services, run_id) == events
    with services.uow.begin() as session:
        assert len(session.execute(select(OperatorDecision)).all()) == 1


def test_baseline_reset_makes_the_next_run_of_the_new_size_pass(
    web: Flask, cloud: CloudState, shrunk: tuple[Services, list[str], str]
) -> None:
    """After the shrink is accepted, a run of the new size is still held against the old median
    and rejected; once the baseline is reset the next run of that size is published, and a
    second reset with no run since is the same reset."""
    services, _, run_id = shrunk
    assert cli("accept", run_id, "--reason", REASON)[0] == 0
    still = collect(web, services, cloud, product_records(240, start=2000))
    assert [r["code"] for r in verdict(services, still).reasons] == ["record_drop"]

    code, out = cli("baseline", "reset", "products", "--reason", "the new normal")
    assert code == 0, out
    assert "baseline reset (the new normal)" in out
    code, out = cli("baseline", "reset", "products", "--reason", "twice")
    assert code == 0, out
    assert "already reset" in out
    settle(services)
    with services.uow.begin() as session:
        actions = session.execute(select(OperatorDecision.action)).scalars().all()
        resets = (
            session.execute(
                select(OutboxEvent).where(OutboxEvent.event_type == "dataset.baseline_reset")
            )
            .scalars()
            .all()
        )
        assert len(resets) == 1
        assert resets[0].payload["reason"] == "the new normal"
    assert sorted(actions) == ["accept", "baseline_reset"]
    code, out = cli("status")
    (line,) = [x for x in out.splitlines() if x.startswith("products: baseline reset")]
    assert "by the operator at " in line
    assert "(the new normal)" in line
    (shown,) = json.loads(cli("status", "--json")[1])["baseline_resets"]
    assert (shown["dataset"], shown["decided_by"], shown["reason"]) == (
        "products",
        "operator",
        "the new normal",
    )
    assert shown["decided_at"]
    page = status_page(services)
    assert 'class="decision baseline-reset" data-dataset="products"' in page
    assert "baseline reset by the operator at " in page
    assert "the new normal" in page

    after = collect(web, services, cloud, product_records(240, start=3000))
    found = verdict(services, after)
    assert (found.state, found.reasons) == ("published", [])
    # and from there on the run after the reset is the baseline: a 40% drop fails again
    smaller = collect(web, services, cloud, product_records(144, start=4000))
    assert [r["code"] for r in verdict(services, smaller).reasons] == ["record_drop"]


def test_reject_withdraws_a_published_run_and_falls_back_to_the_last_accepted_one(
    web: Flask, services: Services, cloud: CloudState, receiver: Receiver
) -> None:
    """reject --reason on the published run: the previous accepted run is published again,
    run.rejected carries decided_by = operator, and a later evaluation keeps the decision."""
    services = use_datasets(services, history_datasets())
    first = collect(web, services, cloud, product_records(400))
    second = collect(web, services, cloud, product_records(400, start=400))
    assert published(services) == second
    code, out = cli("reject", second, "--reason", "prices were scraped in the wrong currency")
    assert code == 0, out
    settle(services)
    assert published(services) == first
    found = verdict(services, second)
    assert found.state == "rejected"
    assert found.reasons[0]["code"] == "operator_rejected"
    (rejected,) = [r.body for r in receiver.of_type("run.rejected")]
    assert rejected["data"]["decided_by"] == "operator"
    assert rejected["data"]["reason"] == "prices were scraped in the wrong currency"
    events = events_of(services, second)
    code, out = cli("reject", second, "--reason", "again")
    assert code == 0, out
    assert "already rejected by the operator" in out
    assert events_of(services, second) == events
    code, out = cli("status", second)
    assert code == 0, out
    assert "decided by: operator (reject at " in out
    assert "prices were scraped in the wrong currency" in out
    assert "prices were scraped in the wrong currency" in status_page(services)
    # forced re-evaluation (new data, the operator's own re-judgement): the decision stands
    from sync.runs import evaluation

    assert evaluation.evaluate_run(services, second, force=True).state == "rejected"
    assert published(services) == first


def test_a_cancelled_rejection_keeps_no_next_steps_and_says_it_had_no_reason(
    shrunk: tuple[Services, list[str], str],
) -> None:
    """A rejected run cancelled without a reason: its diagnosis, whose next steps (accept,
    rerun) no longer apply to a cancelled run, is gone from status RUN and /status, and the
    page says "no reason given" (it said "None")."""
    services, _, run_id = shrunk
    assert "next: " in cli("status", run_id)[1]  # the rejection's diagnosis
    code, out = cli("cancel", run_id)
    assert code == 0, out
    assert verdict(services, run_id).state == "cancelled"
    assert "next: " not in cli("status", run_id)[1]
    page = status_page(services)
    row = page.split(f"<b>{run_id}</b>")[1].split('<tr class="run"')[0]
    assert "next: " not in row
    assert "<b>cancel</b> at " in row
    assert " UTC: no reason given</p>" in row
    assert "None" not in row


def test_cancel_stops_waiting_for_a_run_that_will_never_complete(
    web: Flask, services: Services, cloud: CloudState
) -> None:
    """A run whose job never finishes stays a candidate; cancel makes it cancelled, announced
    once, and an accepted run cannot be cancelled (reject it instead)."""
    from sync.ingest import run_rows
    from sync.models import Launch

    services = use_datasets(services, history_datasets())
    run_id = "products-2026-12-01"
    with services.uow.begin() as session:
        run_rows.ensure_run(
            session,
            run_id=run_id,
            dataset="products",
            window="2026-12-01",
            sitemap_id=None,
            sitemap_name=None,
            now=services.clock(),
        )
        # the launch's Cloud create never answered: the run waits for it for ever
        session.add(Launch(batch_id="batch-a", run_id=run_id, kind="launch", state="uncertain"))
        session.commit()
    from sync.runs import evaluation

    assert evaluation.evaluate_run(services, run_id).state == "candidate"
    code, out = cli("cancel", run_id, "--reason", "the site is down for a week")
    assert code == 0, out
    assert verdict(services, run_id).state == "cancelled"
    assert events_of(services, run_id) == ["run.cancelled"]
    assert cli("cancel", run_id)[0] == 0
    assert events_of(services, run_id) == ["run.cancelled"]
    code, out = cli("status", run_id)
    assert "decided by: operator (cancel at " in out
    assert "the site is down for a week" in out
    page = status_page(services)
    assert "Decided by the operator: <b>cancel</b>" in page
    assert "the site is down for a week" in page
    good = collect(web, services, cloud, product_records(400, start=100))
    code, out = cli("cancel", good)
    assert code != 0
    assert f"scrapesync reject {good}" in out
    code, out = cli("accept", "no-such-run", "--reason", "x")
    assert code != 0
    assert "no run 'no-such-run'" in out
