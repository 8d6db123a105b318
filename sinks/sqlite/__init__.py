"""SQLite backend, the embedded default: the event store, the rollup store, the bucket store and the sketch store.

Four files (``events.sqlite3``, ``rollups.sqlite3``, ``buckets.sqlite3``, ``sketches.sqlite3``) so event batches,
rollup writes, bucket writes and sketch writes never wait on one write lock; all WAL with ``synchronous=FULL`` and
one dedicated thread per store. FULL, not NORMAL: the worker commits its Kafka offsets once a batch's transaction
commits, and under NORMAL a power loss (or an OS crash) can roll back the last committed transactions, whose records
would then never be read again: acknowledged writes lost while the broker kept them. A single-mutation ingest
measured no cost (an fsync per transaction of thousands of events: bench/RESULTS.md). Layout and concurrency
rules are documented in ``sinks.sqlite.events``,
``sinks.sqlite.rollups``, ``sinks.sqlite.buckets`` and ``sinks.sqlite.sketches``.
"""

from sinks.sqlite.buckets import SqliteBucketStore
from sinks.sqlite.events import SqliteEventStore
from sinks.sqlite.rollups import SqliteRollupStore
from sinks.sqlite.sketches import SqliteSketchStore

__all__ = ["SqliteBucketStore", "SqliteEventStore", "SqliteRollupStore", "SqliteSketchStore"]
