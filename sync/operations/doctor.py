"""``scrapesync doctor``: does this deployment work, before the first job finds out?

Each check ends in a pass or a fail, with a hint saying what to do about a failure: the
variables a deployment needs, the datasets file, the database (reachable, migrated to head),
Redis, the Cloud token (one cheap call), and, for each dataset, its sitemap in the Cloud account,
that every field the dataset names (``entity_key``, ``required``, ``partition``, ``parsers``) is a
column of that sitemap, that its destinations' signing secrets are set, and that every alert
channel's variables are set. Cloud calls are counted against the API budget every process
shares. No check shows a secret.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import httpx
from redis import Redis
from redis.exceptions import RedisError
from sqlalchemy import make_url
from sqlalchemy.exc import SQLAlchemyError

from config.datasets import Dataset, Datasets, DatasetsFileError, load_datasets
from config.settings import REQUIRED_VARIABLES, Settings
from sync.cloud.budget import ApiBudget, MemoryApiBudget, RedisApiBudget, account_key_for
from sync.cloud.client import CloudClient
from sync.cloud.errors import CloudAuthError, CloudError, CloudNotFoundError
from sync.cloud.policy import RetryPolicy

# Cloud adds these columns to every record; a dataset may name them like selector columns.
META_COLUMNS = ("web-scraper-order", "web-scraper-start-url")
# Selector types whose records carry a second, derived column besides the selector id.
DERIVED_COLUMNS = {"SelectorLink": "-href", "SelectorPopupLink": "-href", "SelectorImage": "-src"}


@dataclass(frozen=True)
class Check:
    """One check: what was checked, whether it passed, what was found, and what to do."""

    name: str
    ok: bool
    detail: str
    hint: str = ""

    def line(self) -> str:
        """The check as the one line (two on failure) a person reads."""
        text = f"{'ok  ' if self.ok else 'FAIL'}  {self.name}: {self.detail}"
        if not self.ok and self.hint:
            text += f"\n      hint: {self.hint}"
        return text


@dataclass(frozen=True)
class Report:
    """Every check of one doctor run."""

    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        """Whether every check passed."""
        return all(check.ok for check in self.checks)

    def as_dict(self) -> dict[str, Any]:
        """The report as plain values (``--json``)."""
        return {"ok": self.ok, "checks": [asdict(check) for check in self.checks]}

    def text(self) -> str:
        """The report as lines, with a last line that sums it up."""
        failed = sum(not check.ok for check in self.checks)
        summary = (
            f"all {len(self.checks)} checks passed"
            if not failed
            else f"{failed} of {len(self.checks)} checks failed"
        )
        return "\n".join([*(check.line() for check in self.checks), summary])

    def to_json(self) -> str:
        """The report as JSON text."""
        return json.dumps(self.as_dict(), indent=2)


def diagnose(
    settings: Settings,
    *,
    transport: httpx.BaseTransport | None = None,
    redis: Redis | None = None,
) -> Report:
    """Run every check against this deployment's settings (parts may be handed in by tests)."""
    checks: list[Check] = list(_variables(settings))
    datasets, check = _datasets(settings)
    checks.append(check)
    checks.append(_database(settings))
    if redis is None and settings.redis_url:
        redis = Redis.from_url(
            settings.redis_url, socket_connect_timeout=5, socket_timeout=5, health_check_interval=0
        )
    checks.append(_redis(settings, redis))
    reachable_redis = redis if checks[-1].ok else None
    if not settings.api_token:
        checks.append(
            Check(
                "cloud token",
                False,
                "not checked: WEBSCRAPER_API_TOKEN is not set",
                "copy the API token from Cloud (cloud.webscraper.io → API)",
            )
        )
        return Report(tuple(checks))
    with _cloud(settings, transport, _budget(settings, reachable_redis)) as cloud:
        token = _token(cloud, settings.api_url)
        checks.append(token)
        if token.ok and datasets is not None:
            sitemaps = _SitemapIndex(cloud)
            for dataset in datasets:
                checks.extend(_dataset_checks(dataset, sitemaps))
    if datasets is not None:
        for dataset in datasets:
            checks.extend(_secret_checks(settings, dataset))
        if checks_passed(checks, "database"):
            checks.extend(_disabled_destinations(settings, datasets))
        checks.extend(_alert_checks(settings, datasets))
    return Report(tuple(checks))


