"""The published data: typed tables, their history, the change feed, diff and export."""
