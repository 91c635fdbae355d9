"""The history rules with plain values: a run's profile against the median of its dataset's last
accepted runs. No database, no Cloud."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import replace

import pytest

from config.datasets import Dataset, DatasetsFileError, Quality, parse_datasets
from sync.acceptance.facts import (
    NOTE,
    ImportFacts,
    JobFacts,
    Judgement,
    PartitionTally,
    Profile,
    RecordRules,
)
from sync.acceptance.history import profile_of
from sync.acceptance.records import tally_records
from sync.acceptance.verdict import judge
from tests.acceptance.flow import quarantined

RULES = RecordRules(required=("sku",), identity_fields=("sku", "retailer"))
PRODUCTS = Dataset(
    name="products",
    entity_key=("sku",),
    sitemap="products",
    partition="retailer",
    required=("sku",),
    quality=Quality(),
)
RETAILERS = ("alpha", "beta", "gamma", "delta")
FIELDS = ("title", "price", "url")


def records_of(
    counts: Mapping[str, int], fill: Mapping[str, float] | None = None, *, start: int = 0
) -> list[tuple[str, dict[str, str]]]:
    """Product records per retailer; ``fill`` gives a field's fill rate (0..1, default 1),
    and a field whose rate is ``-1`` is left out of every record."""
    fill = fill or {}
    out: list[tuple[str, dict[str, str]]] = []
    i = start
    for retailer, n in counts.items():
        for k in range(n):
            record = {"sku": f"SKU-{i}", "retailer": retailer}
            for name in FIELDS:
                rate = fill.get(name, 1.0)
                if rate < 0:
                    continue
                # The first round(n * rate) records of each retailer fill the field.
                record[name] = f"{name}-{i}" if k < round(n * rate) else ""
            out.append((retailer, record))
            i += 1
    return out


def tallies(
    counts: Mapping[str, int], fill: Mapping[str, float] | None = None
) -> dict[str, PartitionTally]:
    """The partition tallies of such records."""
    return tally_records(records_of(counts, fill), RULES)


def even(n: int) -> dict[str, int]:
    """``n`` records spread evenly over the four retailers."""
    return {r: n // len(RETAILERS) for r in RETAILERS}


def profile(counts: Mapping[str, int], fill: Mapping[str, float] | None = None) -> Profile:
    """The profile of such a run."""
    return profile_of(tallies(counts, fill))


def judged(
    run: Mapping[str, PartitionTally],
    history: Sequence[Profile],
    dataset: Dataset = PRODUCTS,
) -> Judgement:
    """Judge a run of one clean finished job against ``history`` (newest first)."""
    n = sum(t.records for t in run.values())
    job = JobFacts(job_id=1, status="finished", jobs_scheduled=n, jobs_executed=n)
    return judge(
        replace(dataset, quality=replace(dataset.quality, use_cloud_quality=False)),
        jobs=[job],
        imports=ImportFacts(n, 0, n, 0),
        tallies=run,
        history=history,
    )


def codes(judgement: Judgement) -> list[str]:
    """The codes of a verdict's run-level reasons, notes left out."""
    return [r.code for r in judgement.reasons if r.detail.get("kind") != NOTE]


def history_of(*sizes: int) -> list[Profile]:
    """Profiles of accepted runs of these sizes, newest first."""
    return [profile(even(n)) for n in sizes]


def test_a_profile_has_records_per_partition_and_fill_rates_overall_and_per_partition() -> None:
    """Fill rate is the share of records with the field present and non-empty."""
    found = profile({"alpha": 10, "beta": 30}, {"price": 0.5, "url": -1})
    assert found.records == 40
    assert found.partitions == {"alpha": 10, "beta": 30}
    assert found.fill_rates["price"] == 50.0
    assert found.partition_fill_rates["alpha"]["price"] == 50.0
    assert "url" not in found.fill_rates
    assert found.fields == {"sku", "retailer", "title", "price"}
    blank = profile({"alpha": 4}, {"title": 0.0})
    assert "title" not in blank.fields  # present but never filled: not seen


def test_only_the_first_run_is_judged_by_the_absolute_rules_alone() -> None:
    """With no accepted run there is nothing to compare with; from the second run on a 90% drop
    is a record_drop, against the last accepted run until min_history, then the median."""
    small = tallies(even(40))
    verdict = judged(small, history_of())
    assert (verdict.state, verdict.baseline) == ("accepted", None)
    assert not [c for c in verdict.checks if c.rule == "record_drop"]
    for sizes in ((400,), (400, 400), (400, 400, 400)):
        verdict = judged(small, history_of(*sizes))
        assert verdict.state == "rejected"
        assert "record_drop" in codes(verdict)
    few = replace(PRODUCTS, quality=replace(PRODUCTS.quality, min_history=1))
    assert "record_drop" in codes(judged(small, history_of(400), few))


