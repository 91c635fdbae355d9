"""Everything that talks to Web Scraper Cloud: the client, its errors and retries, the shared
API budget, export downloads and what Cloud says about a scraping job.

Callers import the module that holds a name: ``sync.cloud.client`` (CloudClient),
``sync.cloud.errors``, ``sync.cloud.policy`` (RetryPolicy), ``sync.cloud.budget``,
``sync.cloud.download`` and ``sync.cloud.jobs`` (CloudJob).
"""
