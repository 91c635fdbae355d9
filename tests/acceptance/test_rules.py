"""The acceptance rules, one by one, with plain values: no database, no Cloud."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from config.datasets import Dataset, DatasetsFileError, Quality, parse_datasets
from sync.acceptance import parsers
from sync.acceptance.facts import (
    NO_PARTITION,
    SAMPLES,
    ImportFacts,
    JobFacts,
    PartitionTally,
    Reason,
    RecordRules,
)
from sync.acceptance.parsers import PARSERS, parses_as_integer, parses_as_number, parses_as_url
from sync.acceptance.records import is_empty_shell, tally_records
from sync.acceptance.rules import (
    cloud_quality_reasons,
    duplicate_reasons,
    entity_key_reasons,
    job_status_reasons,
    page_counter_reasons,
    partition_reasons,
    record_count_reasons,
)
from sync.acceptance.verdict import is_waiting, judge, waiting_for_tasks
from tests.acceptance.flow import publishable, quarantined

QUALITY = Quality(parsers={"price": "number"})
RULES = RecordRules(
    required=("sku", "price"),
    parsers={"price": "number"},
    consent_markers=QUALITY.consent_markers,
    identity_fields=("sku", "retailer"),
)
PRODUCTS = Dataset(
    name="products",
    entity_key=("sku",),
    sitemap="products",
    partition="retailer",
    required=("sku", "price"),
    quality=QUALITY,
)


def product(i: int, retailer: str = "alpha.example", **fields: Any) -> dict[str, Any]:
    """A good product record."""
    return {
        "sku": f"SKU-{i}",
        "title": f"Kettle {i}",
        "price": f"{i}.99",
        "retailer": retailer,
        **fields,
    }


def finished(job_id: int = 1, scheduled: int = 100, **counters: Any) -> JobFacts:
    """A finished job with a passing Cloud data-quality result."""
    quality = {"min_record_count": {"got": scheduled, "expected": 1, "success": True}}
    return JobFacts(
        job_id=job_id,
        status="finished",
        jobs_scheduled=scheduled,
        jobs_executed=scheduled,
        stored_record_count=scheduled,
        data_quality={**quality, "overall_data_quality_success": True},
        **counters,
    )


def codes(reasons: list[Reason] | tuple[Reason, ...]) -> list[str]:
    """The codes of some reasons, in order."""
    return [r.code for r in reasons]


# --- value parsers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [12, 12.5, "12", "12.99", "12,99", "1,234.50", "1.234,50", "$9.99", "€ 1 299,00", "12 EUR"],
)
def test_prices_in_the_usual_spellings_parse_as_numbers(value: object) -> None:
    """Currency signs and codes, thousands separators and decimal commas are numbers."""
    assert parses_as_number(value)


@pytest.mark.parametrize(
    "value", ["call for price", "N/A", "—", "12.99.1", "<span>", True, float("nan"), [], "EUR"]
)
def test_garbage_does_not_parse_as_a_number(value: object) -> None:
    """Words, markup, booleans, NaN and a bare currency are not prices."""
    assert not parses_as_number(value)


@given(st.text(alphabet="0123456789.,+-$ \n\u0663\u00b2\u00a0E", max_size=12))
@example("982.10")
@example("12\n")
@example("\u0663.\u0663")
@example("\u00b2")
@example("12.")
@example(".5")
def test_the_plain_number_shortcut_reads_every_text_as_the_full_reading_does(value: str) -> None:
    """The shortcut for the commonest spelling ("982.10") reads every text as the full reading
    does: the digits of any script that regular expressions call digits and no superscript, one
    point with digits on both sides; the rest it leaves to the full reading."""
    assert parses_as_number(value) == parsers._reads_as_number(value)


def test_integers_urls_and_nonempty_values_have_their_own_parsers() -> None:
    """Each configured parser accepts its kind and refuses the rest."""
    assert parses_as_integer("1,200")
    assert parses_as_integer(3.0)
    assert not parses_as_integer("3.5")
    assert parses_as_url("https://alpha.example/p/1")
    assert not parses_as_url("/p/1")
    assert not parses_as_url("http://a b/")
    assert PARSERS["nonempty"]("x")
    assert not PARSERS["nonempty"]("  ")


# --- records --------------------------------------------------------------------------------


def test_a_record_missing_a_required_field_is_counted_per_field() -> None:
    """Empty, blank and absent required fields are counted under the field's name."""
    tallies = tally_records(
        [
            ("alpha", product(1, price="")),
            ("alpha", {"sku": "SKU-2", "title": "t"}),
            ("alpha", product(3)),
        ],
        RULES,
    )
    assert tallies["alpha"].records == 3
    assert tallies["alpha"].missing == {"price": 2}