def test_before_min_history_the_last_accepted_run_is_the_baseline() -> None:
    """1,200 records after 2,000 and 2,000: a 40% drop against the last accepted run, with its
    figures; 2,400 after them is a gain and passes."""
    history = history_of(2000, 2000)
    verdict = judged(tallies(even(1200)), history)
    assert verdict.state == "rejected"
    assert verdict.baseline is not None
    assert len(verdict.baseline.runs) == 1
    (reason,) = verdict.reasons
    assert (reason.code, reason.got, reason.baseline, reason.expected) == (
        "record_drop",
        1200,
        2000,
        1500,
    )
    assert reason.detail == {"drop_percent": 40.0, "max_drop_percent": 25, "baseline_runs": 1}
    assert "(the last accepted run)" in reason.message
    assert judged(tallies(even(2400)), history).state == "accepted"
    # the last run is the one compared with, not the older ones
    assert judged(tallies(even(1200)), history_of(1200, 2000)).state == "accepted"


def test_record_drop_holds_the_run_against_the_median_with_got_baseline_and_allowed() -> None:
    """30% below the median of 1000 fails (allowed >= 750); 20% below passes; one odd run in
    the history moves nothing."""
    history = history_of(1000, 1000, 200, 1000, 1400)
    (reason,) = judged(tallies(even(700)), history).reasons
    assert (reason.code, reason.got, reason.baseline, reason.expected) == (
        "record_drop",
        700,
        1000,
        750,
    )
    assert reason.detail["baseline_runs"] == 5
    assert judged(tallies(even(800)), history).state == "accepted"


def test_only_the_last_baseline_runs_make_the_baseline() -> None:
    """baseline_runs = 7: runs older than the seventh are forgotten, so a dataset that shrank
    for good stops being compared with its old size."""
    history = history_of(*([500] * 7 + [2000] * 10))
    verdict = judged(tallies(even(480)), history)
    assert verdict.state == "accepted"
    assert verdict.baseline is not None
    assert len(verdict.baseline.runs) == 7


def test_a_gain_in_volume_or_a_new_partition_never_fails() -> None:
    """Three times the records and a new retailer: accepted, no history reason."""
    bigger = tallies({**{r: 300 for r in RETAILERS}, "epsilon": 100})
    verdict = judged(bigger, history_of(400, 400, 400))
    assert (verdict.state, codes(verdict)) == ("accepted", [])


def test_a_field_emptied_across_partitions_is_a_run_level_fill_rate_drop() -> None:
    """price filled in 60% of every retailer's records against 100%: rejected, naming price,
    with got, baseline and the least rate allowed (15 points below)."""
    history = history_of(400, 400, 400)
    verdict = judged(tallies(even(400), {"price": 0.6}), history)
    assert verdict.state == "rejected"
    (reason,) = verdict.reasons
    assert (reason.code, reason.partition, reason.detail["field"]) == (
        "fill_rate_drop",
        None,
        "price",
    )
    assert (reason.got, reason.baseline, reason.expected) == (60, 100, 85)
    assert sorted(reason.detail["partitions"]) == sorted(RETAILERS)
    assert "'price'" in reason.message
    assert quarantined(verdict) == ()


def test_a_field_emptied_in_one_partition_quarantines_that_partition() -> None:
    """Only beta's prices vanished: beta is quarantined for fill_rate_drop; under
    publish_passing the other retailers are published."""
    history = history_of(400, 400, 400)
    records = records_of({"beta": 100}, {"price": 0.0}) + records_of(
        {r: 100 for r in RETAILERS if r != "beta"}, start=1000
    )
    run = tally_records(records, RULES)
    verdict = judged(run, history, replace(PRODUCTS, policy="publish_passing"))
    assert verdict.state == "accepted"
    assert quarantined(verdict) == ("beta",)
    beta = next(p for p in verdict.partitions if p.partition == "beta")
    (reason,) = beta.reasons
    assert (reason.code, reason.partition, reason.got, reason.baseline) == (
        "fill_rate_drop",
        "beta",
        0,
        100,
    )
    overall = next(c for c in verdict.checks if (c.rule, c.subject) == ("fill_rate_drop", "price"))
    assert (overall.passed, overall.got, overall.allowed.endswith("price @ beta's alone")) == (
        True,
        75,
        True,
    )
    assert judged(run, history).state == "rejected"  # policy reject: one bad partition rejects


