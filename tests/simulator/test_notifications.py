"""Finished-job notifications: form, retry timing, duplicates and Continue."""

from __future__ import annotations

from collections.abc import Callable

import httpx
from flask import Flask

from simulator import CloudState
from tests.fakes import Receiver


def test_finishing_a_job_posts_cloud_form_fields(
    state: CloudState, notification_receiver: Receiver, make_job: Callable[..., int]
) -> None:
    """The notification is a urlencoded form with the five Cloud fields, no token."""
    job_id = make_job(custom_id="run-9")
    state.run_job(job_id, n=3)
    assert state.wait_for_notifications()
    assert [form for _, form in notification_receiver.arrivals] == [
        {
            "scrapingjob_id": str(job_id),
            "status": "finished",
            "sitemap_id": str(state.jobs[job_id].sitemap_id),
            "sitemap_name": "products",
            "custom_id": "run-9",
        }
    ]
    assert "sim-token" not in repr(state.notifications_sent)
    assert state.notifications_sent[0]["http_status"] == 200
    assert state.notifications_sent[0]["ok"] is True


def test_a_job_without_custom_id_sends_an_empty_one(
    state: CloudState, notification_receiver: Receiver, make_job: Callable[..., int]
) -> None:
    """custom_id is always sent, empty when the job has none; failed jobs notify too."""
    state.run_job(make_job(), n=1, status="failed")
    assert state.wait_for_notifications()
    form = notification_receiver.arrivals[0][1]
    assert (form["custom_id"], form["status"]) == ("", "failed")


def test_a_failing_receiver_is_retried_after_each_delay(
    state: CloudState, notification_receiver: Receiver, make_job: Callable[..., int]
) -> None:
    """Two failures are retried after delays[0] then delays[1]; the third attempt succeeds."""
    notification_receiver.plan = [500, 302]
    state.run_job(make_job(), n=1)
    assert state.wait_for_notifications()
    times = [at for at, _ in notification_receiver.arrivals]
    assert len(times) == 3
    assert times[1] - times[0] >= 0.045  # delays[0], less timer slack
    assert times[2] - times[1] >= 0.095  # delays[1]
    outcomes = [(n["attempt"], n["http_status"], n["ok"]) for n in state.notifications_sent]
    assert outcomes == [(1, 500, False), (2, 302, False), (3, 200, True)]


def test_delivery_gives_up_after_three_attempts(
    state: CloudState, notification_receiver: Receiver, make_job: Callable[..., int]
) -> None:
    """A receiver that always fails sees exactly three attempts."""
    notification_receiver.plan = [503] * 10
    state.run_job(make_job(), n=1)
    assert state.wait_for_notifications()
    assert len(notification_receiver.arrivals) == 3
    assert [n["ok"] for n in state.notifications_sent] == [False, False, False]


def test_a_late_acknowledgement_counts_as_a_failure(
    state: CloudState, notification_receiver: Receiver, make_job: Callable[..., int]
) -> None:
    """A 2xx that arrives after notify_timeout is a timeout, so Cloud sends again."""
    state.notify_timeout = 0.05
    notification_receiver.delay = 0.08
    state.notify_delays = (0.01, 0.01)
    state.run_job(make_job(), n=1)
    assert state.wait_for_notifications()
    assert len(notification_receiver.arrivals) == 3
    assert "timeout" in str(state.notifications_sent[0]["error"])


def test_an_unreachable_receiver_records_the_error() -> None:
    """A connection failure is an attempt with an error and no HTTP status."""
    with CloudState(notify_url="http://127.0.0.1:9/hook", notify_delays=(0.01, 0.01)) as sim:
        sim.run_job(sim.create_job(sim.add_sitemap("s")), n=1)
        assert sim.wait_for_notifications()
        assert [n["http_status"] for n in sim.notifications_sent] == [None, None, None]
        assert all("ConnectError" in str(n["error"]) for n in sim.notifications_sent)


def test_notify_sends_duplicates_on_demand(
    state: CloudState, notification_receiver: Receiver, make_job: Callable[..., int]
) -> None:
    """state.notify repeats a job's notification, as Cloud's at-least-once delivery may."""
    job_id = make_job()
    state.run_job(job_id, n=1)
    state.notify(job_id, times=2)
    assert state.wait_for_notifications()
    assert [form["scrapingjob_id"] for _, form in notification_receiver.arrivals] == [
        str(job_id)
    ] * 3


def test_continue_fires_a_fresh_notification_for_the_same_job(
    state: CloudState, notification_receiver: Receiver, make_job: Callable[..., int]
) -> None:
    """Continue itself is silent; the rerun's end notifies again for the same job id."""
    job_id = make_job()
    state.run_job(job_id, n=1, status="stopped")
    assert state.wait_for_notifications()
    state.continue_job(job_id, extra_records=[{"title": "late"}])
    assert state.wait_for_notifications()
    assert len(notification_receiver.arrivals) == 1
    state.finish_job(job_id)
    assert state.wait_for_notifications()
    assert [(f["scrapingjob_id"], f["status"]) for _, f in notification_receiver.arrivals] == [
        (str(job_id), "stopped"),
        (str(job_id), "finished"),
    ]


def test_no_notify_url_means_no_notification(
    state: CloudState, notification_receiver: Receiver, make_job: Callable[..., int]
) -> None:
    """With notify_url unset nothing is sent; setting it later takes effect at once."""
    state.notify_url = None
    job_id = make_job()
    state.run_job(job_id, n=1)
    assert state.wait_for_notifications()
    assert notification_receiver.arrivals == []
    state.notify_url = "http://receiver/hook/other"
    state.notify(job_id)
    assert state.wait_for_notifications()
    assert len(notification_receiver.arrivals) == 1


def test_notifications_reach_a_receiver_over_a_real_socket() -> None:
    """Without a transport the notifier POSTs over the network, here to a loopback receiver."""
    receiver = Receiver(status=200)
    with (
        receiver.serve("/hook") as url,
        CloudState(notify_url=url, notify_delays=(0.01, 0.01)) as sim,
    ):
        job_id = sim.create_job(sim.add_sitemap("s"))
        sim.run_job(job_id, n=1)
        assert sim.wait_for_notifications()
    assert [form["scrapingjob_id"] for _, form in receiver.arrivals] == [str(job_id)]


def test_wait_for_notifications_reports_a_timeout(
    state: CloudState, notification_receiver: Receiver, make_job: Callable[..., int]
) -> None:
    """wait_for_notifications returns False while deliveries are still retrying."""
    notification_receiver.plan = [500, 500]
    state.notify_delays = (0.5, 0.5)
    state.run_job(make_job(), n=1)
    assert state.wait_for_notifications(timeout=0.05) is False
    assert state.notifier.pending == 1


def test_the_receiver_transport_can_be_the_app_under_test() -> None:
    """notify_transport routes notifications into any WSGI app, e.g. the webhook app."""
    seen: list[str] = []
    hook = Flask("hook")

    @hook.post("/webhooks/webscraper/<token>")
    def receive(token: str) -> tuple[str, int]:
        """Accept only the right path token."""
        seen.append(token)
        return ("ok", 200) if token == "right" else ("no", 401)

    with CloudState(
        notify_url="http://app/webhooks/webscraper/wrong",
        notify_delays=(0.01, 0.01),
        notify_transport=httpx.WSGITransport(app=hook),
    ) as sim:
        sim.run_job(sim.create_job(sim.add_sitemap("s")), n=1)
        assert sim.wait_for_notifications()
        assert seen == ["wrong"] * 3
