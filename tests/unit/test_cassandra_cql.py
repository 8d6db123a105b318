"""CQL text and bind values, table naming, and bucket/slice enumeration across edges (no server)."""

from __future__ import annotations

import re
import uuid

import pytest

from sinks.cassandra.config import bucket_ttl_seconds
from sinks.cassandra.cql import (
    BASE_TABLES,
    EventCql,
    Part,
    RollupCql,
    WindowCql,
    bucket_slices,
    index_bounds,
    keyspace_cql,
    parts_for,
    pending_shard,
    schema_statements,
    slice_table_cql,
    slice_table_id,
    slice_table_name,
    twcs_window_minutes,
)
from sinks.model import Partitioning

S = 1_000_000
PART = Partitioning(buckets_per_id=4, seconds_per_bucket=10, seconds_per_slice=60)
E = EventCql("ks")
R = RollupCql("ks")
W = WindowCql("ks")


def markers(cql: str) -> int:
    return cql.count("?")


# -- naming ------------------------------------------------------------------------------------------


def test_slice_table_names_are_legal_distinct_and_short():
    names = {slice_table_name(ns, s) for ns in ("a.b", "a_b", "A_b", "x" * 64, "ns-1") for s in (0, 28_333_334, -3)}
    assert len(names) == 15
    for name in names:
        assert re.fullmatch(r"[a-z][a-z0-9_]{0,47}", name), name  # unquoted, lowercase, <= 48 chars
    assert slice_table_name("ns", -3).endswith("_m3") and slice_table_name("ns", 3).endswith("_3")
    longest = slice_table_name("N" * 64, -(2**40))
    assert len(longest) <= 48


def test_table_ids_are_deterministic_per_keyspace_and_table():
    a = slice_table_id("ks", "ev_ns_1_2")
    assert a == slice_table_id("ks", "ev_ns_1_2") and isinstance(a, uuid.UUID)
    assert a != slice_table_id("ks2", "ev_ns_1_2") and a != slice_table_id("ks", "ev_ns_1_3")


def test_pending_shards_spread_and_are_stable():
    shards = {pending_shard("ns", f"c{i}", 16) for i in range(500)}
    assert shards == set(range(16))
    assert pending_shard("ns", "c1", 16) == pending_shard("ns", "c1", 16)
    assert pending_shard("a", "b:c", 1_000) != pending_shard("a:b", "c", 1_000)  # no separator ambiguity


# -- schema ------------------------------------------------------------------------------------------------


def test_schema_statements_create_keyspace_then_every_fixed_table():
    stmts = schema_statements("ks", {"class": "NetworkTopologyStrategy", "dc1": 3})
    assert stmts[0] == ("CREATE KEYSPACE IF NOT EXISTS ks WITH replication = "
                        "{'class': 'NetworkTopologyStrategy', 'dc1': 3} AND durable_writes = true")
    created = [re.match(r"CREATE TABLE IF NOT EXISTS ks\.(\w+) \(", s).group(1) for s in stmts[1:]]
    assert created == list(BASE_TABLES)
    rollups = stmts[1 + BASE_TABLES.index("rollups")]
    assert "PRIMARY KEY ((namespace, counter_name))" in rollups
    assert "rollup_count bigint" in rollups and "last_write_ts bigint" in rollups
    pending = stmts[1 + BASE_TABLES.index("rollup_pending")]
    assert "PRIMARY KEY (shard, namespace, counter_name)" in pending and "gc_grace_seconds = 3600" in pending
    # rank entries are deleted at every change of their bucket: a review expected busy Top-K lists to pass
    # Cassandra's 100,000-tombstone limit with the default 10 days
    assert "gc_grace_seconds = 3600" in stmts[1 + BASE_TABLES.index("window_ranks")]
    assert keyspace_cql("k", {"class": "SimpleStrategy", "replication_factor": 1}).endswith(
        "{'class': 'SimpleStrategy', 'replication_factor': 1} AND durable_writes = true")


