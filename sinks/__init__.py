"""Storage: the TimeSeries event store, the rollup store, the time-bucket store, the sketch store (unique counts),
the rollup cache and BEST_EFFORT counters.

The interfaces live here at the top (`base`, `cache`, `best_effort`, `model`, `windows`); each backend is a
subpackage: `sqlite/` (embedded default), `cassandra/` (production), `memcached/` and `memory/` (caches and
counters).
Everything time-like is epoch microseconds.
"""

from sinks.availability import store_unavailable
from sinks.base import (
    BucketStore,
    EventStore,
    RollupStore,
    ScanCursor,
    SketchStore,
    Stores,
)
from sinks.cache import RollupCache, open_cache
from sinks.factory import (
    BUCKETS_FILE,
    EVENTS_FILE,
    ROLLUPS_FILE,
    SKETCHES_FILE,
    open_namespace_sketch_store,
    open_namespace_stores,
    open_sketch_store,
    open_stores,
    sqlite_directory,
    store_identity,
    store_location,
)
from sinks.keys import arrival_keys, claim_topic, dropped_key, retention_cutoff, written_key
from sinks.memcached.rollup_cache import MemcachedRollupCache, cache_key, scoped_prefix
from sinks.memory.rollup_cache import InProcessRollupCache
from sinks.model import EMPTY_AGGREGATE, Aggregate, EventRow, Partitioning, RollupState, apply_aggregate
from sinks.sqlite import SqliteBucketStore, SqliteEventStore, SqliteRollupStore, SqliteSketchStore
from sinks.windows import Granularity

__all__ = [
    "BUCKETS_FILE",
    "EMPTY_AGGREGATE",
    "EVENTS_FILE",
    "ROLLUPS_FILE",
    "SKETCHES_FILE",
    "Aggregate",
    "BucketStore",
    "EventRow",
    "EventStore",
    "Granularity",
    "InProcessRollupCache",
    "MemcachedRollupCache",
    "Partitioning",
    "RollupCache",
    "RollupState",
    "RollupStore",
    "ScanCursor",
    "SketchStore",
    "SqliteBucketStore",
    "SqliteEventStore",
    "SqliteRollupStore",
    "SqliteSketchStore",
    "Stores",
    "apply_aggregate",
    "arrival_keys",
    "cache_key",
    "claim_topic",
    "dropped_key",
    "open_cache",
    "open_namespace_sketch_store",
    "open_namespace_stores",
    "open_sketch_store",
    "open_stores",
    "retention_cutoff",
    "scoped_prefix",
    "sqlite_directory",
    "store_identity",
    "store_location",
    "store_unavailable",
    "written_key",
]
