"""Known lines: an import of a run that finds again the lines its rows were written from counts
them unchanged without parsing them, and stores and counts exactly what a full import does."""

from __future__ import annotations

import itertools
import threading
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select, text

from sync.bootstrap import Services
from sync.cloud import client
from sync.cloud.client import CloudClient
from sync.cloud.download import KnownLines
from sync.identity import Identified, RecordIdentity
from sync.ingest import line_digests
from sync.ingest.line_digests import LineDigests
from sync.ingest.records import ExportRead, stage_export
from sync.ingest.repeat import read_rules
from sync.ingest.staging import ObservationStager, Source, UpsertCounts
from sync.models import Observation

pytestmark = pytest.mark.postgres

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
_windows = itertools.count(1)


class CountingIdentity(RecordIdentity):
    """RecordIdentity that counts the records it was asked about: the lines that were parsed."""

    parsed = 0

    def __call__(self, record: Any, payload: dict[str, Any] | None = None) -> Identified | None:
        self.parsed += 1
        return super().__call__(record, payload)


def line(sku: str, price: str, order: int = 1, **more: Any) -> bytes:
    """One export line of the products dataset, as a download hands it on."""
    record = {"web-scraper-order": f"1-{order}", "sku": sku, "price": price, **more}
    return orjson.dumps(record)


def _import(
    services: Services,
    attempt: str,
    lines: list[bytes],
    *,
    window: str,
    known: bool = True,
    max_record_bytes: int = 1 << 20,
    expected: int = 0,
) -> tuple[UpsertCounts, ExportRead, int]:
    """Import ``lines`` into the run of ``window`` as a sync does (``known``: with the run's
    stored line digests, read beside the download, merged two records at a time while they are
    read; else in full, merged after the download; ``expected``: the records the job says it
    has); (counts, what was read, how many records were parsed)."""
    dataset = services.datasets.get("products")
    run_id = f"run-{window}"
    rules = read_rules(
        dataset,
        run_id=run_id,
        window=window,
        frozen=(),
        max_record_bytes=max_record_bytes,
        max_line_bytes=1 << 20,
    )
    identify = CountingIdentity(dataset, window)
    source = Source("products", run_id, window, 1, attempt, NOW)
    with services.uow.begin() as session:
        digests = (
            LineDigests.reading(services.uow.engine, rules, run_id, expected=expected)
            if known
            else LineDigests(rules)
        )
        stager = ObservationStager(  # the full import is the merge after the download
            session, run_id=run_id, source=source, lines=digests, merge_early=known, merge_batch=2
        )
        if not stager.knows_lines:
            digests = LineDigests(rules)
        blocks = [lines[at : at + 2] for at in range(0, len(lines), 2)]  # as a download has them
        records = CloudClient(token="line-digests-test").iter_export(
            1, digests.ahead(blocks), known=digests.marks
        )
        read = stage_export(
            stager,
            records,
            identify,
            frozen=frozenset(),
            max_record_bytes=max_record_bytes,
            tick=lambda _: None,
            lines=digests,
        )
        counts = stager.merge(source, now=NOW)
        session.commit()
    return counts, read, identify.parsed


def _stored(services: Services, window: str) -> dict[str, tuple[Any, ...]]:
    """entity key -> what its observation in the window's run holds."""
    o = Observation.__table__.c
    with services.uow.begin() as session:
        rows = session.execute(
            select(
                o.entity_key,
                o.payload,
                o.payload_hash,
                o.partition,
                o.source_attempt_id,
                o.last_changed_at,
                o.line_digest,
            ).where(o.run_id == f"run-{window}")
        ).all()
    return {r[0]: tuple(r[1:]) for r in rows}


def _xmins(services: Services, window: str) -> dict[str, int]:
    with services.uow.begin() as session:
        rows = session.execute(
            text("SELECT entity_key, xmin::text::bigint FROM observations WHERE run_id = :r"),
            {"r": f"run-{window}"},
        ).all()
    return {key: xmin for key, xmin in rows}