def test_one_blank_value_in_a_tiny_partition_quarantines_nothing() -> None:
    """A retailer of five records with one price missing is 20 points down, but one record
    cannot carry a verdict; at fifty records the same share is judged."""
    history = [profile({**even(400), "tiny": 5}) for _ in range(3)]
    records = records_of(even(400)) + records_of({"tiny": 5}, {"price": 0.8}, start=1000)
    assert judged(tally_records(records, RULES), history).state == "accepted"
    history = [profile({**even(400), "small": 50}) for _ in range(3)]
    records = records_of(even(400)) + records_of({"small": 50}, {"price": 0.8}, start=1000)
    verdict = judged(tally_records(records, RULES), history)
    assert quarantined(verdict) == ("small",)


def test_a_field_that_disappears_is_field_missing_and_not_also_a_fill_rate_drop() -> None:
    """title in every baseline run and in no record now: rejected for field_missing only."""
    verdict = judged(tallies(even(400), {"title": -1}), history_of(400, 400, 400))
    (reason,) = verdict.reasons
    assert (reason.code, reason.got, reason.expected, reason.baseline) == (
        "field_missing",
        "absent",
        "present",
        100,
    )
    assert reason.detail == {"field": "title", "baseline_runs": 3}


def test_a_field_only_some_baseline_runs_had_may_go_missing() -> None:
    """url was in one baseline run of three: its absence is no field_missing."""
    history = [profile(even(400), {"url": -1}), profile(even(400)), profile(even(400), {"url": -1})]
    verdict = judged(tallies(even(400), {"url": -1}), history)
    assert verdict.state == "accepted"


def test_a_new_field_is_reported_not_failed() -> None:
    """url appears for the first time: the run is accepted with a note that names it."""
    history = [profile(even(400), {"url": -1})] * 3
    verdict = judged(tallies(even(400)), history)
    assert verdict.state == "accepted"
    (note,) = verdict.reasons
    assert (note.code, note.detail["kind"] == NOTE, note.detail["fields"]) == (
        "new_fields",
        True,
        ["url"],
    )


def test_missing_fields_can_be_allowed() -> None:
    """fail_on_missing_fields = false: the vanished field is judged by its fill rate alone."""
    lenient = replace(PRODUCTS, quality=replace(PRODUCTS.quality, fail_on_missing_fields=False))
    verdict = judged(tallies(even(400), {"title": -1}), history_of(400, 400, 400), lenient)
    assert codes(verdict) == ["fill_rate_drop"]


def test_one_retailer_at_a_tenth_is_a_partition_drop_and_the_rest_is_published() -> None:
    """delta at 10 records against 100: quarantined with got, baseline and allowed; under
    publish_passing the run is accepted and its count judged on the partitions it publishes."""
    history = history_of(400, 400, 400)
    run = tallies({"alpha": 100, "beta": 100, "gamma": 100, "delta": 10})
    verdict = judged(run, history, replace(PRODUCTS, policy="publish_passing"))
    assert (verdict.state, quarantined(verdict)) == ("accepted", ("delta",))
    assert verdict.counted_records == 300
    delta = next(p for p in verdict.partitions if p.partition == "delta")
    (reason,) = delta.reasons
    assert (reason.code, reason.got, reason.baseline, reason.expected) == (
        "partition_drop",
        10,
        100,
        50,
    )
    assert [r.code for r in verdict.reasons] == ["partition_quarantined"]
    assert judged(run, history).state == "rejected"


def test_a_partition_that_vanished_is_quarantined_with_no_records() -> None:
    """delta absent altogether: a partition verdict with 0 records and partition_drop."""
    run = tallies({"alpha": 100, "beta": 100, "gamma": 100})
    verdict = judged(run, history_of(400, 400, 400), replace(PRODUCTS, policy="publish_passing"))
    delta = next(p for p in verdict.partitions if p.partition == "delta")
    assert (delta.records, [r.code for r in delta.reasons]) == (0, ["partition_drop"])
    assert verdict.state == "accepted"


def test_a_partition_seen_in_a_minority_of_baseline_runs_has_no_baseline() -> None:
    """A retailer that came once in three runs is not expected next time."""
    history = [profile({**even(400), "epsilon": 50}), profile(even(400)), profile(even(400))]
    verdict = judged(tallies(even(400)), history)
    assert verdict.state == "accepted"
    assert "epsilon" not in {p.partition for p in verdict.partitions}


def simulate(runs: Sequence[tuple[Mapping[str, int], Mapping[str, float]]]) -> list[str]:
    """Judge each run against the accepted ones before it, as evaluation does; the states."""
    history: list[Profile] = []
    states = []
    for counts, fill in runs:
        run = tallies(counts, fill)
        verdict = judged(run, history)
        states.append(verdict.state)
        if verdict.state == "accepted":
            history.insert(0, profile_of(run))
    return states