def checks_passed(checks: Iterable[Check], name: str) -> bool:
    """Whether the check of this name ran and passed."""
    return any(check.name == name and check.ok for check in checks)


# --- configuration --------------------------------------------------------------------------


def _variables(settings: Settings) -> Iterator[Check]:
    for name, why in REQUIRED_VARIABLES.items():
        if settings.environment.get(name):
            yield Check(f"variable {name}", True, "set")
        else:
            yield Check(f"variable {name}", False, "not set", f"set it: {why}")


def _datasets(settings: Settings) -> tuple[Datasets | None, Check]:
    name = f"datasets file {settings.datasets_path}"
    try:
        datasets = load_datasets(settings.datasets_path)
    except DatasetsFileError as exc:
        return None, Check(
            name,
            False,
            str(exc),
            "fix the file (README: the datasets file), or SCRAPESYNC_DATASETS",
        )
    return datasets, Check(name, True, f"defines {', '.join(_names(datasets)) or 'no dataset'}")


def _names(datasets: Iterable[Dataset]) -> list[str]:
    return [dataset.name for dataset in datasets]


# --- database and Redis ---------------------------------------------------------------------


def _database(settings: Settings) -> Check:
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    from sync import db

    where = make_url(settings.database_url).render_as_string(hide_password=True)
    missing = db.missing_database_file(settings.database_url)
    if missing is not None:
        return Check(
            "database",
            False,
            f"no database file at {missing}",
            "set DATABASE_URL to the deployment's database, or run `scrapesync db upgrade`",
        )
    head = ScriptDirectory.from_config(db.alembic_config(settings.database_url)).get_current_head()
    engine = db.make_engine(settings.database_url)
    try:
        with engine.connect() as conn:
            current = MigrationContext.configure(conn).get_current_heads()
    except SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        return Check(
            "database",
            False,
            f"cannot reach {where}: {reason}",
            "check DATABASE_URL and that the database server accepts connections",
        )
    finally:
        engine.dispose()
    if tuple(current) != (head,):
        at = ", ".join(current) or "an empty schema"
        return Check(
            "database",
            False,
            f"{where} is at {at}, the code needs {head}",
            "run `scrapesync db upgrade` (the release phase does on every deploy)",
        )
    return Check("database", True, f"{where} reachable, migrated to head {head}")


def _redis(settings: Settings, redis: Redis | None) -> Check:
    if redis is None:
        return Check(
            "redis", False, "not checked: REDIS_URL is not set", "add Redis and set REDIS_URL"
        )
    try:
        redis.ping()
    except RedisError as exc:
        hint = "check REDIS_URL and that Redis accepts connections"
        if "certificate" in str(exc).lower():
            hint += "; a self-signed TLS certificate needs ?ssl_cert_reqs=none on the URL"
        return Check("redis", False, f"cannot reach Redis: {type(exc).__name__}: {exc}", hint)
    return Check("redis", True, "reachable")


# --- Cloud ----------------------------------------------------------------------------------


def _budget(settings: Settings, redis: Redis | None) -> ApiBudget:
    """The budget this deployment's processes share (this process's own without Redis)."""
    assert settings.api_token is not None
    if redis is None:
        return MemoryApiBudget(limit=settings.api_budget_limit, window=settings.api_budget_window)
    return RedisApiBudget(
        redis,
        account_key=account_key_for(settings.api_token),
        limit=settings.api_budget_limit,
        window=settings.api_budget_window,
    )


