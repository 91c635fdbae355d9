"""Hostile notifications: whatever is posted, the answer is never a 5xx (Cloud repeats those),
and only a well-formed notification creates a sync task."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import pytest
from flask import Flask
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from sync.bootstrap import Services
from sync.ingest.store import count_rows
from sync.models import Notification, SyncTask
from tests.harness import WEBHOOK_TOKEN

pytestmark = pytest.mark.redis

URL = f"/webhooks/webscraper/{WEBHOOK_TOKEN}"
FIELDS = ("scrapingjob_id", "status", "sitemap_id", "sitemap_name", "custom_id")
LIMITS = {"status": 40}
FIELD_LIMIT = 200
JSON_DEPTH_LIMIT = 1024  # orjson's documented nesting limit
ASCII_JOB_ID = re.compile(r"[0-9]{1,18}")


def _post(web: Flask, body: bytes, content_type: str | None) -> Any:
    headers = {} if content_type is None else {"Content-Type": content_type}
    return web.test_client().post(URL, data=body, headers=headers)


def _tasks(services: Services) -> set[str]:
    with services.uow.begin() as session:
        return set(session.execute(select(SyncTask.task_key)).scalars())


@pytest.mark.parametrize(
    "job_id",
    ["²", "①", "\u0661\u0662\u0663", "\u0661", "12\x00", "-5", "0", "1e3", "9" * 19, "0x1f", " "],
)
def test_a_job_id_that_is_not_ascii_digits_is_refused(
    web: Flask, services: Services, job_id: str
) -> None:
    """Unicode digits, signs, exponents, NUL and overlong numbers are no job id: 400, no task
    (``١٢٣`` never becomes job-123)."""
    response = web.test_client().post(URL, data={"scrapingjob_id": job_id, "status": "finished"})
    assert response.status_code == 400
    assert response.is_json
    assert _tasks(services) == set()


@pytest.mark.parametrize("field", FIELDS)
def test_a_nul_in_any_field_is_refused_and_kept_as_evidence(
    web: Flask, services: Services, field: str
) -> None:
    """A NUL byte anywhere is a 400 (not a 503 from the database), and the refused notification
    is still kept in the inbox with the reason."""
    form = {"scrapingjob_id": "42", "status": "finished", field: "a\x00b"}
    response = web.test_client().post(URL, data=form)
    assert response.status_code == 400
    assert "NUL" in response.json["detail"]
    assert _tasks(services) == set()
    with services.uow.begin() as session:
        (row,) = session.execute(select(Notification)).scalars()
        assert row.outcome.startswith("rejected: ")
        assert "\x00" not in json.dumps(row.form)


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b'{"scrapingjob_id": "7", "x": ' + b"[" * 1100 + b"]" * 1100 + b"}", "application/json"),
        (b'{"scrapingjob_id": "7", "status": "\\ud800"}', "application/json"),
        (b'{"scrapingjob_id": "7", "status": "' + b"f" * 41 + b'"}', "application/json"),
        (b'{"scrapingjob_id": "7", "status": {"deep": 1}}', "application/json"),
        (b'{"scrapingjob_id": true}', "application/json"),
        (b"scrapingjob_id=7&status=%ED%A0%80", "application/x-www-form-urlencoded"),
        (b"scrapingjob_id=7&status=\xff\xfe", "application/x-www-form-urlencoded"),
        (b"{not json", "application/json"),
    ],
    ids=[
        "json-1100-deep",
        "lone-surrogate",
        "status-41-chars",
        "object-as-status",
        "boolean-job-id",
        "form-surrogate",
        "form-invalid-utf8",
        "broken-json",
    ],
)
def test_malformed_bodies_get_a_400_never_a_5xx(
    web: Flask, services: Services, body: bytes, content_type: str
) -> None:
    """Deep JSON, lone surrogates, overlong statuses, non-text values and undecodable forms are
    the sender's mistake: 400 and no task."""
    response = _post(web, body, content_type)
    assert response.status_code == 400
    assert response.is_json
    assert _tasks(services) == set()


