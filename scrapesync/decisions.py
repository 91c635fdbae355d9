"""The operator's decisions: ``accept``, ``reject`` and ``cancel`` a run, ``baseline reset`` a
dataset (see :mod:`sync.runs.decisions`); and ``status RUN``, one run in detail."""

from __future__ import annotations

import click

from scrapesync.terminal import CommandError, echo, echo_json
from sync.bootstrap import Services
from sync.states import Decision


def _services() -> Services:
    from sync import bootstrap

    return bootstrap.from_env(role="cli")


def _decide(run_id: str, action: str, reason: str | None, as_json: bool) -> None:
    from sync.runs import decisions

    try:
        done = decisions.decide(_services(), run_id, action, reason)
    except decisions.DecisionError as exc:
        raise CommandError(str(exc)) from None
    if as_json:
        echo_json(done.as_dict())
        return
    verb = {"accept": "accepted", "reject": "rejected", "cancel": "cancelled"}[action]
    head = (
        f"run {run_id}: {verb} by the operator"
        if done.changed
        else f"run {run_id}: already {verb} by the operator"
    )
    # with a note, the decision has not applied yet: the state is the one it had before
    standing = f"still {done.state} for now" if done.note else f"now {done.state}"
    echo(f"{head} ({done.reason or 'no reason given'}); {standing}")
    if done.note:
        echo(f"note: {done.note}")


_REASON = click.option("--reason", required=True, help="Why: kept with the decision and announced.")
_JSON = click.option("--json", "as_json", is_flag=True, help="Print the decision as JSON.")


@click.command("accept")
@click.argument("run_id")
@_REASON
@_JSON
def accept_command(run_id: str, reason: str, as_json: bool) -> None:
    """Publish RUN_ID although the rules did not accept it (every partition, as collected)."""
    _decide(run_id, Decision.ACCEPT, reason, as_json)


@click.command("reject")
@click.argument("run_id")
@_REASON
@_JSON
def reject_command(run_id: str, reason: str, as_json: bool) -> None:
    """Reject RUN_ID; if it was published, the last accepted run is published again."""
    _decide(run_id, Decision.REJECT, reason, as_json)


@click.command("cancel")
@click.argument("run_id")
@click.option("--reason", help="Why (optional): kept with the decision and announced.")
@_JSON
def cancel_command(run_id: str, reason: str | None, as_json: bool) -> None:
    """Stop waiting for RUN_ID, a run that will never complete (it is never published)."""
    _decide(run_id, Decision.CANCEL, reason, as_json)


@click.group("baseline")
def baseline_group() -> None:
    """The history the rules compare runs with."""


@baseline_group.command("reset")
@click.argument("dataset")
@_REASON
@_JSON
def baseline_reset_command(dataset: str, reason: str, as_json: bool) -> None:
    """From the next run on, compare DATASET's runs only with runs begun after now."""
    from sync.runs import decisions

    try:
        done = decisions.reset_baseline(_services(), dataset, reason)
    except decisions.DecisionError as exc:
        raise CommandError(str(exc)) from None
    if as_json:
        echo_json(done.as_dict())
    elif done.changed:
        echo(
            f"{dataset}: baseline reset ({reason}); from the next run on the history rules "
            "compare only with runs begun after now"
        )
    else:
        at = f"{done.decided_at:%Y-%m-%d %H:%M:%S} UTC"
        echo(f"{dataset}: baseline already reset at {at} ({done.note})")


def show_run(run_id: str, as_json: bool) -> None:
    """``status RUN``: one run in detail, or an error for an unknown run."""
    from sync.operations import run_detail

    values = run_detail.run_detail(_services(), run_id)
    if values is None:
        raise CommandError(f"no run {run_id!r} in the database")
    if as_json:
        echo_json(values)
    else:
        echo(run_detail.detail_text(values))


ALL = (accept_command, reject_command, cancel_command, baseline_group)
