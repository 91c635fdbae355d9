"""What a failed call to Web Scraper Cloud raises.

Every failed call to Cloud raises one of these (only the budget's own store, e.g. Redis,
raises its own errors)::

    CloudError                    status, error, validation_errors, retry_after
    +-- CloudAuthError            401, 403: the token may not read this; never retried
    +-- CloudNotFoundError        404: no such job or sitemap; never retried
    +-- CloudValidationError      422, or a body with validationErrors; never retried
    +-- CloudRateLimitedError     429: waits Retry-After (seconds or HTTP-date), else
    |                             X-RateLimit-Reset, else capped full-jitter backoff
    +-- CloudServerError          5xx: capped full-jitter backoff (idempotent calls only)
    +-- CloudTransportError       connect errors, resets, timeouts: backoff
    +-- DownloadIncompleteError   an export cut short; a truncated dataset is never yielded
    +-- ApiBudgetExhaustedError   the shared local API budget says wait retry_after seconds

`retry_after is None` means "do not simply repeat this call": a 4xx, or a create_job whose fate
is unknown (find the job by custom_id before launching again); on a 429 it means Cloud named no
wait, so the caller backs off by how often in a row it was refused. Every message passes
through `sync.secrecy.scrub`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sync import secrecy


class CloudError(Exception):
    """A Web Scraper Cloud call failed; status, Cloud's error text and a retry hint say how."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        error: str | None = None,
        validation_errors: Mapping[str, list[str]] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(secrecy.scrub(message))
        self.status = status
        self.error = error
        self.validation_errors: Mapping[str, list[str]] = dict(validation_errors or {})
        self.retry_after = retry_after

    def __str__(self) -> str:
        message = super().__str__()
        if self.retry_after is None:
            return message
        return f"{message} (retry after {self.retry_after:.1f} s)"


class CloudAuthError(CloudError):
    """Cloud refused the token for this call (401 or 403)."""


class CloudNotFoundError(CloudError):
    """Cloud has no such scraping job or sitemap (404)."""


class CloudValidationError(CloudError):
    """Cloud rejected the request's fields (422 or a validationErrors body)."""


class CloudRateLimitedError(CloudError):
    """Cloud's per-account rate limit was hit (429)."""


class CloudServerError(CloudError):
    """Cloud failed on its side (5xx)."""


class CloudTransportError(CloudError):
    """The call never got an HTTP answer: connect error, reset or timeout."""

    def __init__(self, message: str, *, request_sent: bool = True) -> None:
        super().__init__(message)
        self.request_sent = request_sent


class DownloadIncompleteError(CloudError):
    """An export download ended before its last byte; the records seen so far are not a dataset."""


class ApiBudgetExhaustedError(CloudError):
    """The API budget shared by all processes is spent until retry_after seconds from now."""

    def __init__(self, message: str, *, retry_after: float = 0.0) -> None:
        super().__init__(message, retry_after=retry_after)


def error_for(
    status: int,
    payload: Mapping[str, Any] | None,
    *,
    request: str,
    retry_after: float | None,
    scrub: Callable[[str], str],
) -> CloudError:
    """The typed error for Cloud's answer to ``request`` ("GET path"): its HTTP status, or a
    200 whose envelope is no success, with Cloud's error text and validation errors."""
    raw_error = payload.get("error") if payload is not None else None
    error = scrub(str(raw_error)) if raw_error is not None else None
    validation = _validation_errors(payload)
    message = f"{request}: HTTP {status}"
    if status == 200:
        message += ": success is false" if payload is not None else ": not a JSON envelope"
    if error:
        message += f": {error}"
    for key, messages in validation.items():
        message += f"; {key}: {' '.join(messages)}"
    fields: dict[str, Any] = {
        "status": status,
        "error": error,
        "validation_errors": validation,
        "retry_after": retry_after,
    }
    if status in (401, 403):
        return CloudAuthError(message, **fields)
    if status == 404:
        return CloudNotFoundError(message, **fields)
    if status == 429:
        return CloudRateLimitedError(message, **fields)
    if status >= 500:
        return CloudServerError(message, **fields)
    if status == 422 or validation:
        return CloudValidationError(message, **fields)
    return CloudError(message, **fields)


def _validation_errors(payload: Mapping[str, Any] | None) -> dict[str, list[str]]:
    raw = payload.get("validationErrors") if payload is not None else None
    if not isinstance(raw, Mapping):
        return {}
    errors: dict[str, list[str]] = {}
    for key, messages in raw.items():
        if isinstance(messages, list):
            errors[str(key)] = [secrecy.scrub(str(m)) for m in messages]
        else:
            errors[str(key)] = [secrecy.scrub(str(messages))]
    return errors