def _cloud(
    settings: Settings, transport: httpx.BaseTransport | None, budget: ApiBudget
) -> CloudClient:
    return CloudClient(
        token=settings.require_api_token(),
        base_url=settings.api_url,
        transport=transport,
        budget=budget,
        retry=RetryPolicy(max_attempts=2, max_elapsed=15.0, max_inline_wait=5.0),
    )


def _token(cloud: CloudClient, api_url: str) -> Check:
    try:
        account = cloud.get_account()
    except CloudAuthError as exc:
        return Check(
            "cloud token",
            False,
            f"Cloud refused the token (HTTP {exc.status})",
            "copy the API token from Cloud (cloud.webscraper.io → API) into WEBSCRAPER_API_TOKEN",
        )
    except CloudError as exc:
        return Check(
            "cloud token",
            False,
            f"the check call failed: {exc}",
            "check WEBSCRAPER_API_URL and the network; try again later on a rate limit",
        )
    credits = account.get("page_credits")
    detail = f"accepted by {api_url}"
    if credits is not None:
        detail += f"; {credits} page credits left"
    return Check("cloud token", True, detail)


class _SitemapIndex:
    """The account's sitemaps, listed at most once, and their definitions, fetched once each."""

    def __init__(self, cloud: CloudClient) -> None:
        self.cloud = cloud
        self._by_name: dict[str, int] | None = None
        self._definitions: dict[int, tuple[str, dict[str, Any]]] = {}

    def id_of(self, name: str) -> int | None:
        """The id of the sitemap with this name, or None."""
        if self._by_name is None:
            self._by_name = {str(s.get("name")): int(s["id"]) for s in self.cloud.iter_sitemaps()}
        return self._by_name.get(name)

    def definition(self, sitemap_id: int) -> tuple[str, dict[str, Any]]:
        """A sitemap's name and its parsed JSON definition."""
        if sitemap_id not in self._definitions:
            data = self.cloud.get_sitemap(sitemap_id)
            raw = data.get("sitemap")
            parsed = json.loads(raw) if isinstance(raw, str) else raw
            self._definitions[sitemap_id] = (
                str(data.get("name", "")),
                parsed if isinstance(parsed, dict) else {},
            )
        return self._definitions[sitemap_id]


def sitemap_columns(definition: dict[str, Any]) -> list[str]:
    """The record columns a sitemap produces: each selector id, plus ``-href``/``-src`` ones."""
    columns: list[str] = []
    for selector in definition.get("selectors") or []:
        if not isinstance(selector, dict) or not isinstance(selector.get("id"), str):
            continue
        columns.append(selector["id"])
        suffix = DERIVED_COLUMNS.get(str(selector.get("type")))
        if suffix:
            columns.append(selector["id"] + suffix)
    return columns


def dataset_fields(dataset: Dataset) -> list[tuple[str, str]]:
    """Every (field, key of the datasets file) a dataset relies on records to carry."""
    named: list[tuple[str, str]] = [(f, "entity_key") for f in dataset.entity_key]
    named += [(f, "required") for f in dataset.required]
    if dataset.partition:
        named.append((dataset.partition, "partition"))
    named += [(f, "parsers") for f in dataset.quality.parsers]
    return named