def test_no_reserved_or_type_keywords_as_column_names():
    text = " ".join(schema_statements("ks", {"class": "SimpleStrategy", "replication_factor": 1}))
    text += slice_table_cql("ks", "t", ttl_s=0, seconds_per_slice=60, table_id=None)
    for word in ("counter", "partition", "key", "token", "limit", "order"):
        assert not re.search(rf"[\(,]\s*{word}\s+\w+", text), word


def test_slice_table_ddl():
    cql = slice_table_cql("ks", "ev_ns_1_5", ttl_s=3760, seconds_per_slice=86_400,
                          table_id=uuid.UUID("12345678-1234-5678-1234-567812345678"))
    assert cql.startswith("CREATE TABLE IF NOT EXISTS ks.ev_ns_1_5 (")
    assert ("PRIMARY KEY ((namespace, counter_name, time_bucket, event_bucket), event_time, event_id, "
            "event_item_key)") in cql
    assert "CLUSTERING ORDER BY (event_time DESC, event_id ASC, event_item_key ASC)" in cql
    assert "default_time_to_live = 3760" in cql
    assert "'class': 'TimeWindowCompactionStrategy'" in cql and "'compaction_window_size': 180}" in cql
    assert cql.endswith("AND id = '12345678-1234-5678-1234-567812345678'")
    assert "id =" not in slice_table_cql("ks", "t", ttl_s=0, seconds_per_slice=60, table_id=None)
    stmt = E.create_slice("ev_ns_1_5", ttl_s=0, seconds_per_slice=60, table_ids=True)
    assert stmt.op == "slice.create" and stmt.table == "ev_ns_1_5"
    assert str(slice_table_id("ks", "ev_ns_1_5")) in stmt.cql


@pytest.mark.parametrize("seconds, minutes", [(60, 1), (480, 1), (481, 2), (3600, 8), (86_400, 180)])
def test_compaction_window_is_about_an_eighth_of_a_slice(seconds, minutes):
    assert twcs_window_minutes(seconds) == minutes


# -- statements and bind values --------------------------------------------------------------------------


def test_event_insert_is_idempotent_by_key_with_the_event_time_as_write_timestamp():
    s = E.insert("t1", "ns", "c", 7, 2, 1_000_123, "id", "", -5, True, 3600)
    assert s.cql == ("INSERT INTO ks.t1 (namespace, counter_name, time_bucket, event_bucket, event_time, event_id, "
                     "event_item_key, delta, is_clear) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) USING TIMESTAMP ? AND TTL ?")
    assert s.params == ("ns", "c", 7, 2, 1_000_123, "id", "", -5, True, 1_000_123, 3600)  # TTL bound per write
    assert "IF NOT EXISTS" not in s.cql and s.table == "t1" and markers(s.cql) == len(s.params)


def test_event_reads_restrict_the_whole_partition_key_and_a_time_range():
    pk = "WHERE namespace = ? AND counter_name = ? AND time_bucket = ? AND event_bucket = ?"
    span = E.span_keys("t", "ns", "c", 1, 0, 10, 20)
    assert span.cql == (f"SELECT event_time, event_id, event_item_key FROM ks.t {pk} "
                        "AND event_time >= ? AND event_time <= ?")
    assert span.params == ("ns", "c", 1, 0, 10, 20)
    rows = E.rows("t", "ns", "c", 1, 0, 10, 20)
    assert rows.cql.endswith(f"FROM ks.t {pk} AND event_time > ? AND event_time <= ?")
    assert rows.cql.startswith("SELECT event_time, event_id, event_item_key, delta, is_clear ")
    total = E.sum("t", "ns", "c", 1, 0, 10, 20)
    assert total.cql == (f"SELECT sum(cast(delta AS varint)), count(*) FROM ks.t {pk} "  # varint: never wraps
                         "AND event_time > ? AND event_time <= ?")
    assert E.count_before("t", "ns", "c", 1, 0, 99).cql == f"SELECT count(*) FROM ks.t {pk} AND event_time < ?"
    delete = E.delete_before("t", "ns", "c", 1, 0, 99)
    assert delete.cql == f"DELETE FROM ks.t {pk} AND event_time < ?" and delete.params == ("ns", "c", 1, 0, 99)
    for s in (span, rows, total, delete):
        assert markers(s.cql) == len(s.params) and s.table == "t" and "ALLOW FILTERING" not in s.cql