def test_unparsable_values_are_counted_with_samples() -> None:
    """A price that is not a number is counted and a few of its values kept as samples."""
    records = [("beta", product(i, price="call us")) for i in range(5)]
    tally = tally_records(records, RULES)["beta"]
    assert tally.unparsable == {"price": 5}
    assert tally.samples["unparsable:price"] == ["call us"] * 3


def test_a_consent_page_and_an_empty_shell_are_recognised() -> None:
    """A consent marker anywhere in the text makes a consent page; a record whose content fields
    are all empty (key and partition aside) is an empty shell."""
    consent = product(1, title="Before you continue to Google", price="")
    shell = {"sku": "SKU-2", "title": "", "price": None, "retailer": "alpha"}
    tally = tally_records([("a", consent), ("a", shell), ("a", product(3))], RULES)["a"]
    assert (tally.consent_pages, tally.empty_shells) == (1, 1)
    assert not is_empty_shell({"sku": "SKU-1"}, ("sku",))


def test_records_without_a_partition_are_tallied_together() -> None:
    """Records with no partition value share the ``(none)`` partition."""
    tallies = tally_records([(None, product(1)), (None, product(2))], RULES)
    assert list(tallies) == [NO_PARTITION]


def test_a_partition_fails_only_above_its_threshold_with_the_numbers() -> None:
    """2 unparsable prices in 100 records pass at 5%; 10 fail, with got and expected."""
    tally = PartitionTally("beta", records=100, unparsable={"price": 2})
    assert partition_reasons(tally, QUALITY) == []
    tally.unparsable["price"] = 10
    (reason,) = partition_reasons(tally, QUALITY)
    assert (reason.code, reason.got, reason.expected, reason.partition) == (
        "unparsable",
        10.0,
        5,
        "beta",
    )
    assert "10 of 100 records" in reason.message


def test_consent_pages_and_empty_shells_fail_a_partition() -> None:
    """Pages that are not data fail the partition they were counted in."""
    tally = PartitionTally("a", records=10, consent_pages=10, empty_shells=0)
    assert codes(partition_reasons(tally, QUALITY)) == ["consent_page"]
    tally = PartitionTally("a", records=10, empty_shells=4, missing={"price": 4})
    assert codes(partition_reasons(tally, QUALITY)) == [
        "required_missing",
        "empty_shell",
    ]


# --- run-level rules ------------------------------------------------------------------------


def test_a_job_that_did_not_finish_fails_the_run() -> None:
    """A failed or stopped job is not a complete collection."""
    (reason,) = job_status_reasons([finished(1), replace(finished(2), status="stopped")])
    assert (reason.code, reason.got, reason.expected) == ("job_not_finished", "stopped", "finished")


def test_page_counters_are_judged_against_pages_scheduled() -> None:
    """20 empty pages of 100 scheduled is 20% > 5%; sample problematic URLs come along."""
    job = finished(
        scheduled=100,
        jobs_empty=20,
        jobs_failed=5,
        problematic_urls=[{"url": "https://a/1", "type": "empty"}],
    )
    (reason,) = page_counter_reasons([job], QUALITY)
    assert (reason.code, reason.got, reason.expected) == ("empty_pages", 20.0, 5)
    assert reason.detail["pages"] == 20
    assert reason.detail["scheduled"] == 100
    assert reason.detail["sample_urls"] == ["https://a/1"]


