"""SQLite backend, the embedded default: the event store and the rollup store.

Two files (``events.sqlite3``, ``rollups.sqlite3``) so event batches and rollup writes never wait on
one write lock; both WAL with ``synchronous=NORMAL`` and one dedicated thread per store.
Layout and concurrency rules are documented in ``sqlite_events`` and ``sqlite_rollups``.
"""

from sinks.sqlite_events import SqliteEventStore
from sinks.sqlite_rollups import SqliteRollupStore

__all__ = ["SqliteEventStore", "SqliteRollupStore"]
