"""Every CQL statement of the Cassandra backend, built by pure functions (no driver, no session).

Statements are :class:`Stmt` values: the CQL text with ``?`` markers (prepared once per text), the
bind values in marker order, and an ``op`` name saying what the statement does (logs, metrics and
the unit tests' in-memory fake dispatch on it). Nothing here talks to a server, so statement text,
bind values, table naming and bucket/slice enumeration are all unit-tested without Cassandra.

Data model (keyspace ``ks``)::

    event_namespaces  (namespace)                           partitioning pinned on first write
    event_slices      ((namespace), slice)                  catalog of slice tables
    ev_<ns>_<hash>_<slice>                                  one events table per namespace and slice
        PRIMARY KEY ((namespace, counter_name, time_bucket, event_bucket),
                     event_time, event_id, event_item_key)  CLUSTERING ORDER BY (event_time DESC, ...)
        default_time_to_live from the namespace's delete_after (see sinks.cassandra.config.event_ttl_seconds)
    event_buckets     ((namespace, counter_name), time_bucket, event_bucket)  has_clear
                      which event partitions of a counter hold events: ranges read only those
    event_counters    ((namespace, shard), counter_name)    the namespace's counters, in name order
    rollups           ((namespace, counter_name))            rollup_count, rollup_ts, last_write_ts
    rollup_pending    ((shard), namespace, counter_name)     marker: last_write_ts > rollup_ts
    rollup_bounds     ((namespace), shard)                   newest converged rollup_ts
    watermarks        ((topic), kafka_partition)             persist watermark per partition
    watermark_claims  ((topic, kafka_partition))          claim, marks: a mutations partition's latest claim
                      and the marks published under claims (map: watermark key -> mark), written only by
                      lightweight transactions conditioned on the claim; one partition (one Paxos instance) per
                      Kafka partition, so no two Kafka partitions' transactions contend (sinks.cassandra.rollups)
    watermark_claimed_partitions  ((topic))                 partitions: set<int>, every Kafka partition of the topic
                      ever claimed (plain writes, at claim time): which watermark_claims partitions to read
    window_buckets    ((namespace, counter_name, granularity, slice), start_us)   bucket_count, computed_upto
                      minute/hour/day buckets of windowed counts; a slice is a day of minutes, 32 days of hours,
                      a year of days (sinks.windows.Granularity.slice_us): no partition grows without bound
    window_slices     ((namespace, granularity), slice)      which bucket slices exist (retention)
    window_counters   ((namespace, granularity, slice, shard), counter_name)  the counters of a bucket slice
    window_clears     ((namespace, counter_name))            clear_us: a counter's latest clear (masking)
    window_ranks      ((namespace, signature, granularity, start_us), bucket_count DESC, counter_name)
                      rank lists (Top-K): one entry per bucket of the counters of one dimension signature
                      ("" for base counters, "country=BR" for their country=BR combinations), counter_name the
                      base name, sorted by the bucket's value
    window_rank_lists ((namespace, granularity, slice), signature, start_us)  which rank lists exist (retention)
    counter_combinations ((namespace, counter_name), combination)  is_full: the dimension combinations of a base
                      counter (schemas.dimensions), in name order; is_full marks a write's whole set of dimensions
    window_sketches   ((namespace, counter_name, granularity, slice), start_us)   sketch, computed_upto
                      the HLL sketches of a UNIQUE namespace's buckets (sinks.sketches), partitioned as buckets
    sketch_slices     ((namespace, granularity), slice)      which sketch slices exist (retention)
    sketch_counters   ((namespace, granularity, slice, shard), counter_name)  the counters of a sketch slice

The column is ``counter_name`` (the API's field name), not ``counter``: COUNTER is a CQL type keyword.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import xxhash

from sinks.model import Partitioning

__all__ = [
    "BASE_TABLES",
    "COUNTER_SHARDS",
    "MIN_BIGINT",
    "EventCql",
    "Part",
    "RollupCql",
    "SketchCql",
    "SlicedCql",
    "Stmt",
    "WindowCql",
    "bucket_slices",
    "counter_shard",
    "index_bounds",
    "keyspace_cql",
    "parts_for",
    "pending_shard",
    "render_schema_file",
    "schema_statements",
    "slice_table_cql",
    "slice_table_id",
    "slice_table_name",
    "twcs_window_minutes",
]

MIN_BIGINT = -(2**63)
_US = 1_000_000

BASE_TABLES = ("event_namespaces", "event_slices", "event_buckets", "event_counters", "rollups", "rollup_pending",
               "rollup_bounds", "watermarks", "watermark_claims", "watermark_claimed_partitions", "window_buckets",
               "window_slices", "window_counters", "window_clears", "window_ranks", "window_rank_lists",
               "counter_combinations", "window_sketches", "sketch_slices", "sketch_counters")
COUNTER_SHARDS = 16  # partitions per namespace of the event_counters registry (fixed: part of the key)


@dataclass(frozen=True, slots=True)
class Stmt:
    """One statement: ``cql`` with ``?`` markers, ``params`` in marker order.

    ``table`` names the slice table a statement touches (None for the fixed tables), so a read of a
    slice that retention dropped meanwhile can be treated as empty. ``serial`` asks for the serial
    consistency level (a read that must see a lightweight transaction's outcome).
    """

    op: str
    cql: str
    params: tuple = ()
    table: str | None = None
    serial: bool = False


# -- naming -------------------------------------------------------------------------------------------

def slice_table_name(namespace: str, slice_no: int) -> str:
    """``ev_<sanitized ns>_<xxh32 of ns>_<slice>``: lowercase (CQL folds unquoted names), at most 48
    characters (Cassandra's limit), distinct for distinct namespaces (the hash covers the exact name,
    so "A.b" and "a_b" differ), ``m<n>`` for a negative slice number."""
    safe = re.sub(r"[^a-z0-9]", "_", namespace.lower())[:18]
    digest = xxhash.xxh32_hexdigest(namespace.encode())
    number = str(slice_no) if slice_no >= 0 else f"m{-slice_no}"
    return f"ev_{safe}_{digest}_{number}"


def slice_table_id(keyspace: str, table: str) -> uuid.UUID:
    """Deterministic table id: workers that create the same slice table at the same moment issue
    identical DDL, so the schema versions they push cannot disagree (Cassandra otherwise gives each
    CREATE TABLE a random id, and concurrent creations of one table can leave nodes disagreeing)."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"counter-abstraction:{keyspace}.{table}")


def counter_shard(counter: str) -> int:
    """Partition of a counter's name in the ``event_counters`` registry of its namespace."""
    return xxhash.xxh32_intdigest(counter.encode()) % COUNTER_SHARDS


def pending_shard(namespace: str, counter: str, shards: int) -> int:
    """Partition of the pending-rollup marker of a counter."""
    return xxhash.xxh32_intdigest(f"{namespace}\x00{counter}".encode()) % shards


# -- schema ---------------------------------------------------------------------------------------------

def _replication_literal(replication: Mapping[str, int | str]) -> str:
    items = []
    for key, value in replication.items():
        items.append(f"'{key}': {value}" if isinstance(value, int) else f"'{key}': '{value}'")
    return "{" + ", ".join(items) + "}"


def keyspace_cql(keyspace: str, replication: Mapping[str, int | str]) -> str:
    return (f"CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = {_replication_literal(replication)} "
            f"AND durable_writes = true")


def _base_tables(ks: str) -> list[str]:
    return [
        f"""CREATE TABLE IF NOT EXISTS {ks}.event_namespaces (
    namespace text PRIMARY KEY,
    buckets_per_id int,
    seconds_per_bucket int,
    seconds_per_slice int
)""",
        f"""CREATE TABLE IF NOT EXISTS {ks}.event_slices (
    namespace text,
    slice bigint,
    table_name text,
    start_us bigint,
    end_us bigint,
    PRIMARY KEY (namespace, slice)
) WITH CLUSTERING ORDER BY (slice ASC)""",
        f"""CREATE TABLE IF NOT EXISTS {ks}.event_buckets (
    namespace text,
    counter_name text,
    time_bucket bigint,
    event_bucket int,
    has_clear boolean,
    PRIMARY KEY ((namespace, counter_name), time_bucket, event_bucket)
) WITH CLUSTERING ORDER BY (time_bucket ASC, event_bucket ASC)""",
        f"""CREATE TABLE IF NOT EXISTS {ks}.event_counters (
    namespace text,
    shard int,
    counter_name text,
    PRIMARY KEY ((namespace, shard), counter_name)
) WITH CLUSTERING ORDER BY (counter_name ASC)""",
        f"""CREATE TABLE IF NOT EXISTS {ks}.rollups (
    namespace text,
    counter_name text,
    rollup_count bigint,
    rollup_ts bigint,
    last_write_ts bigint,
    PRIMARY KEY ((namespace, counter_name))
)""",
        f"""CREATE TABLE IF NOT EXISTS {ks}.rollup_pending (
    shard int,
    namespace text,
    counter_name text,
    PRIMARY KEY (shard, namespace, counter_name)
) WITH CLUSTERING ORDER BY (namespace ASC, counter_name ASC) AND gc_grace_seconds = 3600""",
        f"""CREATE TABLE IF NOT EXISTS {ks}.rollup_bounds (
    namespace text,
    shard int,
    rollup_ts bigint,
    PRIMARY KEY (namespace, shard)
)""",
        f"""CREATE TABLE IF NOT EXISTS {ks}.watermarks (
    topic text,
    kafka_partition int,
    mark_us bigint,
    PRIMARY KEY (topic, kafka_partition)
)""",
        f"""CREATE TABLE IF NOT EXISTS {ks}.watermark_claims (
    topic text,
    kafka_partition int,
    claim bigint,
    marks map<text, bigint>,
    PRIMARY KEY ((topic, kafka_partition))
)""",
        f"""CREATE TABLE IF NOT EXISTS {ks}.watermark_claimed_partitions (
    topic text PRIMARY KEY,
    partitions set<int>
)""",
        *_sliced_tables(ks, "window_buckets", "bucket_count bigint", "window_slices", "window_counters"),
        f"""CREATE TABLE IF NOT EXISTS {ks}.window_clears (
    namespace text,
    counter_name text,
    clear_us bigint,
    PRIMARY KEY ((namespace, counter_name))
)""",
        f"""CREATE TABLE IF NOT EXISTS {ks}.window_ranks (
    namespace text,
    signature text,
    granularity text,
    start_us bigint,
    bucket_count bigint,
    counter_name text,
    PRIMARY KEY ((namespace, signature, granularity, start_us), bucket_count, counter_name)
) WITH CLUSTERING ORDER BY (bucket_count DESC, counter_name ASC)
  AND compaction = {{'class': 'LeveledCompactionStrategy'}} AND gc_grace_seconds = 3600""",
        f"""CREATE TABLE IF NOT EXISTS {ks}.window_rank_lists (
    namespace text,
    granularity text,
    slice bigint,
    signature text,
    start_us bigint,
    PRIMARY KEY ((namespace, granularity, slice), signature, start_us)
) WITH CLUSTERING ORDER BY (signature ASC, start_us ASC)""",
        f"""CREATE TABLE IF NOT EXISTS {ks}.counter_combinations (
    namespace text,
    counter_name text,
    combination text,
    is_full boolean,
    PRIMARY KEY ((namespace, counter_name), combination)
) WITH CLUSTERING ORDER BY (combination ASC)""",
        *_sliced_tables(ks, "window_sketches", "sketch blob", "sketch_slices", "sketch_counters"),
    ]


def _sliced_tables(ks: str, table: str, value: str, slices: str, counters: str) -> list[str]:
    """A table partitioned by (namespace, counter_name, granularity, slice) with ``value`` beside ``computed_upto``,
    and its catalog (``SlicedCql``): the bucket and sketch tables are laid out alike."""
    return [
        f"""CREATE TABLE IF NOT EXISTS {ks}.{table} (
    namespace text,
    counter_name text,
    granularity text,
    slice bigint,
    start_us bigint,
    {value},
    computed_upto bigint,
    PRIMARY KEY ((namespace, counter_name, granularity, slice), start_us)
) WITH CLUSTERING ORDER BY (start_us ASC) AND compaction = {{'class': 'LeveledCompactionStrategy'}}""",
        f"""CREATE TABLE IF NOT EXISTS {ks}.{slices} (
    namespace text,
    granularity text,
    slice bigint,
    PRIMARY KEY ((namespace, granularity), slice)
) WITH CLUSTERING ORDER BY (slice ASC)""",
        f"""CREATE TABLE IF NOT EXISTS {ks}.{counters} (
    namespace text,
    granularity text,
    slice bigint,
    shard int,
    counter_name text,
    PRIMARY KEY ((namespace, granularity, slice, shard), counter_name)
) WITH CLUSTERING ORDER BY (counter_name ASC)""",
    ]


def schema_statements(keyspace: str, replication: Mapping[str, int | str]) -> list[str]:
    """The keyspace and the fixed tables, in order (what ``counter schema apply`` runs). Slice tables
    are created on demand by the event store (:func:`slice_table_cql`)."""
    return [keyspace_cql(keyspace, replication), *_base_tables(keyspace)]


_SCHEMA_HEADER = """\
-- Cassandra schema of the counter service (generated by sinks.cassandra.cql.render_schema_file;
-- tests/unit/test_cassandra_infra.py checks that this file matches the code).
--
-- Apply with `counter schema apply` (COUNTER_STORE=cassandra://hosts/keyspace?dc=...&replication=...),
-- or with cqlsh after editing the keyspace name and the replication map:
--     cqlsh -f infra/cassandra/schema.cql
--
-- Events live in one table per namespace and time slice, created on demand by the workers with the
-- statement below (values filled per namespace) and listed in event_slices; retention drops them whole:
--
-- CREATE TABLE IF NOT EXISTS <ks>.ev_<namespace>_<xxh32>_<slice> (
--     namespace text, counter_name text, time_bucket bigint, event_bucket int,
--     event_time bigint, event_id text, event_item_key text, delta bigint, is_clear boolean,
--     PRIMARY KEY ((namespace, counter_name, time_bucket, event_bucket), event_time, event_id, event_item_key)
-- ) WITH CLUSTERING ORDER BY (event_time DESC, event_id ASC, event_item_key ASC)
--   AND default_time_to_live = <delete_after + seconds_per_slice + ttl_grace, capped before 2038-01-19>
--   AND compaction = {'class': 'TimeWindowCompactionStrategy', 'compaction_window_unit': 'MINUTES',
--                     'compaction_window_size': <seconds_per_slice / 8 in minutes>}
--   AND id = '<uuid5 of keyspace.table>';
"""


def render_schema_file(keyspace: str = "counters",
                       replication: Mapping[str, int | str] | None = None) -> str:
    """The text of ``infra/cassandra/schema.cql``."""
    repl = replication or {"class": "NetworkTopologyStrategy", "dc1": 3}
    body = ";\n\n".join(schema_statements(keyspace, repl))
    return f"{_SCHEMA_HEADER}\n{body};\n"


def twcs_window_minutes(seconds_per_slice: int) -> int:
    """TimeWindowCompactionStrategy window of a slice table: about 8 windows per slice."""
    return max(1, -(-int(seconds_per_slice) // (60 * 8)))


def slice_table_cql(keyspace: str, table: str, *, ttl_s: int, seconds_per_slice: int,
                    table_id: uuid.UUID | None) -> str:
    options = [
        "CLUSTERING ORDER BY (event_time DESC, event_id ASC, event_item_key ASC)",
        f"default_time_to_live = {int(ttl_s)}",
        "compaction = {'class': 'TimeWindowCompactionStrategy', 'compaction_window_unit': 'MINUTES', "
        f"'compaction_window_size': {twcs_window_minutes(seconds_per_slice)}}}",
    ]
    if table_id is not None:
        options.append(f"id = '{table_id}'")
    return (f"CREATE TABLE IF NOT EXISTS {keyspace}.{table} (\n"
            "    namespace text, counter_name text, time_bucket bigint, event_bucket int,\n"
            "    event_time bigint, event_id text, event_item_key text, delta bigint, is_clear boolean,\n"
            "    PRIMARY KEY ((namespace, counter_name, time_bucket, event_bucket), "
            "event_time, event_id, event_item_key)\n"
            ") WITH " + "\n  AND ".join(options))


# -- bucket and slice enumeration ------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Part:
    """One event partition inside one slice table."""

    table: str
    slice: int
    time_bucket: int
    event_bucket: int
    has_clear: bool


def index_bounds(after_us: int, upto_us: int, part: Partitioning) -> tuple[int, int]:
    """Inclusive time-bucket range holding every event time in ``(after_us, upto_us]``."""
    return (after_us + 1) // part.bucket_us, upto_us // part.bucket_us


def bucket_slices(time_bucket: int, after_us: int, upto_us: int, part: Partitioning) -> range:
    """Slices holding event times of ``time_bucket`` within ``(after_us, upto_us]`` (empty when the
    bucket does not meet the range). More than one only if a slice is not a multiple of a bucket."""
    lo = max(time_bucket * part.bucket_us, after_us + 1)
    hi = min((time_bucket + 1) * part.bucket_us - 1, upto_us)
    if lo > hi:
        return range(0)
    return range(part.slice_of(lo), part.slice_of(hi) + 1)


def parts_for(namespace: str, index_rows: Iterable[Sequence], after_us: int, upto_us: int,
              part: Partitioning) -> list[Part]:
    """The event partitions to read for ``(after_us, upto_us]``, from the counter's bucket-index rows
    ``(time_bucket, event_bucket, has_clear)``; ordered by (time_bucket, event_bucket, slice)."""
    out: list[Part] = []
    for time_bucket, event_bucket, has_clear in index_rows:
        for slice_no in bucket_slices(int(time_bucket), after_us, upto_us, part):
            out.append(Part(slice_table_name(namespace, slice_no), slice_no, int(time_bucket), int(event_bucket),
                            bool(has_clear)))
    out.sort(key=lambda p: (p.time_bucket, p.event_bucket, p.slice))
    return out


# -- event store statements ------------------------------------------------------------------------

_PK = "namespace = ? AND counter_name = ? AND time_bucket = ? AND event_bucket = ?"


class EventCql:
    """Statements of the event store in one keyspace."""

    def __init__(self, keyspace: str) -> None:
        self.ks = keyspace

    # namespaces and the slice catalog
    def pin_namespace(self, namespace: str, p: Partitioning) -> Stmt:
        return Stmt("ns.pin", f"INSERT INTO {self.ks}.event_namespaces (namespace, buckets_per_id, "
                    "seconds_per_bucket, seconds_per_slice) VALUES (?, ?, ?, ?) IF NOT EXISTS",
                    (namespace, p.buckets_per_id, p.seconds_per_bucket, p.seconds_per_slice))

    def get_namespace(self, namespace: str, *, serial: bool = False) -> Stmt:
        return Stmt("ns.get", f"SELECT buckets_per_id, seconds_per_bucket, seconds_per_slice "
                    f"FROM {self.ks}.event_namespaces WHERE namespace = ?", (namespace,), serial=serial)

    def add_slice(self, namespace: str, slice_no: int, table: str, p: Partitioning) -> Stmt:
        return Stmt("slices.add", f"INSERT INTO {self.ks}.event_slices (namespace, slice, table_name, start_us, "
                    "end_us) VALUES (?, ?, ?, ?, ?)",
                    (namespace, slice_no, table, slice_no * p.slice_us, (slice_no + 1) * p.slice_us))

    def list_slices(self, namespace: str) -> Stmt:
        return Stmt("slices.list", f"SELECT slice, table_name, start_us, end_us FROM {self.ks}.event_slices "
                    "WHERE namespace = ?", (namespace,))

    def remove_slice(self, namespace: str, slice_no: int) -> Stmt:
        return Stmt("slices.remove", f"DELETE FROM {self.ks}.event_slices WHERE namespace = ? AND slice = ?",
                    (namespace, slice_no))

    def create_slice(self, table: str, *, ttl_s: int, seconds_per_slice: int, table_ids: bool) -> Stmt:
        table_id = slice_table_id(self.ks, table) if table_ids else None
        return Stmt("slice.create", slice_table_cql(self.ks, table, ttl_s=ttl_s, seconds_per_slice=seconds_per_slice,
                                                    table_id=table_id), table=table)

    def drop_slice(self, table: str) -> Stmt:
        return Stmt("slice.drop", f"DROP TABLE IF EXISTS {self.ks}.{table}", table=table)

    # the bucket index
    def index_add(self, namespace: str, counter: str, time_bucket: int, event_bucket: int, *,
                  has_clear: bool, ttl_s: int) -> Stmt:
        if has_clear:
            return Stmt("index.add_clear", f"INSERT INTO {self.ks}.event_buckets (namespace, counter_name, "
                        "time_bucket, event_bucket, has_clear) VALUES (?, ?, ?, ?, true) USING TTL ?",
                        (namespace, counter, time_bucket, event_bucket, ttl_s))
        return Stmt("index.add", f"INSERT INTO {self.ks}.event_buckets (namespace, counter_name, time_bucket, "
                    "event_bucket) VALUES (?, ?, ?, ?) USING TTL ?",
                    (namespace, counter, time_bucket, event_bucket, ttl_s))

    def index_range(self, namespace: str, counter: str, tb_lo: int, tb_hi: int) -> Stmt:
        return Stmt("index.range", f"SELECT time_bucket, event_bucket, has_clear FROM {self.ks}.event_buckets "
                    "WHERE namespace = ? AND counter_name = ? AND time_bucket >= ? AND time_bucket <= ?",
                    (namespace, counter, tb_lo, tb_hi))

    def index_newest(self, namespace: str, counter: str) -> Stmt:
        """The counter's newest bucket-index row (retention drops the oldest slices first)."""
        return Stmt("index.newest", f"SELECT time_bucket FROM {self.ks}.event_buckets WHERE namespace = ? "
                    "AND counter_name = ? ORDER BY time_bucket DESC LIMIT 1", (namespace, counter))

    # the counter registry
    def register_counter(self, namespace: str, counter: str) -> Stmt:
        return Stmt("counters.add", f"INSERT INTO {self.ks}.event_counters (namespace, shard, counter_name) "
                    "VALUES (?, ?, ?)", (namespace, counter_shard(counter), counter))

    def counters_page(self, namespace: str, shard: int, after: str | None, limit: int) -> Stmt:
        if after is None:
            return Stmt("counters.first", f"SELECT counter_name FROM {self.ks}.event_counters "
                        "WHERE namespace = ? AND shard = ? LIMIT ?", (namespace, shard, limit))
        return Stmt("counters.after", f"SELECT counter_name FROM {self.ks}.event_counters "
                    "WHERE namespace = ? AND shard = ? AND counter_name > ? LIMIT ?", (namespace, shard, after, limit))

    def forget_counters(self, namespace: str, shard: int) -> Stmt:
        return Stmt("counters.forget", f"DELETE FROM {self.ks}.event_counters WHERE namespace = ? AND shard = ?",
                    (namespace, shard))

    def index_remove(self, namespace: str, counter: str, time_bucket: int, event_bucket: int) -> Stmt:
        return Stmt("index.remove", f"DELETE FROM {self.ks}.event_buckets WHERE namespace = ? AND counter_name = ? "
                    "AND time_bucket = ? AND event_bucket = ?", (namespace, counter, time_bucket, event_bucket))

    def index_trim(self, namespace: str, counter: str, below_tb: int) -> Stmt:
        return Stmt("index.trim", f"DELETE FROM {self.ks}.event_buckets WHERE namespace = ? AND counter_name = ? "
                    "AND time_bucket < ?", (namespace, counter, below_tb))

    # events of one partition
    @staticmethod
    def _key(namespace: str, counter: str, time_bucket: int, event_bucket: int) -> tuple:
        return (namespace, counter, time_bucket, event_bucket)

    def insert(self, table: str, namespace: str, counter: str, time_bucket: int, event_bucket: int,
               event_time: int, event_id: str, item_key: str, delta: int, is_clear: bool, ttl_s: int) -> Stmt:
        """Write timestamp = event time, so a re-sent event carries the same timestamp and range deletes
        stamped later shadow it. Two writes of one identity therefore tie on the timestamp, and Cassandra
        (4.0+, CASSANDRA-14592) resolves each cell on its own: a tombstone first, then the later expiry,
        then the greater value (bytes compared unsigned) -- not the first write (see sinks.cassandra.events).
        ``ttl_s`` is bound per write (0: none), capped at write time below the 2038 expiry limit; it
        overrides the table's ``default_time_to_live``."""
        return Stmt("event.insert", f"INSERT INTO {self.ks}.{table} (namespace, counter_name, time_bucket, "
                    "event_bucket, event_time, event_id, event_item_key, delta, is_clear) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) USING TIMESTAMP ? AND TTL ?",
                    (namespace, counter, time_bucket, event_bucket, event_time, event_id, item_key, delta,
                     bool(is_clear), event_time, ttl_s), table=table)

    def span_keys(self, table: str, namespace: str, counter: str, time_bucket: int, event_bucket: int,
                  lo_incl: int, hi_incl: int) -> Stmt:
        return Stmt("event.span", f"SELECT event_time, event_id, event_item_key FROM {self.ks}.{table} "
                    f"WHERE {_PK} AND event_time >= ? AND event_time <= ?",
                    (*self._key(namespace, counter, time_bucket, event_bucket), lo_incl, hi_incl), table=table)

    def rows(self, table: str, namespace: str, counter: str, time_bucket: int, event_bucket: int,
             after_us: int, upto_us: int) -> Stmt:
        return Stmt("event.rows", f"SELECT event_time, event_id, event_item_key, delta, is_clear "
                    f"FROM {self.ks}.{table} WHERE {_PK} AND event_time > ? AND event_time <= ?",
                    (*self._key(namespace, counter, time_bucket, event_bucket), after_us, upto_us), table=table)

    def sum(self, table: str, namespace: str, counter: str, time_bucket: int, event_bucket: int,
            after_us: int, upto_us: int) -> Stmt:
        """The partition's sum of deltas and its events in (after_us, upto_us]. Summed as varint: the sum of bigints
        is a bigint, which wraps silently once the total leaves int64 (each delta fits, their sum need not); a
        varint sum is exact (a BigInteger), and the driver reads it as a Python int."""
        return Stmt("event.sum", f"SELECT sum(cast(delta AS varint)), count(*) FROM {self.ks}.{table} "
                    f"WHERE {_PK} AND event_time > ? AND event_time <= ?",
                    (*self._key(namespace, counter, time_bucket, event_bucket), after_us, upto_us), table=table)

    def count_before(self, table: str, namespace: str, counter: str, time_bucket: int, event_bucket: int,
                     cutoff_us: int) -> Stmt:
        return Stmt("event.count_before", f"SELECT count(*) FROM {self.ks}.{table} WHERE {_PK} AND event_time < ?",
                    (*self._key(namespace, counter, time_bucket, event_bucket), cutoff_us), table=table)

    def delete_before(self, table: str, namespace: str, counter: str, time_bucket: int, event_bucket: int,
                      cutoff_us: int) -> Stmt:
        return Stmt("event.delete_before", f"DELETE FROM {self.ks}.{table} WHERE {_PK} AND event_time < ?",
                    (*self._key(namespace, counter, time_bucket, event_bucket), cutoff_us), table=table)


# -- rollup store statements -------------------------------------------------------------------------

_COUNTER = "namespace = ? AND counter_name = ?"


class RollupCql:
    """Statements of the rollup store. Cells that only move forward are written ``USING TIMESTAMP``
    = their own value, so Cassandra's last-write-wins keeps the maximum without reads or locks."""

    def __init__(self, keyspace: str) -> None:
        self.ks = keyspace

    def get(self, namespace: str, counter: str) -> Stmt:
        return Stmt("rollup.get", f"SELECT rollup_count, rollup_ts, last_write_ts FROM {self.ks}.rollups "
                    f"WHERE {_COUNTER}", (namespace, counter))

    def bump(self, namespace: str, counter: str, event_time: int) -> Stmt:
        return Stmt("rollup.bump", f"UPDATE {self.ks}.rollups USING TIMESTAMP ? SET last_write_ts = ? "
                    f"WHERE {_COUNTER}", (event_time, event_time, namespace, counter))

    def write(self, namespace: str, counter: str, count: int, rollup_ts: int) -> Stmt:
        return Stmt("rollup.write", f"UPDATE {self.ks}.rollups USING TIMESTAMP ? SET rollup_count = ?, "
                    f"rollup_ts = ? WHERE {_COUNTER}", (rollup_ts, count, rollup_ts, namespace, counter))

    def delete(self, namespace: str, counter: str, timestamp: int) -> Stmt:
        return Stmt("rollup.delete", f"DELETE FROM {self.ks}.rollups USING TIMESTAMP ? WHERE {_COUNTER}",
                    (timestamp, namespace, counter))

    def scan(self) -> Stmt:
        """Every rollup row (paged): only for ops (delete of a whole namespace)."""
        return Stmt("rollup.scan", f"SELECT namespace, counter_name, rollup_ts, last_write_ts FROM {self.ks}.rollups")

    def mark_pending(self, shard: int, namespace: str, counter: str, event_time: int) -> Stmt:
        return Stmt("pending.mark", f"INSERT INTO {self.ks}.rollup_pending (shard, namespace, counter_name) "
                    "VALUES (?, ?, ?) USING TIMESTAMP ?", (shard, namespace, counter, event_time))

    def clear_pending(self, shard: int, namespace: str, counter: str, rollup_ts: int) -> Stmt:
        """Deletes the marker only if no event after ``rollup_ts`` re-marked it (tombstone timestamp
        = rollup_ts shadows markers written with event times <= rollup_ts, and nothing later)."""
        return Stmt("pending.clear", f"DELETE FROM {self.ks}.rollup_pending USING TIMESTAMP ? "
                    f"WHERE shard = ? AND {_COUNTER}", (rollup_ts, shard, namespace, counter))

    def pending_first(self, shard: int, limit: int) -> Stmt:
        return Stmt("pending.first", f"SELECT namespace, counter_name FROM {self.ks}.rollup_pending "
                    "WHERE shard = ? LIMIT ?", (shard, limit))

    def pending_after(self, shard: int, namespace: str, counter: str, limit: int) -> Stmt:
        return Stmt("pending.after", f"SELECT namespace, counter_name FROM {self.ks}.rollup_pending "
                    "WHERE shard = ? AND (namespace, counter_name) > (?, ?) LIMIT ?",
                    (shard, namespace, counter, limit))

    def pending_of_namespace(self, shard: int, namespace: str, limit: int | None = None) -> Stmt:
        """The namespace's markers in ``shard``, by name; the first ``limit`` of them when given."""
        if limit is None:
            return Stmt("pending.of_ns", f"SELECT counter_name FROM {self.ks}.rollup_pending "
                        "WHERE shard = ? AND namespace = ?", (shard, namespace))
        return Stmt("pending.of_ns", f"SELECT counter_name FROM {self.ks}.rollup_pending "
                    "WHERE shard = ? AND namespace = ? LIMIT ?", (shard, namespace, limit))

    def set_bound(self, namespace: str, shard: int, rollup_ts: int) -> Stmt:
        return Stmt("bounds.set", f"UPDATE {self.ks}.rollup_bounds USING TIMESTAMP ? SET rollup_ts = ? "
                    "WHERE namespace = ? AND shard = ?", (rollup_ts, rollup_ts, namespace, shard))

    def get_bounds(self, namespace: str) -> Stmt:
        return Stmt("bounds.get", f"SELECT rollup_ts FROM {self.ks}.rollup_bounds WHERE namespace = ?", (namespace,))

    def delete_bounds(self, namespace: str, timestamp: int) -> Stmt:
        return Stmt("bounds.delete", f"DELETE FROM {self.ks}.rollup_bounds USING TIMESTAMP ? WHERE namespace = ?",
                    (timestamp, namespace))

    def set_mark(self, topic: str, partition: int, mark_us: int) -> Stmt:
        return Stmt("marks.set", f"UPDATE {self.ks}.watermarks USING TIMESTAMP ? SET mark_us = ? "
                    "WHERE topic = ? AND kafka_partition = ?", (mark_us, mark_us, topic, partition))

    def get_marks(self, topic: str) -> Stmt:
        return Stmt("marks.get", f"SELECT kafka_partition, mark_us FROM {self.ks}.watermarks WHERE topic = ?",
                    (topic,))

    # claims on a topic's partitions and the marks published under them: lightweight transactions only (their
    # timestamps are Paxos ballots, never USING TIMESTAMP), each on the one partition of its Kafka partition, read back
    # at the serial level; the claimed partitions listed by plain writes in a table of their own
    def get_claim(self, topic: str, partition: int) -> Stmt:
        return Stmt("claims.get", f"SELECT claim, marks FROM {self.ks}.watermark_claims "
                    "WHERE topic = ? AND kafka_partition = ?", (topic, partition), serial=True)

    def first_claim(self, topic: str, partition: int, claim: int) -> Stmt:
        """``claim`` on a partition nobody claimed (no row, or a row without a claim)."""
        return Stmt("claims.first", f"UPDATE {self.ks}.watermark_claims SET claim = ? "
                    "WHERE topic = ? AND kafka_partition = ? IF claim = null", (claim, topic, partition))

    def next_claim(self, topic: str, partition: int, claim: int, latest: int) -> Stmt:
        """``claim`` in place of ``latest``, if that is still the partition's latest claim (compare-and-set)."""
        return Stmt("claims.next", f"UPDATE {self.ks}.watermark_claims SET claim = ? "
                    "WHERE topic = ? AND kafka_partition = ? IF claim = ?", (claim, topic, partition, latest))

    def raise_claimed_mark(self, topic: str, partition: int, key: str, mark_us: int, claim: int) -> Stmt:
        """``marks[key] = mark_us`` under ``claim``, if that raises it (a missing element compares as no value:
        not applied, see ``first_claimed_mark``)."""
        return Stmt("claims.raise", f"UPDATE {self.ks}.watermark_claims SET marks[?] = ? "
                    "WHERE topic = ? AND kafka_partition = ? IF claim = ? AND marks[?] < ?",
                    (key, mark_us, topic, partition, claim, key, mark_us))

    def first_claimed_mark(self, topic: str, partition: int, key: str, mark_us: int, claim: int) -> Stmt:
        """``marks[key] = mark_us`` under ``claim``, where the partition has no mark of ``key`` yet."""
        return Stmt("claims.first_mark", f"UPDATE {self.ks}.watermark_claims SET marks[?] = ? "
                    "WHERE topic = ? AND kafka_partition = ? IF claim = ? AND marks[?] = null",
                    (key, mark_us, topic, partition, claim, key))

    def get_claimed_marks(self, topic: str, partition: int) -> Stmt:
        """One partition's marks published under claims (at the configured consistency, as any read)."""
        return Stmt("claims.marks", f"SELECT marks FROM {self.ks}.watermark_claims "
                    "WHERE topic = ? AND kafka_partition = ?", (topic, partition))

    def list_claimed(self, topic: str, partitions: Iterable[int]) -> Stmt:
        """Add ``partitions`` to the topic's claimed partitions (a set: adding one again changes nothing)."""
        return Stmt("claimed.add", f"UPDATE {self.ks}.watermark_claimed_partitions SET partitions = partitions + ? "
                    "WHERE topic = ?", (frozenset(int(p) for p in partitions), topic))

    def get_claimed(self, topic: str) -> Stmt:
        return Stmt("claimed.get", f"SELECT partitions FROM {self.ks}.watermark_claimed_partitions WHERE topic = ?",
                    (topic,))

    # the registry of dimension combinations
    def register_combination(self, namespace: str, counter: str, combination: str, *, full: bool) -> Stmt:
        """A full registration sets ``is_full``; any other writes only the row's key, so it never unsets it."""
        if full:
            return Stmt("combos.add_full", f"INSERT INTO {self.ks}.counter_combinations (namespace, counter_name, "
                        "combination, is_full) VALUES (?, ?, ?, true)", (namespace, counter, combination))
        return Stmt("combos.add", f"INSERT INTO {self.ks}.counter_combinations (namespace, counter_name, "
                    "combination) VALUES (?, ?, ?)", (namespace, counter, combination))

    def combinations_page(self, namespace: str, counter: str, *, lower: str | None, inclusive: bool,
                          upper: str | None, limit: int) -> Stmt:
        """Combinations (and their ``is_full``) of one counter above ``lower`` (``inclusive`` or not) and below
        ``upper``, ascending."""
        where, params = [_COUNTER], [namespace, counter]
        op = "combos.page"
        if lower is not None:
            where.append("combination >= ?" if inclusive else "combination > ?")
            params.append(lower)
            op += ".from" if inclusive else ".after"
        if upper is not None:
            where.append("combination < ?")
            params.append(upper)
            op += ".below"
        return Stmt(op, f"SELECT combination, is_full FROM {self.ks}.counter_combinations WHERE "
                    f"{' AND '.join(where)} LIMIT ?", (*params, limit))


# -- window (bucket) store statements ---------------------------------------------------------------

_BUCKET_PK = "namespace = ? AND counter_name = ? AND granularity = ? AND slice = ?"
_BUCKET_SLICE = "namespace = ? AND granularity = ? AND slice = ?"
_RANK_PK = "namespace = ? AND signature = ? AND granularity = ? AND start_us = ?"
_RANK_REVERSED = "ORDER BY bucket_count ASC, counter_name DESC"


class SlicedCql:
    """Statements of a table partitioned by ``(namespace, counter_name, granularity, slice)`` and clustered by
    ``start_us``, with its catalog: ``<slices>`` ((namespace, granularity), slice) and ``<counters>``
    ((namespace, granularity, slice, shard), counter_name), which say which partitions exist, for retention.
    The bucket and sketch tables are laid out alike: a row is written ``USING TIMESTAMP`` = the boundary it was
    computed at (forward-only by last-write-wins) and ``USING TTL`` = its retention backstop (0: none).

    ``value`` is the column a row holds beside ``computed_upto``; ``ops`` the op names' prefixes (data, slices,
    counters), on which logs, metrics and the unit tests' fake dispatch."""

    def __init__(self, keyspace: str, *, table: str, value: str, slices: str, counters: str,
                 ops: tuple[str, str, str]) -> None:
        self.ks = keyspace
        self._table, self._value = f"{keyspace}.{table}", value
        self._slices, self._counters = f"{keyspace}.{slices}", f"{keyspace}.{counters}"
        self._op, self._slices_op, self._counters_op = ops

    def write(self, namespace: str, counter: str, granularity: str, slice_no: int, start_us: int,
              value: int | bytes, computed_upto_us: int, ttl_s: int) -> Stmt:
        return Stmt(f"{self._op}.write", f"UPDATE {self._table} USING TIMESTAMP ? AND TTL ? "
                    f"SET {self._value} = ?, computed_upto = ? WHERE {_BUCKET_PK} AND start_us = ?",
                    (computed_upto_us, ttl_s, value, computed_upto_us, namespace, counter, granularity, slice_no,
                     start_us))

    def range(self, namespace: str, counter: str, granularity: str, slice_no: int, from_us: int,
              to_us: int) -> Stmt:
        """Rows ``(start_us, value, computed_upto)`` of one partition whose start lies in ``[from_us, to_us)``,
        ascending."""
        return Stmt(f"{self._op}.range", f"SELECT start_us, {self._value}, computed_upto FROM {self._table} "
                    f"WHERE {_BUCKET_PK} AND start_us >= ? AND start_us < ?",
                    (namespace, counter, granularity, slice_no, from_us, to_us))

    def drop_partition(self, namespace: str, counter: str, granularity: str, slice_no: int,
                       timestamp: int) -> Stmt:
        return Stmt(f"{self._op}.drop", f"DELETE FROM {self._table} USING TIMESTAMP ? WHERE {_BUCKET_PK}",
                    (timestamp, namespace, counter, granularity, slice_no))

    def drop_through(self, namespace: str, counter: str, granularity: str, slice_no: int, last_start_us: int,
                     timestamp: int) -> Stmt:
        """Range delete of a partition's rows starting at or before ``last_start_us``."""
        return Stmt(f"{self._op}.drop_through", f"DELETE FROM {self._table} USING TIMESTAMP ? "
                    f"WHERE {_BUCKET_PK} AND start_us <= ?",
                    (timestamp, namespace, counter, granularity, slice_no, last_start_us))

    def add_slice(self, namespace: str, granularity: str, slice_no: int, ttl_s: int) -> Stmt:
        return Stmt(f"{self._slices_op}.add", f"INSERT INTO {self._slices} (namespace, granularity, slice) "
                    "VALUES (?, ?, ?) USING TTL ?", (namespace, granularity, slice_no, ttl_s))

    def list_slices(self, namespace: str, granularity: str) -> Stmt:
        return Stmt(f"{self._slices_op}.list", f"SELECT slice FROM {self._slices} WHERE namespace = ? "
                    "AND granularity = ?", (namespace, granularity))

    def remove_slice(self, namespace: str, granularity: str, slice_no: int) -> Stmt:
        return Stmt(f"{self._slices_op}.remove", f"DELETE FROM {self._slices} WHERE {_BUCKET_SLICE}",
                    (namespace, granularity, slice_no))

    def register(self, namespace: str, granularity: str, slice_no: int, counter: str, ttl_s: int) -> Stmt:
        return Stmt(f"{self._counters_op}.add", f"INSERT INTO {self._counters} (namespace, granularity, slice, "
                    "shard, counter_name) VALUES (?, ?, ?, ?, ?) USING TTL ?",
                    (namespace, granularity, slice_no, counter_shard(counter), counter, ttl_s))

    def registered(self, namespace: str, granularity: str, slice_no: int, shard: int) -> Stmt:
        return Stmt(f"{self._counters_op}.list", f"SELECT counter_name FROM {self._counters} "
                    f"WHERE {_BUCKET_SLICE} AND shard = ?", (namespace, granularity, slice_no, shard))

    def forget(self, namespace: str, granularity: str, slice_no: int, shard: int) -> Stmt:
        return Stmt(f"{self._counters_op}.forget", f"DELETE FROM {self._counters} WHERE {_BUCKET_SLICE} "
                    "AND shard = ?", (namespace, granularity, slice_no, shard))


class WindowCql(SlicedCql):
    """Statements of the bucket store: ``window_buckets`` (``bucket_count``) and its catalog, as ``SlicedCql``;
    a counter's clear is written ``USING TIMESTAMP`` = its time (the cell holds the latest); the rank lists."""

    def __init__(self, keyspace: str) -> None:
        super().__init__(keyspace, table="window_buckets", value="bucket_count", slices="window_slices",
                         counters="window_counters", ops=("wbucket", "wslices", "wcounters"))

    def bump_clear(self, namespace: str, counter: str, clear_us: int) -> Stmt:
        return Stmt("wclears.bump", f"UPDATE {self.ks}.window_clears USING TIMESTAMP ? SET clear_us = ? "
                    f"WHERE {_COUNTER}", (clear_us, clear_us, namespace, counter))

    def get_clear(self, namespace: str, counter: str) -> Stmt:
        return Stmt("wclears.get", f"SELECT clear_us FROM {self.ks}.window_clears WHERE {_COUNTER}",
                    (namespace, counter))

    # rank lists (Top-K)
    def rank_add(self, namespace: str, signature: str, granularity: str, start_us: int, value: int, base: str,
                 computed_upto_us: int, ttl_s: int) -> Stmt:
        """The entry of a bucket written at boundary ``computed_upto_us``: stamped with it, so the deletion of the
        entry of a value it replaced (stamped with a later boundary) shadows it, and nothing earlier does."""
        return Stmt("wrank.add", f"INSERT INTO {self.ks}.window_ranks (namespace, signature, granularity, start_us, "
                    "bucket_count, counter_name) VALUES (?, ?, ?, ?, ?, ?) USING TIMESTAMP ? AND TTL ?",
                    (namespace, signature, granularity, start_us, value, base, computed_upto_us, ttl_s))

    def rank_remove(self, namespace: str, signature: str, granularity: str, start_us: int, value: int, base: str,
                    computed_upto_us: int) -> Stmt:
        """Deletes the entry of a value replaced by the bucket written at ``computed_upto_us``."""
        return Stmt("wrank.remove", f"DELETE FROM {self.ks}.window_ranks USING TIMESTAMP ? WHERE {_RANK_PK} "
                    "AND bucket_count = ? AND counter_name = ?",
                    (computed_upto_us, namespace, signature, granularity, start_us, value, base))

    def rank_first(self, namespace: str, signature: str, granularity: str, start_us: int, limit: int, *,
                   ascending: bool = False) -> Stmt:
        """The first entries of a rank list, or with ``ascending`` its last ones (a reversed query)."""
        if ascending:
            return Stmt("wrank.last", f"SELECT counter_name, bucket_count FROM {self.ks}.window_ranks "
                        f"WHERE {_RANK_PK} {_RANK_REVERSED} LIMIT ?",
                        (namespace, signature, granularity, start_us, limit))
        return Stmt("wrank.first", f"SELECT counter_name, bucket_count FROM {self.ks}.window_ranks "
                    f"WHERE {_RANK_PK} LIMIT ?", (namespace, signature, granularity, start_us, limit))

    def rank_tie(self, namespace: str, signature: str, granularity: str, start_us: int, value: int, after: str,
                 limit: int, *, ascending: bool = False) -> Stmt:
        """The rest of a tie: the entries of ``value`` after the name ``after`` (before it, reading backwards)."""
        if ascending:
            return Stmt("wrank.tie_back", f"SELECT counter_name, bucket_count FROM {self.ks}.window_ranks "
                        f"WHERE {_RANK_PK} AND bucket_count = ? AND counter_name < ? {_RANK_REVERSED} LIMIT ?",
                        (namespace, signature, granularity, start_us, value, after, limit))
        return Stmt("wrank.tie", f"SELECT counter_name, bucket_count FROM {self.ks}.window_ranks "
                    f"WHERE {_RANK_PK} AND bucket_count = ? AND counter_name > ? LIMIT ?",
                    (namespace, signature, granularity, start_us, value, after, limit))

    def rank_beyond(self, namespace: str, signature: str, granularity: str, start_us: int, value: int,
                    limit: int, *, ascending: bool = False) -> Stmt:
        """The entries of values below ``value`` (above it, reading backwards): a single slice of the clustering.
        Names within a value run ascending while values descend, so no one multi-column relation pages across
        a tie: a later page is the rest of the tie and this."""
        if ascending:
            return Stmt("wrank.above", f"SELECT counter_name, bucket_count FROM {self.ks}.window_ranks "
                        f"WHERE {_RANK_PK} AND bucket_count > ? {_RANK_REVERSED} LIMIT ?",
                        (namespace, signature, granularity, start_us, value, limit))
        return Stmt("wrank.below", f"SELECT counter_name, bucket_count FROM {self.ks}.window_ranks "
                    f"WHERE {_RANK_PK} AND bucket_count < ? LIMIT ?",
                    (namespace, signature, granularity, start_us, value, limit))

    def rank_drop(self, namespace: str, signature: str, granularity: str, start_us: int, timestamp: int) -> Stmt:
        return Stmt("wrank.drop", f"DELETE FROM {self.ks}.window_ranks USING TIMESTAMP ? WHERE {_RANK_PK}",
                    (timestamp, namespace, signature, granularity, start_us))

    def rank_list_add(self, namespace: str, granularity: str, slice_no: int, signature: str, start_us: int,
                      ttl_s: int) -> Stmt:
        return Stmt("wranklists.add", f"INSERT INTO {self.ks}.window_rank_lists (namespace, granularity, slice, "
                    "signature, start_us) VALUES (?, ?, ?, ?, ?) USING TTL ?",
                    (namespace, granularity, slice_no, signature, start_us, ttl_s))

    def rank_lists(self, namespace: str, granularity: str, slice_no: int) -> Stmt:
        return Stmt("wranklists.list", f"SELECT signature, start_us FROM {self.ks}.window_rank_lists "
                    f"WHERE {_BUCKET_SLICE}", (namespace, granularity, slice_no))

    def rank_list_remove(self, namespace: str, granularity: str, slice_no: int, signature: str,
                         start_us: int) -> Stmt:
        return Stmt("wranklists.remove", f"DELETE FROM {self.ks}.window_rank_lists WHERE {_BUCKET_SLICE} "
                    "AND signature = ? AND start_us = ?", (namespace, granularity, slice_no, signature, start_us))

    def rank_lists_forget(self, namespace: str, granularity: str, slice_no: int) -> Stmt:
        return Stmt("wranklists.forget", f"DELETE FROM {self.ks}.window_rank_lists WHERE {_BUCKET_SLICE}",
                    (namespace, granularity, slice_no))


# -- sketch store statements ------------------------------------------------------------------------


class SketchCql(SlicedCql):
    """Statements of the sketch store (unique counts): ``window_sketches`` (``sketch`` blobs) and its catalog
    ``sketch_slices``, ``sketch_counters``, as ``SlicedCql``."""

    def __init__(self, keyspace: str) -> None:
        super().__init__(keyspace, table="window_sketches", value="sketch", slices="sketch_slices",
                         counters="sketch_counters", ops=("wsketch", "sslices", "scounters"))

    def marks(self, namespace: str, counter: str, granularity: str, slice_no: int, from_us: int,
              to_us: int) -> Stmt:
        """As ``range`` without the blobs: the boundaries the stored sketches were computed at."""
        return Stmt("wsketch.marks", f"SELECT start_us, computed_upto FROM {self.ks}.window_sketches "
                    f"WHERE {_BUCKET_PK} AND start_us >= ? AND start_us < ?",
                    (namespace, counter, granularity, slice_no, from_us, to_us))
