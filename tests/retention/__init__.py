"""Retention: what the maintenance pass deletes and what it never touches."""