def test_index_catalog_and_pin_statements():
    add = E.index_add("ns", "c", 5, 3, has_clear=False, ttl_s=100)
    assert add.cql.endswith("(namespace, counter_name, time_bucket, event_bucket) VALUES (?, ?, ?, ?) USING TTL ?")
    assert add.params == ("ns", "c", 5, 3, 100)
    flag = E.index_add("ns", "c", 5, 3, has_clear=True, ttl_s=0)
    assert "has_clear) VALUES (?, ?, ?, ?, true) USING TTL ?" in flag.cql and flag.params == ("ns", "c", 5, 3, 0)
    rng = E.index_range("ns", "c", 1, 9)
    assert rng.cql == ("SELECT time_bucket, event_bucket, has_clear FROM ks.event_buckets WHERE namespace = ? "
                       "AND counter_name = ? AND time_bucket >= ? AND time_bucket <= ?")
    assert rng.params == ("ns", "c", 1, 9)
    assert E.index_trim("ns", "c", 4).cql.endswith("AND time_bucket < ?")
    pin = E.pin_namespace("ns", PART)
    assert pin.cql.endswith("VALUES (?, ?, ?, ?) IF NOT EXISTS") and pin.params == ("ns", 4, 10, 60)
    assert E.get_namespace("ns", serial=True).serial and not E.get_namespace("ns").serial
    add_slice = E.add_slice("ns", 3, "t", PART)
    assert add_slice.params == ("ns", 3, "t", 180 * S, 240 * S)
    assert E.remove_slice("ns", 3).params == ("ns", 3)
    assert E.drop_slice("t").cql == "DROP TABLE IF EXISTS ks.t"
    for s in (add, flag, rng, pin, add_slice):
        assert markers(s.cql) == len(s.params) and s.table is None


def test_rollup_statements_use_write_timestamps_to_move_forward():
    bump = R.bump("ns", "c", 500)
    assert bump.cql == ("UPDATE ks.rollups USING TIMESTAMP ? SET last_write_ts = ? "
                        "WHERE namespace = ? AND counter_name = ?")
    assert bump.params == (500, 500, "ns", "c")
    write = R.write("ns", "c", 42, 1000)
    assert write.cql == ("UPDATE ks.rollups USING TIMESTAMP ? SET rollup_count = ?, rollup_ts = ? "
                         "WHERE namespace = ? AND counter_name = ?")
    assert write.params == (1000, 42, 1000, "ns", "c")  # timestamp = boundary
    mark = R.mark_pending(3, "ns", "c", 500)
    assert mark.cql.endswith("VALUES (?, ?, ?) USING TIMESTAMP ?") and mark.params == (3, "ns", "c", 500)
    clear = R.clear_pending(3, "ns", "c", 1000)
    assert clear.cql == ("DELETE FROM ks.rollup_pending USING TIMESTAMP ? WHERE shard = ? AND namespace = ? "
                         "AND counter_name = ?") and clear.params == (1000, 3, "ns", "c")
    after = R.pending_after(2, "ns", "c", 10)
    assert "(namespace, counter_name) > (?, ?) LIMIT ?" in after.cql and after.params == (2, "ns", "c", 10)
    assert R.pending_first(2, 10).params == (2, 10)
    page = R.pending_of_namespace(2, "ns", 10)  # the operator view's page of a namespace's markers
    assert page.cql.endswith("WHERE shard = ? AND namespace = ? LIMIT ?") and page.params == (2, "ns", 10)
    assert R.set_bound("ns", 2, 7).params == (7, 7, "ns", 2)
    assert R.set_mark("t", 1, 99).cql == ("UPDATE ks.watermarks USING TIMESTAMP ? SET mark_us = ? WHERE topic = ? "
                                          "AND kafka_partition = ?")
    assert R.set_mark("t", 1, 99).params == (99, 99, "t", 1)
    assert R.delete("ns", "c", 5).params == (5, "ns", "c") and "USING TIMESTAMP ?" in R.delete("ns", "c", 5).cql
    for s in (bump, write, mark, clear, after, R.get("ns", "c"), R.scan(), R.get_marks("t"), R.get_bounds("ns"),
              R.delete_bounds("ns", 1), R.pending_of_namespace(1, "ns"), R.pending_of_namespace(1, "ns", 5)):
        assert markers(s.cql) == len(s.params) and " ks." in s.cql


