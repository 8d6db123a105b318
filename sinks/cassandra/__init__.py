"""Cassandra backend, the production store (``COUNTER_STORE=cassandra://...``).

Modules: ``config`` (URL options), ``cql`` (statements and schema), ``session`` (driver session and bounded
concurrency), ``events``, ``rollups`` and ``buckets`` (the stores), ``store`` (opening them on one session).
Nothing is imported here, so the driver loads only when a Cassandra store is actually opened.
"""