def _window() -> str:
    return f"job-{next(_windows)}-{datetime.now(UTC).timestamp():.0f}"


def test_a_continue_parses_only_the_lines_that_changed(services: Services) -> None:
    """The first import writes every row with its line's digest; a second import of the same
    run with a tenth of the lines changed parses those alone, updates their rows (and their
    digests) and neither parses nor rewrites the rest, with the counts a full import gives."""
    window = _window()
    first = [line(f"S{i}", f"{i}.00", order=i) for i in range(100)]
    counts, read, parsed = _import(services, "a1", first, window=window)
    assert (counts.inserted, read.read, parsed) == (100, 100, 100)
    stored = _stored(services, window)
    assert all(row[5] is not None for row in stored.values())  # every row has its digest
    before = _xmins(services, window)

    second = [line(f"S{i}", f"{i}.99", order=i) if i % 10 == 9 else first[i] for i in range(100)]
    counts, read, parsed = _import(services, "a2", second, window=window)
    assert counts == UpsertCounts(100, 0, 10, 90, 0, 0)
    assert (read.read, parsed) == (100, 10)
    after = _xmins(services, window)
    rewritten = {key for key in after if after[key] != before[key]}
    assert rewritten == {f"S{i}" for i in range(9, 100, 10)}
    now_stored = _stored(services, window)
    assert now_stored["S9"][0]["price"] == "9.99"
    assert now_stored["S9"][5] != stored["S9"][5]  # the changed row names its new line

    # the same export again: every line is known, none is parsed, nothing is written
    counts, read, parsed = _import(services, "a3", second, window=window)
    assert counts == UpsertCounts(100, 0, 0, 100, 0, 0)
    assert parsed == 0
    assert _xmins(services, window) == after


def test_known_lines_come_in_runs_in_their_place_among_the_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Known lines are handed on unparsed, together, at most KNOWN_RUN (here 2) at a time and
    numbered as the last of them, each run before the record or blank line that ends it, however
    the download's pieces cut the lines."""
    monkeypatch.setattr(client, "KNOWN_RUN", 2)
    a, b, c, d, e, f, g = (line(sku, "1") for sku in "ABCDEFG")
    indexes = {a: 0, b: 1, c: 2, e: 4, f: 5, g: 6}
    export = [a, b, c, b"", d, e, f, g]
    want = [
        (2, KnownLines([0, 1])),
        (3, KnownLines([2])),
        (5, orjson.loads(d)),
        (7, KnownLines([4, 5])),
        (8, KnownLines([6])),
    ]
    for cuts in ([], [1], [2, 3], [4, 6], [1, 2, 3, 4, 5, 6, 7]):
        blocks = [export[i:j] for i, j in itertools.pairwise([0, *cuts, len(export)])]
        items = list(
            CloudClient(token="line-digests-test").iter_export(
                1, blocks, known=lambda block: [indexes.get(text, -1) for text in block]
            )
        )
        assert items == want, cuts