def test_page_counters_add_up_over_the_runs_jobs() -> None:
    """Two jobs of one run: their failed pages count against their pages together."""
    jobs = [finished(1, scheduled=50, jobs_failed=3), finished(2, scheduled=50, jobs_failed=3)]
    (reason,) = page_counter_reasons(jobs, QUALITY)
    assert (reason.code, reason.got) == ("failed_pages", 6.0)


def test_pages_a_recovery_job_scraped_cleanly_no_longer_count() -> None:
    """A rerun of the failed pages under the run: pages it scraped without a problem are
    repaired; pages that failed again still count, once, against the original job."""
    failed = [{"url": f"https://a/{i}", "type": "failed"} for i in range(10)]
    original = finished(1, scheduled=100, jobs_failed=10, problematic_urls=failed)
    clean = replace(finished(2, scheduled=10), recovery_start_urls=[u["url"] for u in failed])
    assert page_counter_reasons([original, clean], QUALITY) == []
    partly = replace(
        finished(2, scheduled=10, jobs_failed=6, problematic_urls=failed[:6]),
        recovery_start_urls=[u["url"] for u in failed],
    )
    (reason,) = page_counter_reasons([original, partly], QUALITY)
    assert (reason.code, reason.got, reason.detail["scheduled"]) == ("failed_pages", 6.0, 100)
    assert reason.detail["sample_urls"] == [u["url"] for u in failed[:SAMPLES]]
    unfinished = replace(clean, status="started")
    (still,) = page_counter_reasons([original, unfinished], QUALITY)
    assert still.got == 10.0


def test_every_failed_leaf_of_clouds_data_quality_is_a_reason() -> None:
    """Cloud's result is read leaf by leaf, column criteria included."""
    result = {
        "min_record_count": {"got": 10, "expected": 1, "success": True},
        "min_column_records": {"sku": {"got": 0, "expected": 95, "success": False}},
        "overall_data_quality_success": False,
    }
    job = replace(finished(), data_quality=result)
    (reason,) = cloud_quality_reasons([job], QUALITY)
    assert (reason.code, reason.got, reason.expected) == ("cloud_quality", 0, 95)
    assert reason.detail["criterion"] == "min_column_records.sku"


def test_clouds_data_quality_can_be_switched_off() -> None:
    """With use_cloud_quality = false, Cloud's verdict is not a gate."""
    job = replace(finished(), data_quality={"overall_data_quality_success": False})
    assert cloud_quality_reasons([job], replace(QUALITY, use_cloud_quality=False)) == []
    assert codes(cloud_quality_reasons([job], QUALITY)) == ["cloud_quality"]


def test_an_unread_data_quality_result_is_waited_for_not_failed() -> None:
    """A finished job whose result could not be read yet makes a waiting reason."""
    job = replace(finished(), data_quality=None, quality_error="CloudServerError: 503")
    (reason,) = cloud_quality_reasons([job], QUALITY)
    assert reason.code == "cloud_quality_unavailable"
    assert is_waiting(reason)
    assert "503" in reason.message


def test_records_without_an_entity_key_fail_the_run() -> None:
    """Pages that yielded no key (a consent wall blanks every field) are counted against read."""
    assert entity_key_reasons(ImportFacts(100, 5, 95, 0), QUALITY) == []
    (reason,) = entity_key_reasons(ImportFacts(100, 100, 0, 0), QUALITY)
    assert (reason.code, reason.got, reason.expected) == ("records_without_key", 100.0, 5)