def test_claims_are_one_cassandra_partition_per_kafka_partition():
    """Every claim and fenced mark is a lightweight transaction, serialized per Cassandra partition: keyed by the
    topic alone, all of a topic's workers would contend in one Paxos instance."""
    stmts = schema_statements("ks", {"class": "SimpleStrategy", "replication_factor": 1})
    claims = stmts[1 + BASE_TABLES.index("watermark_claims")]
    assert "PRIMARY KEY ((topic, kafka_partition))" in claims and "marks map<text, bigint>" in claims
    listed = stmts[1 + BASE_TABLES.index("watermark_claimed_partitions")]
    assert "topic text PRIMARY KEY" in listed and "partitions set<int>" in listed
    one = "WHERE topic = ? AND kafka_partition = ?"
    lwts = [R.first_claim("t", 3, 77), R.next_claim("t", 3, 78, 77), R.raise_claimed_mark("t", 3, "k", 9, 78),
            R.first_claimed_mark("t", 3, "k", 9, 78)]
    for s in lwts:  # the whole partition key, a condition, and the transaction's own timestamp
        assert s.cql.startswith("UPDATE ks.watermark_claims SET ") and f" {one} IF " in s.cql
        assert "USING TIMESTAMP" not in s.cql and markers(s.cql) == len(s.params)
    assert R.first_claim("t", 3, 77).params == (77, "t", 3) and R.first_claim("t", 3, 77).cql.endswith("claim = null")
    assert R.next_claim("t", 3, 78, 77).params == (78, "t", 3, 77)  # the new id, if the latest is still 77
    for s in (R.get_claim("t", 3), R.get_claimed_marks("t", 3)):
        assert s.cql.endswith(f"FROM ks.watermark_claims {one}") and s.params == ("t", 3)
    assert R.get_claim("t", 3).serial and not R.get_claimed_marks("t", 3).serial
    add = R.list_claimed("t", [2, 0, 2])
    assert add.cql == "UPDATE ks.watermark_claimed_partitions SET partitions = partitions + ? WHERE topic = ?"
    assert add.params == (frozenset({0, 2}), "t") and " IF " not in add.cql  # plain: a set add is idempotent
    assert R.get_claimed("t").cql == "SELECT partitions FROM ks.watermark_claimed_partitions WHERE topic = ?"


def test_window_tables_partition_by_counter_granularity_and_slice():
    stmts = schema_statements("ks", {"class": "SimpleStrategy", "replication_factor": 1})
    buckets = stmts[1 + BASE_TABLES.index("window_buckets")]
    assert "PRIMARY KEY ((namespace, counter_name, granularity, slice), start_us)" in buckets
    assert "bucket_count bigint" in buckets and "computed_upto bigint" in buckets
    assert "PRIMARY KEY ((namespace, granularity, slice, shard), counter_name)" in stmts[
        1 + BASE_TABLES.index("window_counters")]
    assert "PRIMARY KEY ((namespace, counter_name))" in stmts[1 + BASE_TABLES.index("window_clears")]


