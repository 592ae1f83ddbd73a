"""The result contract between training and analysis (docs/results_schema.md), neutral ground for both.

experiments/ writes records through it, analysis/ and sweeps/ read them through it; neither imports the other
for records. Standard library only (``filelock`` when a table lock is taken): no torch, no Lightning, no pandas.

* :mod:`results.record` — the run record (:class:`~results.record.RunRecord`): the ledger's columns, their types,
  the statuses and study kinds, and when a stored record is malformed.
* :mod:`results.ledger` — where a study's records live and how they are written, read and checked.
* :mod:`results.config_hash` — a run's identity: the hash of its resolved config minus what does not change results.
* :mod:`results.io` — atomic file writes, JSON, an advisory file lock, the UTC time and the git commit.
"""