def test_conflicting_duplicates_fail_the_run_above_their_threshold() -> None:
    """Keys seen twice with different payloads in one job make identity ambiguous."""
    assert duplicate_reasons(ImportFacts(100, 0, 100, 1), QUALITY) == []
    (reason,) = duplicate_reasons(ImportFacts(100, 0, 90, 9), QUALITY)
    assert (reason.code, reason.got, reason.expected) == ("conflicting_duplicates", 10.0, 1)


def test_record_count_is_judged_against_the_minimum_and_the_baseline() -> None:
    """Too few records, or a drop beyond max_record_drop_percent below the baseline, fail with
    the run's count, the baseline and the least count allowed; a gain never fails."""
    quality = replace(QUALITY, min_records=10, max_record_drop_percent=50.0)
    assert codes(record_count_reasons(5, None, quality)) == ["min_records"]
    assert record_count_reasons(600, 1000, quality) == []
    assert record_count_reasons(9000, 1000, quality) == []
    (drop,) = record_count_reasons(400, 1000, quality, runs=7)
    assert (drop.code, drop.got, drop.baseline, drop.expected) == ("record_drop", 400, 1000, 500)
    assert drop.detail == {"drop_percent": 60.0, "max_drop_percent": 50, "baseline_runs": 7}
    assert "baseline of 1000 (the median of the last 7 accepted runs)" in drop.message


# --- the verdict ----------------------------------------------------------------------------


def tallies_with_garbage(garbage: str = "beta") -> dict[str, PartitionTally]:
    """Three retailers of 100 records each; one of them with unparsable prices."""
    records = [
        (retailer, product(i, retailer, price="N/A" if retailer == garbage else "1.00"))
        for retailer in ("alpha", "beta", "gamma")
        for i in range(100)
    ]
    return tally_records(records, RULES)


def judged(dataset: Dataset, tallies: dict[str, PartitionTally], **kw: Any) -> Any:
    """Judge a run of one finished job with clean imports."""
    return judge(
        dataset,
        jobs=kw.get("jobs", [finished(scheduled=300)]),
        imports=kw.get("imports", ImportFacts(300, 0, 300, 0)),
        tallies=tallies,
    )


def test_a_clean_run_is_accepted_with_every_partition() -> None:
    """No reason, no quarantine: accepted, all partitions publishable."""
    verdict = judged(PRODUCTS, tallies_with_garbage(garbage="none"))
    assert (verdict.state, verdict.reasons) == ("accepted", ())
    assert publishable(verdict) == ("alpha", "beta", "gamma")


def test_a_failing_partition_rejects_the_run_under_the_default_policy() -> None:
    """Policy reject: one quarantined partition rejects the whole run, naming the partition."""
    verdict = judged(PRODUCTS, tallies_with_garbage())
    assert verdict.state == "rejected"
    assert quarantined(verdict) == ("beta",)
    assert publishable(verdict) == ()
    (reason,) = verdict.reasons
    assert (reason.code, reason.partition) == ("partition_quarantined", "beta")


def test_publish_passing_accepts_the_passing_partitions_only() -> None:
    """Policy publish_passing: the run is accepted and only passing partitions are published;
    the counts judge what is published."""
    verdict = judged(replace(PRODUCTS, policy="publish_passing"), tallies_with_garbage())
    assert verdict.state == "accepted"
    assert publishable(verdict) == ("alpha", "gamma")
    assert verdict.counted_records == 200


def test_publish_passing_rejects_when_no_partition_passes() -> None:
    """Nothing passing, nothing to publish: rejected."""
    records = [("a", product(i, "a", price="N/A")) for i in range(10)]
    verdict = judged(replace(PRODUCTS, policy="publish_passing"), tally_records(records, RULES))
    assert verdict.state == "rejected"


def test_a_run_level_failure_rejects_whatever_the_policy() -> None:
    """Cloud's empty pages over the threshold reject even a publish_passing run."""
    jobs = [finished(scheduled=300, jobs_empty=60)]
    verdict = judged(replace(PRODUCTS, policy="publish_passing"), tallies_with_garbage(), jobs=jobs)
    assert verdict.state == "rejected"
    assert "empty_pages" in codes(verdict.reasons)