def test_a_baseline_that_drifts_slowly_rejects_nothing() -> None:
    """Thirty runs shrinking 3% a run, prices filling 1 point less each run: all accepted,
    because the baseline moves with the data; then a sudden 30% drop is caught."""
    runs = [(even(round(4000 * 0.97**i)), {"price": 1 - i / 100}) for i in range(30)]
    assert simulate(runs) == ["accepted"] * 30
    growing = [(even(round(400 * 1.04**i)), {}) for i in range(30)]
    assert simulate(growing) == ["accepted"] * 30
    cliff = [*runs[:10], (even(round(4000 * 0.97**9 * 0.7)), {"price": 0.91})]
    assert simulate(cliff)[-1] == "rejected"


@pytest.mark.parametrize("seed", range(25))
def test_noise_of_five_percent_over_ten_runs_rejects_nothing(seed: int) -> None:
    """Volume and fill rates that wobble by up to 5% (each retailer on its own too) for ten
    runs, the extremes included: every run is accepted."""
    wobble = random.Random(seed)
    extremes = [-0.05, 0.05] * 5 if seed == 0 else [0.05] * 5 + [-0.05] * 5
    runs = []
    for i in range(10):
        volume = extremes[i] if seed < 2 else wobble.uniform(-0.05, 0.05)
        fill = extremes[i] if seed < 2 else wobble.uniform(-0.05, 0.05)
        counts = {
            r: round(250 * (1 + volume) * (1 + wobble.uniform(-0.05, 0.05))) for r in RETAILERS
        }
        runs.append((counts, {"price": 0.9 + fill, "title": 0.95 + fill}))
    assert simulate(runs) == ["accepted"] * 10


def test_every_rule_applied_is_kept_as_a_check_pass_or_fail() -> None:
    """The checks name each rule with its figure, baseline and allowance, so a run that passed
    still shows how close it came."""
    verdict = judged(tallies(even(760)), history_of(1000, 1000, 1000))
    checks = {(c.rule, c.subject): c for c in verdict.checks}
    drop = checks[("record_drop", None)]
    assert (drop.passed, drop.got, drop.baseline) == (True, 760, 1000)
    assert drop.allowed.startswith(">= 750")
    assert checks[("fill_rate_drop", "price")].passed
    assert checks[("partition_drop", "alpha")].baseline == 250
    assert checks[("min_records", None)].passed
    assert checks[("failed_pages", None)].got == 0.0
    assert {"job_not_finished", "records_without_key", "required_missing", "field_missing"} <= {
        c.rule for c in verdict.checks
    }


def test_the_history_thresholds_are_read_from_the_datasets_file() -> None:
    """baseline_runs, min_history and the drop thresholds are dataset settings."""
    datasets = parse_datasets(
        '[datasets.x]\nsitemap = "s"\nentity_key = "k"\n[datasets.x.quality]\n'
        "baseline_runs = 5\nmin_history = 2\nmax_record_drop_percent = 40\n"
        "max_fill_rate_drop_points = 20\nmax_partition_drop_percent = 70\n"
        "fail_on_missing_fields = false\n"
    )
    quality = datasets.get("x").quality
    assert (quality.baseline_runs, quality.min_history) == (5, 2)
    assert (quality.max_record_drop_percent, quality.max_fill_rate_drop_points) == (40.0, 20.0)
    assert (quality.max_partition_drop_percent, quality.fail_on_missing_fields) == (70.0, False)
    default = Quality()
    assert (default.baseline_runs, default.min_history, default.max_record_drop_percent) == (
        7,
        3,
        25.0,
    )
    assert (default.max_fill_rate_drop_points, default.max_partition_drop_percent) == (15.0, 50.0)


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ("baseline_runs = 0", "at least 1"),
        ("min_history = 2.5", "whole number"),
        ("baseline_runs = 3\nmin_history = 5", "never apply"),
        ("max_fill_rate_drop_points = 120", "at most 100"),
        ("fail_on_missing_fields = 1", "true or false"),
        ("max_volume_gain_percent = 10", "unknown keys"),
    ],
)
def test_a_wrong_history_setting_is_refused_with_its_name(lines: str, message: str) -> None:
    """History settings out of range, of the wrong type, or unknown are refused by name."""
    with pytest.raises(DatasetsFileError, match=message):
        parse_datasets(
            f'[datasets.x]\nsitemap = "s"\nentity_key = "k"\n[datasets.x.quality]\n{lines}\n'
        )