def test_lines_that_come_while_the_digests_are_read_are_digested_ahead_and_known_alike(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the run's digests are still being read the download goes on: lines are read
    ahead and digested (up to AHEAD_BYTES, here 300), and once the digests come the same lines
    are known as when the digests came first, a first line's byte order mark cut or not."""
    window = _window()
    first = [line(f"S{i}", "1.00", order=i) for i in range(8)]
    _import(services, "a1", first, window=window)
    rules = read_rules(
        services.datasets.get("products"),
        run_id=f"run-{window}",
        window=window,
        frozen=(),
        max_record_bytes=1 << 20,
        max_line_bytes=1 << 20,
    )
    export = ["\ufeff".encode() + first[0], *first[1:4], line("N", "2.00"), *first[4:]]
    reference = LineDigests.reading(services.uow.engine, rules, f"run-{window}")
    reference.wait()
    want = list(CloudClient(token="t").iter_export(1, [export], known=reference.marks))

    release = threading.Event()
    real_read = LineDigests._read_first

    def slow_read(self: LineDigests, raw: Any, run_id: str) -> bool:
        assert release.wait(30)
        return real_read(self, raw, run_id)

    monkeypatch.setattr(LineDigests, "_read_first", slow_read)
    monkeypatch.setattr(line_digests, "AHEAD_BYTES", 300)
    digests = LineDigests.reading(services.uow.engine, rules, f"run-{window}")
    blocks = digests.ahead([[text] for text in export])
    head = next(blocks)  # handed on while the digests are still being read
    assert digests.pending
    assert 0 < len(digests._ahead) < len(export)  # digested ahead, no further than allowed
    release.set()
    got = list(
        CloudClient(token="t").iter_export(1, itertools.chain([head], blocks), known=digests.marks)
    )
    assert got == want
    assert [type(item).__name__ for _, item in got] == ["KnownLines", "dict", "KnownLines"]


def test_digests_that_cannot_be_read_fail_the_lookup_that_waits_for_them(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What stops the reading of the run's digests (the database gone, here a stand-in) is
    raised where the import looks a line up, so the sync fails as it would reading them."""

    def broken(self: LineDigests, raw: Any, run_id: str) -> bool:
        raise RuntimeError("the database went away")

    monkeypatch.setattr(LineDigests, "_read_first", broken)
    digests = LineDigests.reading(services.uow.engine, "rules", "run-x")
    with pytest.raises(RuntimeError, match="went away"):
        digests.marks([line("A", "1")])


@pytest.mark.parametrize("expected", [0, 41], ids=["found-large", "said-large"])
def test_a_run_too_large_for_a_dict_of_its_digests_knows_the_same_lines(
    services: Services, monkeypatch: pytest.MonkeyPatch, expected: int
) -> None:
    """A run of more rows than a dict of digests is kept for (here 8) reads its digests again,
    sorted, into arrays, and knows the same lines as a small run does; a job that says it has
    more records than that has its run read sorted at once, without the first read."""
    monkeypatch.setattr(line_digests, "DICT_ROWS", 8)
    monkeypatch.setattr(line_digests, "FETCH", 3)  # the sorted read, a few rows at a time
    window = _window()
    first = [line(f"S{i}", f"{i}.00", order=i) for i in range(40)]
    _import(services, "a1", first, window=window)
    second = [line(f"S{i}", f"{i}.99", order=i) if i % 10 == 3 else first[i] for i in range(40)]
    second.append(line("N", "1.00", order=40))
    counts, read, parsed = _import(services, "a2", second, window=window, expected=expected)
    assert (read.read, parsed) == (41, 5)
    assert counts == UpsertCounts(41, 1, 4, 36, 0, 0)
    assert _stored(services, window)["S13"][0]["price"] == "13.99"


def test_a_job_that_says_it_is_large_over_a_small_run_knows_the_same_lines(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job's word is a guess: its run may hold far fewer rows (a sync cut short, another
    job's). Read sorted at once all the same, the few stored lines are known, the rest parsed."""
    monkeypatch.setattr(line_digests, "DICT_ROWS", 8)
    window = _window()
    first = [line(f"S{i}", f"{i}.00", order=i) for i in range(5)]
    _import(services, "a1", first, window=window)
    second = [line(f"S{i}", f"{i}.99" if i == 3 else f"{i}.00", order=i) for i in range(40)]
    counts, read, parsed = _import(services, "a2", second, window=window, expected=40)
    assert (read.read, parsed) == (40, 36)
    assert counts == UpsertCounts(40, 35, 1, 4, 0, 0)
    assert _stored(services, window)["S3"][0]["price"] == "3.99"


def test_a_known_line_and_another_line_of_its_key_count_and_win_as_in_a_full_import(
    services: Services,
) -> None:
    """A key that comes on a known line and on another line too is a duplicate key, as in a full
    import, and the last of its lines wins: the other line after the known one writes its
    payload; the known line after the other one keeps the row as it is."""
    window = _window()
    stored_a, stored_b = line("A", "1", order=1), line("B", "1", order=2)
    _import(services, "a1", [stored_a, stored_b], window=window)

    counts, _, parsed = _import(
        services, "a2", [stored_a, stored_b, line("A", "2", order=3)], window=window
    )
    assert parsed == 1
    assert counts == UpsertCounts(3, 0, 1, 1, 1, 1)
    assert _stored(services, window)["A"][0]["price"] == "2"

    written_a = line("A", "2", order=3)  # the line A's row now holds
    counts, _, _ = _import(
        services, "a3", [line("A", "5", order=4), written_a, stored_b], window=window
    )
    assert counts == UpsertCounts(3, 0, 0, 2, 1, 1)
    assert _stored(services, window)["A"][0]["price"] == "2"

    counts, _, parsed = _import(services, "a4", [stored_b, stored_b, written_a], window=window)
    assert parsed == 0
    assert counts == UpsertCounts(3, 0, 0, 2, 1, 0)  # the same line twice: not conflicting


def test_a_first_sync_that_falls_back_from_the_straight_copy_keeps_each_rows_line(
    services: Services,
) -> None:
    """A key twice in a run's first export undoes the copy straight in; the records staged from
    its spool keep their lines' digests, so the row holds the digest of the line that won."""
    window = _window()
    lines = [line("A", "1", order=1), line("B", "1", order=2), line("A", "2", order=3)]
    counts, _, _ = _import(services, "a1", lines, window=window)
    assert counts == UpsertCounts(3, 2, 0, 0, 1, 1)
    counts, _, parsed = _import(services, "a2", lines, window=window)
    assert parsed == 1  # A's first line: its row was written from its last
    assert counts == UpsertCounts(3, 0, 0, 2, 1, 1)
    assert _stored(services, window)["A"][0]["price"] == "2"


def test_lines_read_under_other_rules_are_parsed_again(services: Services) -> None:
    """A digest names a line read under the rules it was written with: an import under other
    rules (here a lower record size limit) parses every line, and sets aside what those rules
    refuse, as a full import does."""
    window = _window()
    lines = [line("A", "1"), line("B", "1", note="x" * 300)]
    _import(services, "a1", lines, window=window)
    counts, read, parsed = _import(services, "a2", lines, window=window, max_record_bytes=200)
    assert parsed == 2
    assert read.invalid.count == 1
    assert counts == UpsertCounts(1, 0, 0, 1, 0, 0)


_skus = st.sampled_from(["A", "B", "C", "D", "E"])
_line = st.builds(
    line,
    _skus,
    st.sampled_from(["1", "2"]),
    order=st.integers(min_value=1, max_value=3),  # the same record on lines that differ
)
_junk = st.sampled_from([b"not json", b'{"price": "3"}', b"[1, 2]", b"", " \u3000".encode()])
_export = st.lists(st.one_of(_line, _line, _line, _junk), max_size=12)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(exports=st.lists(_export, min_size=1, max_size=4))
def test_an_import_with_known_lines_stores_and_counts_what_a_full_import_does(
    services: Services, exports: list[list[bytes]]
) -> None:
    """Any sequence of exports into one run, imported with known lines, leaves the rows and
    counts that importing the same sequence in full leaves (line digests aside: they name the
    window they were read for)."""
    with_known, in_full = _window(), _window()
    for number, export in enumerate(exports, start=1):
        attempt = f"a{number}"
        known = _import(services, attempt, export, window=with_known)
        full = _import(services, attempt, export, window=in_full, known=False)
        assert known[0] == full[0]
        assert (known[1].read, known[1].missing_key, known[1].invalid.count) == (
            full[1].read,
            full[1].missing_key,
            full[1].invalid.count,
        )
        assert known[2] <= full[2]
        got = {key: row[:5] for key, row in _stored(services, with_known).items()}
        want = {key: row[:5] for key, row in _stored(services, in_full).items()}
        assert got == want