def test_a_run_waiting_for_clouds_result_stays_a_candidate_unless_already_failing() -> None:
    """A missing Cloud result keeps a clean run a candidate but does not save a bad one."""
    waiting = [replace(finished(scheduled=300), data_quality=None)]
    clean = judged(PRODUCTS, tallies_with_garbage(garbage="none"), jobs=waiting)
    assert clean.state == "candidate"
    assert codes(clean.reasons) == ["cloud_quality_unavailable"]
    assert judged(PRODUCTS, tallies_with_garbage(), jobs=waiting).state == "rejected"


def test_an_empty_run_is_rejected_for_its_record_count() -> None:
    """No records at all: the minimum fails."""
    verdict = judged(PRODUCTS, {}, imports=ImportFacts(40, 40, 0, 0))
    assert verdict.state == "rejected"
    assert set(codes(verdict.reasons)) == {"records_without_key", "min_records"}


def test_waiting_tasks_are_listed_with_their_states() -> None:
    """A run with uncommitted tasks names them and how many."""
    assert waiting_for_tasks({}) is None
    reason = waiting_for_tasks({"job-2": "retry_wait", "job-1": "pending"})
    assert reason is not None
    assert is_waiting(reason)
    assert (reason.got, reason.expected) == (2, 0)
    assert "job-1 (pending), job-2 (retry_wait)" in reason.message


def test_reasons_are_stored_as_plain_values() -> None:
    """A reason becomes a JSON-able dict with its numbers."""
    reason = Reason("min_records", "m", got=0, expected=1, detail={"x": 1})
    assert reason.as_dict() == {
        "code": "min_records",
        "message": "m",
        "got": 0,
        "expected": 1,
        "partition": None,
        "detail": {"x": 1},
    }
    drop = Reason("record_drop", "m", got=700, expected=750, baseline=1000)
    assert (drop.as_dict()["got"], drop.as_dict()["baseline"]) == (700, 1000)


# --- the datasets file's acceptance keys -----------------------------------------------------


def test_the_new_thresholds_are_read_from_the_datasets_file() -> None:
    """max_invalid_records_percent and max_conflicting_duplicates_percent are configurable."""
    datasets = parse_datasets(
        '[datasets.x]\nsitemap = "s"\nentity_key = "k"\npolicy = "publish_passing"\n'
        "[datasets.x.quality]\nmax_invalid_records_percent = 0\n"
        "max_conflicting_duplicates_percent = 2.5\nuse_cloud_quality = false\n"
    )
    quality = datasets.get("x").quality
    assert quality.max_invalid_records_percent == 0.0
    assert quality.max_conflicting_duplicates_percent == 2.5
    assert quality.use_cloud_quality is False
    assert datasets.get("x").policy == "publish_passing"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("max_invalid_records_percent = 150", "at most 100"),
        ("max_empty_pages_percent = -1", "non-negative"),
        ("use_cloud_quality = 1", "true or false"),
        ('parsers = { price = "money" }', "parsers"),
    ],
)
def test_a_wrong_threshold_is_refused_with_its_name(line: str, message: str) -> None:
    """Thresholds outside their range, or of the wrong type, are refused by name."""
    with pytest.raises(DatasetsFileError, match=message):
        parse_datasets(
            f'[datasets.x]\nsitemap = "s"\nentity_key = "k"\n[datasets.x.quality]\n{line}\n'
        )


def test_collection_windows_order_by_time_within_their_kind() -> None:
    """Job windows by number (job-999 before job-1000), dates and ISO weeks as text."""
    from sync.runs.publication import window_order

    assert window_order("job-999") < window_order("job-1000")
    assert window_order("2026-12-01") < window_order("2026-12-02")
    assert window_order("2026-W09") < window_order("2026-W10")
    assert window_order("job-1")[0] != window_order("2026-12-01")[0]
