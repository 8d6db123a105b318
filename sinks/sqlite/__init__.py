"""SQLite backend, the embedded default: the event store and the rollup store.

Two files (``events.sqlite3``, ``rollups.sqlite3``) so event batches and rollup writes never wait on
one write lock; both WAL with ``synchronous=NORMAL`` and one dedicated thread per store.
Layout and concurrency rules are documented in ``sinks.sqlite.events`` and ``sinks.sqlite.rollups``.
"""

from sinks.sqlite.events import SqliteEventStore
from sinks.sqlite.rollups import SqliteRollupStore

__all__ = ["SqliteEventStore", "SqliteRollupStore"]
