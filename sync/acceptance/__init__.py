"""Acceptance rules: whether a run's data is good enough to publish. Pure functions over counts,
records and thresholds, with no I/O, so every rule is tested with plain values.

"HTTP 200" is never "data success". A run is judged on four kinds of evidence:

- Cloud's job counters (failed, empty and no-value pages against pages scheduled) and the job's
  final status;
- Cloud's own data-quality result, one more gate that a dataset may switch off;
- the run as a whole: records without their entity key, entity keys seen twice with different
  payloads, the record count against the dataset's minimum;
- each partition's records: required fields present, values that parse (``price`` as a number),
  and pages that are not data (a consent page, an empty shell);
- the dataset's history: the run's profile (records per partition, each field's fill rate)
  against the median of its last accepted runs' profiles (the baseline). With fewer accepted
  runs than ``min_history`` (one or two by default) the baseline is the last accepted run. A
  gain is never a failure; a drop in volume, in a field's fill rate or in one partition's
  records beyond its threshold is, and a field every baseline run had that this run lacks is
  too. A drop confined to one partition
  quarantines that partition; a drop across the run rejects it.

A failing run-level rule rejects the run. A failing partition is quarantined; the dataset's
policy then rejects the whole run (``reject``) or publishes the partitions that passed
(``publish_passing``). Every reason carries the numbers behind it (``got``, ``expected``, and
``baseline`` for the history rules); every rule applied is also kept as a :class:`Check`, pass
or fail, so an operator can see how close a run came.

The modules, each importing only those above it:

- :mod:`~sync.acceptance.facts`: what is judged and what a judgement says (the facts of a run's
  jobs and imports, partition tallies, profiles and baselines, reasons, checks, verdicts);
- :mod:`~sync.acceptance.parsers`: whether a value is filled, a number, an integer, a URL;
- :mod:`~sync.acceptance.records`: one record's defects, tallied per partition;
- :mod:`~sync.acceptance.history`: a run's profile against its dataset's baseline;
- :mod:`~sync.acceptance.rules`: the rules that need no history;
- :mod:`~sync.acceptance.checks`: every rule as a check, pass or fail (``scrapesync check``);
- :mod:`~sync.acceptance.verdict`: the verdict on a run (:func:`~sync.acceptance.verdict.judge`).

There are no re-exports here: a caller imports the module whose names it uses.
"""
