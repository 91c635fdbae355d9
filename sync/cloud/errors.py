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

from collections.abc import Mapping

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
