"""SQLite backend, the embedded default: the event store, the rollup store and the bucket store.

Three files (``events.sqlite3``, ``rollups.sqlite3``, ``buckets.sqlite3``) so event batches, rollup writes and
bucket writes never wait on one write lock; all WAL with ``synchronous=NORMAL`` and one dedicated thread per
store. Layout and concurrency rules are documented in ``sinks.sqlite.events``, ``sinks.sqlite.rollups`` and
``sinks.sqlite.buckets``.
"""

from sinks.sqlite.buckets import SqliteBucketStore
from sinks.sqlite.events import SqliteEventStore
from sinks.sqlite.rollups import SqliteRollupStore

__all__ = ["SqliteBucketStore", "SqliteEventStore", "SqliteRollupStore"]
