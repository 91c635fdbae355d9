"""Benchmarks: how fast and how lean the sync path is on real PostgreSQL."""
