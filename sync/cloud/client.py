"""Web Scraper Cloud API client: one httpx.Client, typed errors, retries decided by failure class.

The endpoints, in Cloud's words; `sync.cloud.calls` sends each call and download and decides its
retries. Secrecy: the API token is added as the `api_token` query parameter by the innermost
transport (`sync.cloud.transport`) only, so no URL that httpx logs or puts in an exception
carries it; error messages are scrubbed of every configured secret, and a filter on the "httpx"
logger scrubs any line.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Final

import httpx
import orjson

from sync import http, secrecy
from sync.cloud.budget import ApiBudget
from sync.cloud.calls import CloudCalls
from sync.cloud.download import (
    BOM,
    DEFAULT_MAX_LINE_BYTES,
    KNOWN_RUN,
    InvalidRecord,
    KnownLines,
    Line,
    PieceTap,
    SkippedLine,
    is_json,
)
from sync.cloud.errors import CloudError
from sync.cloud.jobs import CloudJob, ProblematicUrl, as_int
from sync.cloud.policy import RetryPolicy
from sync.cloud.transport import Secret, TokenTransport, install_log_redaction

DEFAULT_BASE_URL: Final = "https://api.webscraper.io/api/v1/"
USER_AGENT: Final = "scrapesync/0.1"


def _id(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"Cloud ids are ints, got {value!r}")
    return value


# --- the client -------------------------------------------------------------------------------


PROGRESS_EVERY = 1000  # records between two progress reports
ProgressHook = Callable[[str, int, int | None], None]


def _unknown(marks: list[int]) -> list[int]:
    """Where in a block the lines that were not recognised (-1) are."""
    return [at for at, mark in enumerate(marks) if mark < 0]


def _known_runs(run: list[int], end: int) -> Iterator[tuple[int, KnownLines]]:
    """Hand on ``run`` (the indexes of consecutive known lines, the last of them line ``end``)
    KNOWN_RUN at a time, numbered as the last of each; what is left of it stays in it."""
    whole = len(run) - len(run) % KNOWN_RUN
    for at in range(0, whole, KNOWN_RUN):
        yield end - (len(run) - at - KNOWN_RUN), KnownLines(run[at : at + KNOWN_RUN])
    del run[:whole]


class CloudClient:
    """Web Scraper Cloud API over one httpx.Client: typed errors, retries, a shared API budget."""

    def __init__(
        self,
        *,
        token: str,
        base_url: str = DEFAULT_BASE_URL,
        transport: httpx.BaseTransport | None = None,
        budget: ApiBudget | None = None,
        retry: RetryPolicy | None = None,
        timeout: float = 30.0,
        download_timeout: float = 600.0,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not token:
            raise ValueError("a Web Scraper Cloud API token is required")
        secrecy.register(token)
        install_log_redaction()
        self._secret = Secret(token)
        self._max_line_bytes = max_line_bytes
        # Told how far long work has come: ("records", read, stored_record_count) while an
        # export streams, (list path, page, last_page) while a listing pages. For progress bars.
        self.progress: ProgressHook | None = None
        self._record_counts: dict[int, int] = {}
        self._http = httpx.Client(
            base_url=base_url,
            transport=TokenTransport(
                http.transport(transport),
                self._secret,
            ),
            timeout=httpx.Timeout(timeout),
            headers={"Accept": "application/json, text/javascript, */*", "User-Agent": USER_AGENT},
            follow_redirects=False,
        )
        self._calls = CloudCalls(
            self._http,
            self._secret,
            budget=budget,
            retry=retry if retry is not None else RetryPolicy(),
            download_timeout=httpx.Timeout(timeout, read=download_timeout),
            max_line_bytes=max_line_bytes,
            sleep=sleep,
            clock=clock,
        )

    def __repr__(self) -> str:
        return f"CloudClient(base_url={str(self._http.base_url)!r})"

    def __enter__(self) -> CloudClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Release the HTTP connections."""
        self._http.close()

    # --- scraping jobs ------------------------------------------------------------------------

    def get_job(self, job_id: int) -> CloudJob:
        """Ask Cloud for one scraping job's current state."""
        path = f"scraping-job/{_id(job_id)}"
        job = CloudJob.from_api(self._object(self._calls.call("GET", path)["data"], "GET", path))
        if job.id != job_id:  # never take another job's state (or, later, its export) for this one
            raise CloudError(f"GET {path}: Cloud answered with scraping job {job.id}")
        self._record_counts[job.id] = job.stored_record_count
        return job

    def iter_jobs(self, *, sitemap_id: int | None = None) -> Iterator[CloudJob]:
        """Every scraping job of the account (or of one sitemap), page by page, each once."""
        seen: set[int] = set()
        for _page, jobs in self.iter_job_pages(sitemap_id=sitemap_id):
            for job in jobs:
                if job.id not in seen:  # a job created mid-listing shifts the pages under us
                    seen.add(job.id)
                    yield job

    def iter_job_pages(
        self, *, sitemap_id: int | None = None, start_page: int = 1
    ) -> Iterator[tuple[int, list[CloudJob]]]:
        """The job list page by page from ``start_page``, so a listing interrupted by a rate
        limit resumes where it stopped instead of spending calls on pages it already has."""
        params = {} if sitemap_id is None else {"sitemap_id": f"{_id(sitemap_id)}"}
        for page, items in self._page_lists("scraping-jobs", params, start_page=start_page):
            yield (
                page,
                [CloudJob.from_api(self._object(item, "GET", "scraping-jobs")) for item in items],
            )

    def create_job(
        self,
        *,
        sitemap_id: int,
        driver: str = "fulljs",
        page_load_delay: int = 2000,
        request_interval: int = 2000,
        proxy: int | str = 0,
        start_urls: Sequence[str] | None = None,
        custom_id: str | None = None,
    ) -> int:
        """Start a scraping job and return its id; a 5xx or lost answer is never re-sent."""
        body: dict[str, Any] = {
            "sitemap_id": _id(sitemap_id),
            "driver": driver,
            "page_load_delay": page_load_delay,
            "request_interval": request_interval,
            "proxy": proxy,
        }
        if isinstance(start_urls, str):
            raise TypeError("start_urls is a sequence of URLs, not one string")
        if start_urls is not None:
            body["start_urls"] = list(start_urls)
        if custom_id is not None:
            body["custom_id"] = custom_id
        envelope = self._calls.call("POST", "scraping-job", body=body, idempotent=False)
        data = self._object(envelope["data"], "POST", "scraping-job")
        job_id = as_int(data.get("id"))
        if job_id <= 0:
            raise CloudError(f"POST scraping-job: HTTP 200 without a job id: {data!r}")
        return job_id

    def iter_records(self, job_id: int) -> Iterator[dict[str, Any]]:
        """Stream a scraping job's records from the gzip JSON Lines export, one at a time; a
        line that is no storable record raises CloudError (see iter_export to set it aside)."""
        for number, item in self.iter_export(job_id):
            if isinstance(item, InvalidRecord):
                what = (
                    "is not a JSON object"
                    if item.reason in ("not_json", "not_an_object")
                    else f"is invalid ({item.reason}: {item.detail})"
                )
                raise CloudError(f"GET scraping-job/{job_id}/json: line {number} {what}")
            assert isinstance(item, dict), "no line is known without a caller that knows it"
            yield item

    def export_lines(self, job_id: int, *, tap: PieceTap | None = None) -> Iterator[Line]:
        """Stream a scraping job's JSON Lines export as its lines, unparsed, each without its
        line break (a line that is too long or not UTF-8 comes as a SkippedLine); ``tap`` sees
        the body itself as it comes."""
        return itertools.chain.from_iterable(self.export_blocks(job_id, tap=tap))

    def export_blocks(self, job_id: int, *, tap: PieceTap | None = None) -> Iterator[list[Line]]:
        """The lines of :meth:`export_lines`, a gunzipped piece of the body at a time (a list
        of them), for a caller that goes through them in bulk."""
        return self._calls.download_blocks(
            f"scraping-job/{_id(job_id)}/json", final_line_ok=is_json, tap=tap
        )

    def iter_export(
        self,
        job_id: int,
        blocks: Iterable[list[Line]] | None = None,
        *,
        known: Callable[[list[Line]], list[int]] | None = None,
    ) -> Iterator[tuple[int, dict[str, Any] | InvalidRecord | KnownLines]]:
        """Stream a scraping job's JSON Lines export as (line number, record); a line that is
        too long, not UTF-8, not JSON or not an object comes as an InvalidRecord instead, and
        the stream goes on. Blank lines are skipped. ``blocks`` are the export's lines, a piece
        at a time, when the caller has them already (from :meth:`export_blocks`). ``known`` is
        asked about each block before any line of it is parsed, and says per line whether the
        caller recognises it (an index) or not (-1): recognised lines come unparsed, together
        as KnownLines (numbered as the last of them), up to KNOWN_RUN at a time."""
        number = 0
        progress, total = self.progress, self._record_counts.get(job_id)
        run: list[int] = []  # the indexes of known lines not yet handed on
        for block in self.export_blocks(job_id) if blocks is None else blocks:
            base, number = number, number + len(block)
            if progress is not None:
                for mark in range(base // PROGRESS_EVERY + 1, number // PROGRESS_EVERY + 1):
                    progress("records", mark * PROGRESS_EVERY, total)
            marks = known(block) if known is not None else None
            after = 0  # the first line of the block not yet handed on
            # the lines to parse: every one, or those not known (each one ends a run)
            for at in range(len(block)) if marks is None else _unknown(marks):
                if at > after:  # known lines before this one
                    assert marks is not None
                    run += marks[after:at]
                    yield from _known_runs(run, base + at)
                if run:
                    yield base + at, KnownLines(run)
                    run = []
                after = at + 1
                item = self._record(block[at], base + at + 1)
                if item is not None:
                    yield base + at + 1, item
            if marks is not None and after < len(block):
                run += marks[after:]
                yield from _known_runs(run, number)
        if run:
            yield number, KnownLines(run)
        if progress is not None:
            progress("records", number, total)

    def _record(self, line: Line, number: int) -> dict[str, Any] | InvalidRecord | None:
        """The record on line ``number`` of an export, an InvalidRecord, or None for a blank
        line."""
        if isinstance(line, SkippedLine):
            limit = f"the limit is {self._max_line_bytes} bytes"
            detail = f"{line.size} bytes; {limit}" if line.reason == "line_too_long" else ""
            return InvalidRecord(number, line.reason, detail or "not UTF-8")
        if number == 1:
            line = line.removeprefix(BOM)
        try:
            record = orjson.loads(line)  # several times faster than json on big exports
        except orjson.JSONDecodeError as exc:
            if not line.decode().strip():  # a blank line (white space of any kind)
                return None
            return InvalidRecord(number, "not_json", str(exc)[:200])
        if not isinstance(record, dict):
            return InvalidRecord(number, "not_an_object", type(record).__name__)
        return record

    def iter_problematic_urls(self, job_id: int) -> Iterator[ProblematicUrl]:
        """Every empty, failed or no-value page of a scraping job, page by page."""
        path = f"scraping-job/{_id(job_id)}/problematic-urls"
        for item in self._pages(path, {}):
            data = self._object(item, "GET", path)
            yield ProblematicUrl(url=str(data.get("url", "")), type=str(data.get("type", "")))

    def get_data_quality(self, job_id: int) -> dict[str, Any]:
        """Cloud's data-quality verdict for a finished job (CloudValidationError before then)."""
        path = f"scraping-job/{_id(job_id)}/data-quality"
        return self._object(self._calls.call("GET", path)["data"], "GET", path)

    # --- account and sitemaps -----------------------------------------------------------------

    def get_account(self) -> dict[str, Any]:
        """The account's e-mail, names and remaining page credits."""
        return self._object(self._calls.call("GET", "account")["data"], "GET", "account")

    def get_sitemap(self, sitemap_id: int) -> dict[str, Any]:
        """One sitemap: id, name and its JSON definition as a string."""
        path = f"sitemap/{_id(sitemap_id)}"
        return self._object(self._calls.call("GET", path)["data"], "GET", path)

    def iter_sitemaps(self) -> Iterator[dict[str, Any]]:
        """Every sitemap of the account (id and name), page by page."""
        for item in self._pages("sitemaps", {}):
            yield self._object(item, "GET", "sitemaps")

    # --- listings -----------------------------------------------------------------------------

    def _pages(self, path: str, params: Mapping[str, str]) -> Iterator[Any]:
        for _page, data in self._page_lists(path, params):
            yield from data

    def _page_lists(
        self, path: str, params: Mapping[str, str], *, start_page: int = 1
    ) -> Iterator[tuple[int, list[Any]]]:
        page = max(1, start_page)
        while True:
            envelope = self._calls.call("GET", path, params={**params, "page": str(page)})
            data = envelope.get("data")
            if not isinstance(data, list) or not data:
                return
            last_page = as_int(envelope.get("last_page"), default=page)
            if self.progress is not None:
                self.progress(path, page, last_page)
            yield page, data
            if page >= last_page:
                return
            page += 1

    def _object(self, data: Any, method: str, path: str) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise CloudError(f"{method} {path}: expected a JSON object, got {type(data).__name__}")
        return data