def test_window_statements_move_forward_by_the_boundary_as_write_timestamp():
    write = W.write("ns", "c", "minute", 3, 180, 7, 1000, 600)
    assert write.cql == ("UPDATE ks.window_buckets USING TIMESTAMP ? AND TTL ? SET bucket_count = ?, computed_upto = ? "
                         "WHERE namespace = ? AND counter_name = ? AND granularity = ? AND slice = ? AND start_us = ?")
    assert write.params == (1000, 600, 7, 1000, "ns", "c", "minute", 3, 180)  # timestamp = boundary
    read = W.range("ns", "c", "hour", 2, 10, 20)
    assert read.cql.endswith("AND slice = ? AND start_us >= ? AND start_us < ?")
    assert read.params == ("ns", "c", "hour", 2, 10, 20)
    through = W.drop_through("ns", "c", "minute", 3, 99, 5)
    assert through.cql.startswith("DELETE FROM ks.window_buckets USING TIMESTAMP ? WHERE ")
    assert through.cql.endswith("AND start_us <= ?") and through.params == (5, "ns", "c", "minute", 3, 99)
    drop = W.drop_partition("ns", "c", "minute", 3, 5)
    assert drop.cql.endswith("AND granularity = ? AND slice = ?") and drop.params == (5, "ns", "c", "minute", 3)
    clear = W.bump_clear("ns", "c", 77)
    assert clear.cql == ("UPDATE ks.window_clears USING TIMESTAMP ? SET clear_us = ? WHERE namespace = ? "
                         "AND counter_name = ?") and clear.params == (77, 77, "ns", "c")
    register = W.register("ns", "minute", 3, "c", 60)
    assert register.params[3] in range(16) and register.cql.endswith("VALUES (?, ?, ?, ?, ?) USING TTL ?")
    for s in (write, read, through, drop, clear, register, W.get_clear("ns", "c"), W.add_slice("ns", "hour", 1, 0),
              W.list_slices("ns", "hour"), W.remove_slice("ns", "hour", 1), W.registered("ns", "hour", 1, 0),
              W.forget("ns", "hour", 1, 0)):
        assert markers(s.cql) == len(s.params) and " ks.window_" in s.cql and s.table is None
        assert "ALLOW FILTERING" not in s.cql


def test_rank_tables_partition_by_list_and_cluster_by_value_then_name():
    stmts = schema_statements("ks", {"class": "SimpleStrategy", "replication_factor": 1})
    ranks = stmts[1 + BASE_TABLES.index("window_ranks")]
    assert "PRIMARY KEY ((namespace, signature, granularity, start_us), bucket_count, counter_name)" in ranks
    assert "CLUSTERING ORDER BY (bucket_count DESC, counter_name ASC)" in ranks
    lists = stmts[1 + BASE_TABLES.index("window_rank_lists")]
    assert "PRIMARY KEY ((namespace, granularity, slice), signature, start_us)" in lists