def _dataset_checks(dataset: Dataset, sitemaps: _SitemapIndex) -> Iterator[Check]:
    name = f"dataset {dataset.name}"
    wanted = f"sitemap_id {dataset.sitemap_id}" if dataset.sitemap_id else f"{dataset.sitemap!r}"
    try:
        sitemap_id = dataset.sitemap_id
        if sitemap_id is None:
            sitemap_id = sitemaps.id_of(dataset.sitemap or "")
        if sitemap_id is None:
            yield Check(
                f"{name}: sitemap",
                False,
                f"the Cloud account has no sitemap named {dataset.sitemap!r}",
                "create or import the sitemap in Cloud, or fix `sitemap` in the datasets file",
            )
            return
        sitemap_name, definition = sitemaps.definition(sitemap_id)
    except CloudNotFoundError:
        yield Check(
            f"{name}: sitemap",
            False,
            f"the Cloud account has no {wanted}",
            "fix `sitemap_id` in the datasets file (Cloud shows the id in the sitemap's URL)",
        )
        return
    except CloudError as exc:
        yield Check(
            f"{name}: sitemap", False, f"cannot read {wanted} from Cloud: {exc}", "try again"
        )
        return
    columns = sitemap_columns(definition)
    yield Check(
        f"{name}: sitemap",
        True,
        f"{sitemap_name!r} (id {sitemap_id}) with {len(columns)} columns: {', '.join(columns)}",
    )
    known = set(columns) | set(META_COLUMNS)
    missing = [(field, key) for field, key in dataset_fields(dataset) if field not in known]
    if not missing:
        yield Check(
            f"{name}: fields",
            True,
            f"every entity_key, required, partition and parsers field is a column of "
            f"sitemap {sitemap_name!r}",
        )
        return
    for field_name, key in missing:
        yield Check(
            f"{name}: field {field_name}",
            False,
            f"{key} names {field_name!r}, which is not a selector of sitemap {sitemap_name!r} "
            f"(id {sitemap_id}); its columns are {', '.join(columns) or 'none'}",
            "rename the field in the datasets file, or add a selector with that id to the sitemap",
        )


def _alert_checks(settings: Settings, datasets: Datasets) -> Iterator[Check]:
    """Each alert channel's variables are set (their values are never shown)."""
    from sync.alerts.channels import AlertChannelError, smtp_server

    for channel in datasets.alerts:
        name = f"alert channel {channel.key}"
        if channel.kind == "email":
            try:
                server = smtp_server(settings.smtp_url)
            except AlertChannelError as exc:
                yield Check(name, False, str(exc), "set SCRAPESYNC_SMTP_URL to the SMTP server")
                continue
            yield Check(name, True, f"SCRAPESYNC_SMTP_URL is set (server {server.host})")
            continue
        variable = channel.url_env if channel.kind == "slack" else channel.secret_env
        what = "the incoming webhook's URL" if channel.kind == "slack" else "the signing secret"
        if settings.secret(variable or "") is None:
            yield Check(name, False, f"{variable} is not set", f"set {variable} to {what}")
            continue
        yield Check(name, True, f"{variable} is set")


def _secret_checks(settings: Settings, dataset: Dataset) -> Iterator[Check]:
    from sync.delivery.destinations import DeliveryConfigError, signing_key

    for destination in dataset.destinations:
        if not destination.secret_env:
            continue
        name = f"dataset {dataset.name}: destination {destination.key}"
        secret = settings.secret(destination.secret_env)
        if secret is None:
            yield Check(
                name,
                False,
                f"its signing secret {destination.secret_env} is not set",
                f"set {destination.secret_env} to the secret the receiver verifies with",
            )
            continue
        try:
            signing_key(secret)
        except DeliveryConfigError as exc:
            yield Check(name, False, f"{destination.secret_env}: {exc}", "fix the secret's value")
            continue
        yield Check(name, True, f"signing secret {destination.secret_env} is set")


def _disabled_destinations(settings: Settings, datasets: Datasets) -> Iterator[Check]:
    """A destination that answered 410 Gone is disabled until an operator enables it."""
    from sqlalchemy import select

    from sync import db
    from sync.models import DestinationState

    labels = {d.key: d.label for dataset in datasets for d in dataset.destinations}
    engine = db.make_engine(settings.database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                select(DestinationState.__table__).where(DestinationState.disabled_at.is_not(None))
            ).all()
    except SQLAlchemyError:
        return
    finally:
        engine.dispose()
    for row in rows:
        if row.destination not in labels:
            continue  # no longer in the datasets file: nothing is sent to it anyway
        label = labels[row.destination]
        yield Check(
            f"destination {label}",
            False,
            f"disabled since {row.disabled_at:%Y-%m-%d %H:%M} UTC: {row.disabled_reason}",
            f"point it at a live receiver, then `scrapesync deliveries enable {label}`; "
            f"`scrapesync deliveries list --destination {label}` shows what waits",
        )