def test_json_nested_within_the_limit_is_still_a_notification(
    web: Flask, services: Services
) -> None:
    """Nesting in a field scrapesync ignores is fine while the parser can read it."""
    depth = JSON_DEPTH_LIMIT - 1
    body = b'{"scrapingjob_id": "7", "x": ' + b"[" * depth + b"]" * depth + b"}"
    assert _post(web, body, "application/json").status_code == 200
    assert _tasks(services) == {"job-7"}


# --- the property: thousands of generated bodies ------------------------------------------------

LONE_SURROGATES = st.sampled_from(["\ud800", "a\udfff", "\udc00x", "ok\udbff"])
TEXT = st.one_of(
    st.text(st.characters(exclude_categories=["Cs"]), max_size=60),
    st.text(st.characters(exclude_categories=["Cs"]), min_size=190, max_size=210),
    LONE_SURROGATES,
    st.sampled_from(["finished", "failed", "", " ", "\x00", "²", "١٢٣", "①"]),
)
JOB_IDS = st.one_of(
    st.integers(1, 10**18 - 1).map(str),
    st.integers(1, 10**18 - 1).map(lambda n: f" {n}\t"),
    st.sampled_from(["0", "-1", "1.5", "1e3", "9" * 19, "0x10", "12abc", "٣", "²"]),
    TEXT,
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(-(2**63), 2**63 - 1),
    TEXT,
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=6,
)


@dataclass(frozen=True)
class Case:
    """One generated request: how the fields are encoded, and the fields themselves."""

    encoding: str
    fields: Mapping[str, Any]
    content_type: str | None
    depth: int = 0
    raw: bytes = b""


def _well_formed(case: Case) -> bool:
    """The oracle: a notification scrapesync must accept, by the rules it documents."""
    if case.encoding not in ("form", "multipart", "json"):
        return False
    if case.depth + 1 > JSON_DEPTH_LIMIT:
        return False
    if re.search("[\ud800-\udfff]", json.dumps(case.fields, ensure_ascii=False)):
        return False  # a lone surrogate anywhere makes the whole body undecodable
    for name in FIELDS:
        value = case.fields.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, str | int):
            return False
        text = str(value)
        if len(text) > LIMITS.get(name, FIELD_LIMIT) or "\x00" in text:
            return False
        if any(0xD800 <= ord(c) <= 0xDFFF for c in text):
            return False
    job = str(case.fields.get("scrapingjob_id", "")).strip()
    return bool(ASCII_JOB_ID.fullmatch(job)) and int(job) > 0


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """A generated notification request, well-formed or not."""
    encoding = draw(
        st.sampled_from(["form", "multipart", "json", "json", "raw", "plain", "none", "octets"])
    )
    names = draw(st.lists(st.sampled_from(FIELDS), unique=True, max_size=5))
    if draw(st.booleans()):
        names = ["scrapingjob_id", *[n for n in names if n != "scrapingjob_id"]]
    values = JSON_VALUES if encoding == "json" else TEXT
    fields: dict[str, Any] = {}
    for name in names:
        fields[name] = draw(JOB_IDS if name == "scrapingjob_id" else values)
        if encoding == "json" and name == "scrapingjob_id" and draw(st.booleans()):
            fields[name] = draw(st.integers(-5, 10**18) | JSON_VALUES)
    if draw(st.booleans()):
        fields[draw(st.text(max_size=8))] = draw(values)
    if encoding == "multipart":  # multipart parts carry no lone surrogates to begin with
        fields = {k: v for k, v in fields.items() if not re.search("[\ud800-\udfff]", k + v)}
    depth = draw(st.sampled_from([0, 0, 0, 3, 1000, 1023, 1024, 3000])) if encoding == "json" else 0
    content_type = {
        "form": draw(
            st.sampled_from(
                ["application/x-www-form-urlencoded", "application/x-www-form-urlencoded; a=b"]
            )
        ),
        "json": draw(
            st.sampled_from(["application/json", "application/json; charset=utf-8", "a/b+json"])
        ),
        "multipart": "multipart/form-data",
        "raw": draw(
            st.sampled_from(
                ["application/json", "application/x-www-form-urlencoded", "multipart/form-data"]
            )
        ),
        "plain": "text/plain",
        "octets": "application/octet-stream",
        "none": None,
    }[encoding]
    raw = draw(st.binary(max_size=300)) if encoding in ("raw", "plain", "octets", "none") else b""
    return Case(encoding, fields, content_type, depth, raw)