def test_rank_statements_are_stamped_with_the_boundary_and_page_by_slices():
    add = W.rank_add("ns", "country=BR", "minute", 180, 7, "title", 1000, 600)
    assert add.cql == ("INSERT INTO ks.window_ranks (namespace, signature, granularity, start_us, bucket_count, "
                       "counter_name) VALUES (?, ?, ?, ?, ?, ?) USING TIMESTAMP ? AND TTL ?")
    assert add.params == ("ns", "country=BR", "minute", 180, 7, "title", 1000, 600)
    remove = W.rank_remove("ns", "", "hour", 0, 5, "t", 2000)
    assert remove.cql.startswith("DELETE FROM ks.window_ranks USING TIMESTAMP ? WHERE ")
    assert remove.cql.endswith("AND bucket_count = ? AND counter_name = ?")
    assert remove.params == (2000, "ns", "", "hour", 0, 5, "t")
    first = W.rank_first("ns", "", "day", 0, 10)
    tie = W.rank_tie("ns", "", "day", 0, 5, "t", 10)
    below = W.rank_beyond("ns", "", "day", 0, 5, 10)
    assert first.cql.endswith("AND start_us = ? LIMIT ?")
    assert tie.cql.endswith("AND bucket_count = ? AND counter_name > ? LIMIT ?")
    assert below.cql.endswith("AND bucket_count < ? LIMIT ?")  # one clustering slice each, no multi-column relation
    backwards = [W.rank_first("ns", "", "day", 0, 10, ascending=True),
                 W.rank_tie("ns", "", "day", 0, 5, "t", 10, ascending=True),
                 W.rank_beyond("ns", "", "day", 0, 5, 10, ascending=True)]
    assert [s.cql.split("WHERE ")[1] for s in backwards] == [
        "namespace = ? AND signature = ? AND granularity = ? AND start_us = ? "
        "ORDER BY bucket_count ASC, counter_name DESC LIMIT ?",
        "namespace = ? AND signature = ? AND granularity = ? AND start_us = ? AND bucket_count = ? "
        "AND counter_name < ? ORDER BY bucket_count ASC, counter_name DESC LIMIT ?",
        "namespace = ? AND signature = ? AND granularity = ? AND start_us = ? AND bucket_count > ? "
        "ORDER BY bucket_count ASC, counter_name DESC LIMIT ?"]  # the clustering reversed, as Cassandra requires
    for s in backwards:
        assert markers(s.cql) == len(s.params)
    for s in (add, remove, first, tie, below, W.rank_drop("ns", "", "day", 0, 5),
              W.rank_list_add("ns", "day", 0, "", 0, 0), W.rank_lists("ns", "day", 0),
              W.rank_list_remove("ns", "day", 0, "", 0), W.rank_lists_forget("ns", "day", 0)):
        assert markers(s.cql) == len(s.params) and " ks.window_rank" in s.cql and s.table is None
        assert "ALLOW FILTERING" not in s.cql and "ORDER BY" not in s.cql


@pytest.mark.parametrize(("retention", "expected"), [(None, 0), (0.0, 0), (3600.0, 3600 + 60 + 86_400 + 10),
                                                       (1e12, 630_720_000)])
def test_bucket_ttl_outlives_retention_by_a_bucket_and_a_slice(retention, expected):
    assert bucket_ttl_seconds(retention, 60, 86_400, 10) == expected


# -- bucket and slice enumeration --------------------------------------------------------------------------


def test_index_bounds_are_the_buckets_of_the_half_open_range():
    b = PART.bucket_us
    assert index_bounds(0, b - 1, PART) == (0, 0)
    assert index_bounds(b - 1, b, PART) == (1, 1)  # (b-1, b] holds only time b: bucket 1
    assert index_bounds(b - 2, b, PART) == (0, 1)
    assert index_bounds(b, 3 * b, PART) == (1, 3)
    assert index_bounds(-1, 0, PART) == (0, 0)
    assert index_bounds(-b - 1, -b, PART) == (-1, -1)


def test_bucket_slices_clip_the_bucket_to_the_range():
    b = PART.bucket_us
    assert list(bucket_slices(5, 0, 10**12, PART)) == [0]  # bucket [50 s, 60 s) lies in slice 0
    assert list(bucket_slices(6, 0, 10**12, PART)) == [1]
    assert list(bucket_slices(6, 7 * b, 10**12, PART)) == []  # bucket entirely before the range
    assert list(bucket_slices(6, 0, 6 * b - 1, PART)) == []  # entirely after
    assert list(bucket_slices(6, 0, 6 * b, PART)) == [1]  # the range ends on the bucket's first µs


