"""Tests of the Web Scraper Cloud client and the shared API budget."""