def _send(web: Flask, case: Case) -> Any:
    client = web.test_client()
    if case.encoding == "form":
        body = urlencode(
            {k: str(v) for k, v in case.fields.items()}, encoding="utf-8", errors="surrogatepass"
        )
        return client.post(URL, data=body.encode(), headers={"Content-Type": case.content_type})
    if case.encoding == "multipart":
        return client.post(URL, data=dict(case.fields), content_type="multipart/form-data")
    if case.encoding == "json":
        fields = dict(case.fields)
        body = json.dumps(fields, ensure_ascii=True)
        if case.depth:
            body = body[:-1] + ("," if fields else "") + f'"zz": {_deep(case.depth)}}}'
        return client.post(URL, data=body.encode(), headers={"Content-Type": case.content_type})
    return _post(web, case.raw, case.content_type)


def _task_count(services: Services) -> int:
    with services.uow.begin() as session:
        return count_rows(session, SyncTask)


def _check(web: Flask, services: Services, case: Case) -> None:
    before = _task_count(services)
    response = _send(web, case)
    assert response.status_code < 500, (case, response.json)
    assert response.is_json
    after = _task_count(services)
    if case.encoding in ("form", "multipart", "json"):
        expected = _well_formed(case)
        assert (response.status_code == 200) == expected, (case, response.json)
        if expected:
            job = int(str(case.fields["scrapingjob_id"]).strip())
            assert response.json["task_key"] == f"job-{job}"
            assert after - before in (0, 1)
            with services.uow.begin() as session:
                assert count_rows(session, SyncTask, SyncTask.task_key == f"job-{job}") == 1
        else:
            assert response.status_code in (400, 413, 415)
            assert after == before
    elif response.status_code != 200:  # raw bytes: only what happens to parse may pass
        assert after == before


HOSTILE = settings(
    max_examples=1000,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.mark.slow
@HOSTILE
@given(case=cases())
def test_generated_bodies_never_get_a_5xx_and_only_well_formed_ones_make_tasks(
    web: Flask, services: Services, case: Case
) -> None:
    """A thousand generated bodies, content types and encodings: never a 5xx; a task
    exactly when the notification is well formed."""
    _check(web, services, case)


@pytest.mark.fuzz
@settings(HOSTILE, max_examples=50_000)
@given(case=cases())
def test_a_long_fuzz_run_finds_no_5xx_and_no_stray_task(
    web: Flask, services: Services, case: Case
) -> None:
    """The same property over fifty thousand bodies (``pytest -m fuzz``)."""
    _check(web, services, case)


def test_the_inbox_keeps_every_refused_notification(web: Flask, services: Services) -> None:
    """Refused notifications are evidence: each one leaves an inbox row saying why."""
    web.test_client().post(URL, data={"scrapingjob_id": "١٢٣"})
    web.test_client().post(URL, data={"scrapingjob_id": "5", "status": "s" * 41})
    with services.uow.begin() as session:
        assert count_rows(session, Notification) == 2
        outcomes = sorted(session.execute(select(Notification.outcome)).scalars())
    assert outcomes == [
        "rejected: scrapingjob_id missing or not a number",
        "rejected: status is longer than 40 characters",
    ]
