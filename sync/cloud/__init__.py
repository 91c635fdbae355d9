"""Everything that talks to Web Scraper Cloud: the client, its errors and retries, the shared
API budget, export downloads and what Cloud says about a scraping job.

Callers import the module that holds a name: ``sync.cloud.client`` (CloudClient),
``sync.cloud.errors`` (and which HTTP answer raises which), ``sync.cloud.transport``
(where the token meets the wire), ``sync.cloud.policy`` (RetryPolicy), ``sync.cloud.budget``,
``sync.cloud.download`` and ``sync.cloud.jobs`` (CloudJob).
"""
