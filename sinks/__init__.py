"""Storage: the TimeSeries event store, the rollup store and the rollup cache.

Backends: SQLite (embedded default) now, Cassandra next; memcached or in-process for the cache.
Everything time-like is epoch microseconds.
"""

from sinks.base import EventStore, RollupStore, ScanCursor
from sinks.cache import InProcessRollupCache, MemcachedRollupCache, RollupCache, cache_key, open_cache
from sinks.factory import EVENTS_FILE, ROLLUPS_FILE, open_namespace_stores, open_stores
from sinks.model import EMPTY_AGGREGATE, Aggregate, EventRow, Partitioning, RollupState, apply_aggregate
from sinks.sqlite_store import SqliteEventStore, SqliteRollupStore

__all__ = [
    "EMPTY_AGGREGATE",
    "EVENTS_FILE",
    "ROLLUPS_FILE",
    "Aggregate",
    "EventRow",
    "EventStore",
    "InProcessRollupCache",
    "MemcachedRollupCache",
    "Partitioning",
    "RollupCache",
    "RollupState",
    "RollupStore",
    "ScanCursor",
    "SqliteEventStore",
    "SqliteRollupStore",
    "apply_aggregate",
    "cache_key",
    "open_cache",
    "open_namespace_stores",
    "open_stores",
]
