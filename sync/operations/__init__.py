"""Step 7 and the maintenance pass: reconcile, retention, heartbeat, status, doctor."""
