"""SQLite backend, the embedded default: the event store, the rollup store, the bucket store and the sketch store.

Four files (``events.sqlite3``, ``rollups.sqlite3``, ``buckets.sqlite3``, ``sketches.sqlite3``) so event batches,
rollup writes, bucket writes and sketch writes never wait on one write lock; all WAL with ``synchronous=NORMAL`` and
one dedicated thread per store. Layout and concurrency rules are documented in ``sinks.sqlite.events``,
``sinks.sqlite.rollups``, ``sinks.sqlite.buckets`` and ``sinks.sqlite.sketches``.
"""

from sinks.sqlite.buckets import SqliteBucketStore
from sinks.sqlite.events import SqliteEventStore
from sinks.sqlite.rollups import SqliteRollupStore
from sinks.sqlite.sketches import SqliteSketchStore

__all__ = ["SqliteBucketStore", "SqliteEventStore", "SqliteRollupStore", "SqliteSketchStore"]
