"""Data export bodies as Cloud serves them: JSON Lines, CSV and XLSX, optionally gzip-streamed.

JSON Lines and CSV are generators of byte chunks so a million-record job streams in constant
memory. Each record gets the two meta columns first: ``web-scraper-order`` (``"<time>-<n>"``)
and ``web-scraper-start-url``: the start URL the record was supplied with, else one of the job's
start URLs, taken in turn (record n of a job with k start URLs came from start URL n mod k).
"""

from __future__ import annotations

import io
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape

from simulator.records import META_COLUMNS, RecordSet, php_json

CHUNK_BYTES = 64 * 1024
BOM = "\ufeff"


@dataclass(frozen=True)
class Export:
    """What one download renders: a job's records and the meta values stamped on them."""

    records: RecordSet
    order_time: int
    start_urls: tuple[str, ...]
    consent: bool = False

    def start_urls_of_records(self) -> Iterator[str]:
        """Yield each record's start URL: its own, else the job's start URLs in turn."""
        urls = self.start_urls or ("",)
        for n, own in enumerate(self.records.iter_start_urls()):
            yield own if own is not None else urls[n % len(urls)]

    def jsonl(self) -> Iterator[bytes]:
        """Stream JSON Lines: one PHP-style object per line, meta keys first, each line ends \\n."""
        parts: list[str] = []
        size = 0
        prefix_head = f'{{"web-scraper-order":"{self.order_time}-'
        tails = [f'","web-scraper-start-url":{php_json(url)}' for url in self.start_urls or ("",)]
        bodies = self.records.iter_json_bodies(consent=self.consent)
        owns = self.records.iter_start_urls()
        for n, (body, own) in enumerate(zip(bodies, owns, strict=True), start=1):
            prefix_tail = (
                tails[(n - 1) % len(tails)]
                if own is None
                else f'","web-scraper-start-url":{php_json(own)}'
            )
            if body == "{}":
                line = f"{prefix_head}{n}{prefix_tail}}}\n"
            else:
                line = f"{prefix_head}{n}{prefix_tail},{body[1:]}\n"
            parts.append(line)
            size += len(line)
            if size >= CHUNK_BYTES:
                yield "".join(parts).encode("ascii")
                parts, size = [], 0
        if parts:
            yield "".join(parts).encode("ascii")

    def csv(self, *, bom: bool = True) -> Iterator[bytes]:
        """Stream CSV: unquoted header, every data cell quoted, CRLF line ends, optional BOM."""
        columns = self.records.columns(consent=self.consent)
        header = ",".join([*META_COLUMNS, *columns]) + "\r\n"
        parts: list[str] = [(BOM if bom else "") + header]
        size = len(header)
        records = self.records.iter_records(consent=self.consent)
        starts = self.start_urls_of_records()
        for n, (record, start) in enumerate(zip(records, starts, strict=True), start=1):
            cells = [f'"{self.order_time}-{n}"', _quote(start)]
            cells.extend(_quote(_cell(record.get(name))) for name in columns)
            line = ",".join(cells) + "\r\n"
            parts.append(line)
            size += len(line)
            if size >= CHUNK_BYTES:
                yield "".join(parts).encode("utf-8")
                parts, size = [], 0
        if parts:
            yield "".join(parts).encode("utf-8")

    def xlsx(self) -> bytes:
        """Build a one-sheet XLSX workbook with inline strings (built in memory)."""
        columns = self.records.columns(consent=self.consent)
        rows: list[str] = [_xlsx_row([*META_COLUMNS, *columns])]
        records = self.records.iter_records(consent=self.consent)
        starts = self.start_urls_of_records()
        for n, (record, start) in enumerate(zip(records, starts, strict=True), start=1):
            values = [f"{self.order_time}-{n}", start]
            values.extend(_cell(record.get(name)) for name in columns)
            rows.append(_xlsx_row(values))
        sheet = (
            '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
            '<worksheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main">'
            f"<sheetData>{''.join(rows)}</sheetData></worksheet>"
        )
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, text in _XLSX_PARTS.items():
                archive.writestr(name, text)
            archive.writestr("xl/worksheets/sheet1.xml", sheet)
        return buffer.getvalue()


def gzip_stream(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Gzip a byte stream chunk by chunk (one gzip member, constant memory)."""
    compressor = zlib.compressobj(1, zlib.DEFLATED, 31)  # nginx gzip_comp_level default
    for chunk in chunks:
        out = compressor.compress(chunk)
        if out:
            yield out
    yield compressor.flush()


def _cell(value: Any) -> str:
    """Render a field for CSV/XLSX; a missing value is written as Cloud's literal null."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return value
    return php_json(value).replace("\\/", "/")


def _quote(text: str) -> str:
    """Quote one CSV data cell, doubling embedded quotes (RFC 4180)."""
    return '"' + text.replace('"', '""') + '"'


def _xlsx_row(values: Iterable[str]) -> str:
    """Render one worksheet row of inline-string cells."""
    cells = "".join(
        f'<c t="inlineStr"><is><t xml:space="preserve">{escape(v)}</t></is></c>' for v in values
    )
    return f"<row>{cells}</row>"


_XLSX_PARTS: dict[str, str] = {
    "[Content_Types].xml": (
        '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
        '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
        '<Default Extension="rels" '
        'ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
        '<Default Extension="xml" ContentType="application/xml"/>'
        '<Override PartName="/xl/workbook.xml" ContentType="application/'
        'vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml"/>'
        '<Override PartName="/xl/worksheets/sheet1.xml" ContentType="application/'
        'vnd.openxmlformats-officedocument.spreadsheetml.worksheet+xml"/>'
        "</Types>"
    ),
    "_rels/.rels": (
        '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
        '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
        '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/'
        'relationships/officeDocument" Target="xl/workbook.xml"/></Relationships>'
    ),
    "xl/workbook.xml": (
        '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
        '<workbook xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main" '
        'xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships">'
        '<sheets><sheet name="Sheet1" sheetId="1" r:id="rId1"/></sheets></workbook>'
    ),
    "xl/_rels/workbook.xml.rels": (
        '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
        '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
        '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/'
        'relationships/worksheet" Target="worksheets/sheet1.xml"/></Relationships>'
    ),
}