def test_buckets_straddling_slices_are_read_in_each_slice():
    odd = Partitioning(buckets_per_id=2, seconds_per_bucket=40, seconds_per_slice=60)  # not a multiple
    assert list(bucket_slices(1, 0, 10**12, odd)) == [0, 1]  # bucket [40, 80) s crosses 60 s
    assert list(bucket_slices(1, 0, 59 * S, odd)) == [0]
    assert list(bucket_slices(1, 60 * S - 1, 10**12, odd)) == [1]


def test_parts_for_a_range_crossing_bucket_and_slice_edges():
    rows = [(tb, eb, tb == 6 and eb == 1) for tb in range(3, 14) for eb in (0, 1)]
    after, upto = 50 * S - 1, 120 * S  # (49.999999 s, 120 s]: buckets 5..12, slices 0..2
    parts = parts_for("ns", rows, after, upto, PART)
    assert {p.time_bucket for p in parts} == set(range(5, 13))
    assert [p.time_bucket for p in parts] == sorted(p.time_bucket for p in parts)
    by_bucket = {p.time_bucket: p.slice for p in parts}
    assert by_bucket[5] == 0 and by_bucket[6] == 1 and by_bucket[11] == 1 and by_bucket[12] == 2
    assert all(p.table == slice_table_name("ns", p.slice) for p in parts)
    assert [p for p in parts if p.has_clear] == [Part(slice_table_name("ns", 1), 1, 6, 1, True)]
    assert len(parts) == 2 * 8
    assert parts_for("ns", rows, upto, after, PART) == []


def test_parts_for_the_first_rollup_start_only_where_events_are():
    """rollup_ts 0: the index returns the few buckets with events; nothing is enumerated from 1970."""
    now_bucket = 1_700_000_000 * S // PART.bucket_us
    parts = parts_for("ns", [(now_bucket, 3, False)], 0, (now_bucket + 1) * PART.bucket_us, PART)
    assert len(parts) == 1 and parts[0].time_bucket == now_bucket
    lo, hi = index_bounds(0, (now_bucket + 1) * PART.bucket_us, PART)
    assert (lo, hi) == (0, now_bucket + 1)  # one index query covers it


def test_counter_registry_statements():
    from sinks.cassandra.cql import COUNTER_SHARDS, counter_shard

    add = E.register_counter("ns", "c1")
    assert add.cql == "INSERT INTO ks.event_counters (namespace, shard, counter_name) VALUES (?, ?, ?)"
    assert add.params == ("ns", counter_shard("c1"), "c1") and 0 <= counter_shard("c1") < COUNTER_SHARDS
    first = E.counters_page("ns", 3, None, 50)
    assert first.cql == "SELECT counter_name FROM ks.event_counters WHERE namespace = ? AND shard = ? LIMIT ?"
    assert first.params == ("ns", 3, 50)
    nxt = E.counters_page("ns", 3, "c1", 50)
    assert nxt.cql.endswith("WHERE namespace = ? AND shard = ? AND counter_name > ? LIMIT ?")
    assert nxt.params == ("ns", 3, "c1", 50)
    newest = E.index_newest("ns", "c1")
    assert newest.cql == ("SELECT time_bucket FROM ks.event_buckets WHERE namespace = ? AND counter_name = ? "
                          "ORDER BY time_bucket DESC LIMIT 1") and newest.params == ("ns", "c1")
    assert E.forget_counters("ns", 3).cql == "DELETE FROM ks.event_counters WHERE namespace = ? AND shard = ?"
    table = schema_statements("ks", {"class": "SimpleStrategy", "replication_factor": 1})[
        1 + BASE_TABLES.index("event_counters")]
    assert "PRIMARY KEY ((namespace, shard), counter_name)" in table
    for s in (add, first, nxt, newest):
        assert markers(s.cql) == len(s.params)
    assert {counter_shard(f"c{i}") for i in range(300)} == set(range(COUNTER_SHARDS))
