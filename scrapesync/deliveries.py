"""``scrapesync deliveries``: list deliveries, replay events, enable a destination, send a ping."""

from __future__ import annotations

import re
import sys
from datetime import UTC, datetime, timedelta

import click

from scrapesync.terminal import CommandError, echo, echo_json
from sync.bootstrap import Services

RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhd])$")
UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def _services() -> Services:
    from sync import bootstrap

    return bootstrap.from_env(role="cli")


def parse_time(text: str, *, now: datetime) -> datetime:
    """An ISO 8601 moment (UTC unless it says otherwise) or an age such as ``90m``, ``6h``,
    ``2d`` (that long before ``now``)."""
    relative = RELATIVE.match(text.strip())
    if relative:
        return now - timedelta(**{UNITS[relative.group(2)]: float(relative.group(1))})
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise CommandError(
            f"--since {text!r} is neither an ISO 8601 time (2026-12-05T10:00:00Z) "
            "nor an age (90m, 6h, 2d)"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


@click.group("deliveries")
def deliveries_group() -> None:
    """Deliveries of events to destinations: list, replay, enable, test."""


@deliveries_group.command("list")
@click.option(
    "--state",
    "states",
    type=click.Choice(["dead", "failed", "pending", "delivered"]),
    multiple=True,
    help="Only deliveries in this state (repeatable; default: dead, failed and pending).",
)
@click.option("--destination", help="Only this destination (its name, URL or file:PATH).")
@click.option("--limit", default=100, show_default=True, help="At most this many, oldest first.")
@click.option("--json", "as_json", is_flag=True, help="Print the deliveries as JSON.")
def list_command(
    states: tuple[str, ...], destination: str | None, limit: int, as_json: bool
) -> None:
    """Deliveries not yet delivered (or in --state), with each one's last answer."""
    from sync.delivery import backlog

    services = _services()
    try:
        rows = backlog.listing(
            services,
            states=states or backlog.UNDELIVERED,
            destination=destination,
            limit=limit,
        )
        troubled = backlog.destination_states(services)
    except backlog.BacklogError as exc:
        raise CommandError(str(exc)) from None
    if as_json:
        echo_json({"deliveries": rows, "destinations": troubled})
        return
    for d in troubled:
        if d["disabled_at"]:
            echo(f"destination {d['destination']}: DISABLED since {d['disabled_at']}")
            echo(f"  {d['disabled_reason']}")
            echo(f"  `scrapesync deliveries enable {d['destination']}` once it is back")
        else:
            echo(f"destination {d['destination']}: failing since {d['failing_since']}")
    if not rows:
        echo("no deliveries in that state")
        return
    disabled = {d["destination"] for d in troubled if d["disabled_at"]}
    for row in rows:
        echo(
            f"{row['event_id']}  {row['type']:<17} {row['state']:<9} "
            f"attempts={row['attempts']:<3} {row['destination']}"
        )
        answer = row["last_error"] or (
            f"HTTP {row['last_status']}" if row["last_status"] is not None else None
        )
        when = row["next_attempt_at"] and f"next attempt {row['next_attempt_at']}"
        if row["waits_behind"]:
            when = f"waits behind {row['waits_behind']}"
        if row["destination"] in disabled and row["state"] in ("unsent", "failed"):
            when = "held while the destination is disabled"
        details = [f"written {row['created_at']}", when, answer and f"last answer: {answer}"]
        echo("    " + "; ".join(str(x) for x in details if x))


@deliveries_group.command("replay")
@click.argument("event_ids", nargs=-1)
@click.option("--since", help="Every event written after this time (ISO 8601, or 90m, 6h, 2d).")
@click.option("--destination", help="Only to this destination (its name, URL or file:PATH).")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
def replay_command(
    event_ids: tuple[str, ...], since: str | None, destination: str | None, as_json: bool
) -> None:
    """Send events again under their own ids (receivers deduplicate on webhook-id)."""
    from sync.delivery import backlog

    if bool(event_ids) == bool(since):
        raise CommandError("give either EVENT_ID... or --since TIME")
    services = _services()
    try:
        if since is not None:
            moment = parse_time(since, now=services.clock())
            done = backlog.replay_since(services, moment, destination=destination)
        else:
            done = backlog.replay(services, list(event_ids), destination=destination)
    except backlog.BacklogError as exc:
        raise CommandError(str(exc)) from None
    if as_json:
        echo_json(
            {"deliveries": done.deliveries, "events": list(done.events), "disabled": done.disabled}
        )
        return
    target = f" to {destination}" if destination else ""
    echo(f"re-queued {done.deliveries} deliveries of {len(done.events)} events{target}")
    for event_id in done.events:
        echo(f"  {event_id}")
    for name in done.disabled:
        echo(f"destination {name} is disabled: `scrapesync deliveries enable {name}` to send")


@deliveries_group.command("enable")
@click.argument("destination")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
def enable_command(destination: str, as_json: bool) -> None:
    """Enable a destination disabled by a 410 Gone; what waited for it is sent in order."""
    from sync.delivery import backlog

    try:
        waiting = backlog.enable(_services(), destination)
    except backlog.BacklogError as exc:
        raise CommandError(str(exc)) from None
    if as_json:
        echo_json({"destination": destination, "enabled": True, "waiting": waiting})
    else:
        echo(f"destination {destination} enabled; {waiting} deliveries waiting for it")


@deliveries_group.command("test")
@click.argument("destination")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
def test_command(destination: str, as_json: bool) -> None:
    """Send DESTINATION one signed ``ping`` event and print its answer."""
    from sync.delivery import backlog

    try:
        answer = backlog.ping(_services(), destination)
    except backlog.BacklogError as exc:
        raise CommandError(str(exc)) from None
    status = "no HTTP answer" if answer.status is None else f"HTTP {answer.status}"
    if as_json:
        echo_json(
            {
                "event_id": answer.event_id,
                "destination": answer.destination,
                "status": answer.status,
                "answer": answer.answer,
            }
        )
    else:
        echo(f"ping {answer.event_id} to {answer.destination}: {status}")
        if answer.answer:
            echo(answer.answer)
    if answer.status is None and not answer.answer.startswith("written to"):
        sys.exit(1)
    if answer.status is not None and not 200 <= answer.status < 300:
        sys.exit(1)
