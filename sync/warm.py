"""A process made ready for work before its first sync: the worker's main process before it
forks its work horses, ``scrapesync sync`` before the attempt starts.

Every sync and evaluation would otherwise pay on its first use what does not depend on the job:
the modules it imports on the way (httpx imports its HTTP core only when the first client is
made), and the certificate authorities of the TLS context its clients share. Once they are in,
:func:`gc.freeze` moves every object the process holds to the collector's permanent generation:
the collector's full passes, which a sync's allocations set off, then skip the modules and
tables of the process instead of walking them each time (a work horse forked after it also
keeps the parent's pages shared, as the collector no longer writes to them)."""

from __future__ import annotations

import gc


def warm() -> None:
    """Import what a sync and its evaluation use, make the shared TLS context, and freeze
    what the process holds so far out of the collector's passes."""
    import httpcore  # noqa: F401 - imported by httpx's first transport, otherwise

    import sync.ingest.tasks
    import sync.runs.evaluation  # noqa: F401 - what a sync's evaluation imports
    from sync import http

    http.tls()
    gc.freeze()
