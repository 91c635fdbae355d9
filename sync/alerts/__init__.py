"""Alerts to people: the datasets file's ``[[alerts]]`` channels are told when something needs a
person (a run rejected, a partition quarantined, a delivery dead, a sync task that cannot go on,
the Cloud budget spent, a dataset gone stale), once per dataset, reason and alert interval, and
again when it recovers. See :mod:`sync.alerts.conditions` for the rule."""
