"""Step 6: the outbox relay and the destinations accepted runs are announced to."""
