"""The Cassandra stores' logic against an in-memory fake of the statements they send.

The fake implements each statement ``op`` of ``sinks.cassandra.cql`` with Cassandra's semantics
that the design relies on: each cell resolved on its own by write timestamp, ties as Cassandra 4.0+
breaks them (CASSANDRA-14592: the later expiry, then the greater value as unsigned bytes), tombstones
shadowing writes with timestamps <= theirs, clustering order, range deletes, dropped tables raising
"unconfigured table", writes expiring after 2038-01-19 rejected (CASSANDRA-14092, policy REJECT), lightweight
transactions answering with their ``[applied]`` flag. It checks every statement's bind-marker count, that a fixed
table a statement names is in the schema the code creates, that a transaction names its table's whole partition key
(read from that schema) and that no fixed table is written both with and without transactions; it counts
transactions per Cassandra partition (one Paxos instance each) and those begun while another on the same partition
was in flight (contention). With it, the whole shared
store contract suite runs here without a server; what it cannot show (that Cassandra accepts the
CQL, and behaves as modelled) is for the contract suite on a real cluster (COUNTER_TEST_CASSANDRA).
"""

from __future__ import annotations

import asyncio
import logging
import re
import struct
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence

import pytest
from cassandra import InvalidRequest

from sinks.cassandra.buckets import CassandraBucketStore
from sinks.cassandra.config import EXPIRY_MARGIN_S, MAX_EXPIRY_S, MAX_TTL_SECONDS, ExpiryCap
from sinks.cassandra.cql import Stmt, schema_statements
from sinks.cassandra.events import CassandraEventStore
from sinks.cassandra.rollups import CassandraRollupStore
from sinks.cassandra.session import MissingTable, run_bounded
from sinks.keys import arrival_keys
from sinks.model import Partitioning, PendingRollups
from sinks.windows import Granularity
from tests.integration import test_store_contract as contract


def _now_us() -> int:
    return time.time_ns() // 1000


NEVER = 2**63  # the expiry of a cell written without a TTL: later than any


def cell_bytes(value: object) -> bytes | tuple:
    """A value as Cassandra compares it on a timestamp tie: its serialized bytes, compared unsigned (bigint
    big-endian two's complement, so -1 > 10; boolean one byte; text UTF-8). A tuple holds cells written
    together with one timestamp (bucket value and computed_upto): compared cell by cell, as Cassandra does."""
    if isinstance(value, tuple):
        return tuple(cell_bytes(v) for v in value)
    if isinstance(value, bool):
        return b"\x01" if value else b"\x00"
    if isinstance(value, int):
        return value.to_bytes(8, "big", signed=True)
    if isinstance(value, str):
        return value.encode()
    assert isinstance(value, bytes), value
    return value


def _bigint(value: int) -> None:
    """As the driver serializes a bigint: a value outside int64 fails (struct.error, before anything is sent)."""
    if not -(2**63) <= value < 2**63:
        raise struct.error(f"bigint out of range: {value}")


def _wins(new: tuple, old: tuple | None) -> bool:
    """Cassandra 4.0+ reconciliation of one cell ``(timestamp, value[, expiry])``: the higher timestamp wins;
    on a tie the later expiry (a cell without TTL never expires), then the greater value (``cell_bytes``). A
    tombstone would win any tie: the fake keeps tombstones apart and checks them on read."""
    if old is None:
        return True
    if new[0] != old[0]:
        return new[0] > old[0]
    new_expiry, old_expiry = (new[2] if len(new) > 2 else NEVER), (old[2] if len(old) > 2 else NEVER)
    if new_expiry != old_expiry:
        return new_expiry > old_expiry
    return cell_bytes(new[1]) > cell_bytes(old[1])


def _partition_keys(keyspace: str = "ks") -> dict[str, tuple[str, ...]]:
    """Each fixed table's partition key columns, read from the schema the code creates (``schema_statements``)."""
    out: dict[str, tuple[str, ...]] = {}
    for cql in schema_statements(keyspace, {"class": "SimpleStrategy", "replication_factor": 1})[1:]:
        table = re.match(rf"CREATE TABLE IF NOT EXISTS {keyspace}\.(\w+) \(", cql).group(1)
        inline = re.search(r"^\s*(\w+) \w+ PRIMARY KEY,?$", cql, re.M)
        if inline:
            out[table] = (inline.group(1),)
            continue
        key = cql[cql.index("PRIMARY KEY (") + len("PRIMARY KEY ("):]
        if key.startswith("("):
            out[table] = tuple(c.strip() for c in key[1:key.index(")")].split(","))
        else:
            out[table] = (re.match(r"\s*(\w+)", key).group(1),)
    return out


SCHEMA_KEYS = _partition_keys()


def _key_values(stmt: Stmt) -> dict[str, object]:
    """The columns a write restricts by ``col = ?`` (WHERE) or sets (INSERT's column list), with their bound
    values: what names its partition."""
    cql = stmt.cql
    if cql.startswith("INSERT"):
        columns = [c.strip() for c in cql[cql.index("(") + 1:cql.index(")")].split(",")]
        first = cql[:cql.index("VALUES")].count("?")
        return dict(zip(columns, stmt.params[first:first + len(columns)], strict=True))
    out: dict[str, object] = {}
    where = cql.index(" WHERE ")
    end = cql.find(" IF ", where)
    for match in re.finditer(r"(\w+) = \?", cql[where:end if end > 0 else len(cql)]):
        out[match.group(1)] = stmt.params[cql[:where + match.end()].count("?") - 1]
    return out


class FakeCassandra:
    """An in-memory stand-in for ``CassandraSession`` (the ``Executor`` protocol)."""

    def __init__(self, keyspace: str = "ks", concurrency: int = 16) -> None:
        self.keyspace = keyspace
        self.concurrency = concurrency
        self.log: list[Stmt] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.peaks: dict[str, int] = {}  # op -> most requests in flight when one of that op started
        self.refs = 1
        self.closed = False
        self.fail_next: dict[str, int] = {}  # op -> how many upcoming calls raise
        self.clock_s = time.time  # the coordinator's clock: a TTL expires at clock_s() + ttl
        self._slots: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}
        # event store
        self.tables: set[str] = set()
        self.ddl_log: list[str] = []
        self.events: dict[str, dict[tuple, dict[tuple, dict[str, tuple[int, object, int]]]]] = {}  # -> cells
        self.range_tombs: dict[str, dict[tuple, list[tuple[int, int]]]] = {}
        self.pins: dict[str, tuple[int, int, int]] = {}
        self.catalog: dict[str, dict[int, tuple[str, int, int]]] = defaultdict(dict)
        self.index: dict[tuple[str, str], dict[tuple[int, int], bool]] = defaultdict(dict)
        self.registry: dict[tuple[str, int], set[str]] = defaultdict(set)
        # rollup store
        self.cells: dict[tuple[str, str], dict[str, tuple[int, object]]] = defaultdict(dict)
        self.row_tombs: dict[tuple[str, str], int] = {}
        self.markers: dict[tuple[int, str, str], int] = {}
        self.marker_tombs: dict[tuple[int, str, str], int] = {}
        self.bounds: dict[str, dict[int, tuple[int, object]]] = defaultdict(dict)
        self.bound_tombs: dict[str, int] = {}
        self.marks: dict[str, dict[int, tuple[int, object]]] = defaultdict(dict)
        # watermark_claims: (topic, partition) -> [claim or None, {key: mark}], written by transactions only;
        # watermark_claimed_partitions: topic -> the partitions listed
        self.claims: dict[tuple[str, int], list] = {}
        self.claimed: dict[str, frozenset[int]] = defaultdict(frozenset)
        # Paxos: lightweight transactions per Cassandra partition (table, partition key values, by the schema), and
        # how many began while another on the same partition was in flight (contention: one must retry its ballot)
        self.paxos: dict[tuple[str, tuple], int] = defaultdict(int)
        self.paxos_contended = 0
        self._paxos_busy: dict[tuple[str, tuple], int] = defaultdict(int)
        self.write_kinds: dict[str, set[str]] = defaultdict(set)  # fixed table -> {"lwt", "plain"}: never both
        # bucket store: partition -> start_us -> (timestamp, (value, computed_upto), ttl)
        self.buckets: dict[tuple, dict[int, tuple[int, tuple[int, int], int]]] = defaultdict(dict)
        self.bucket_tombs: dict[tuple, list[tuple[int | None, int]]] = defaultdict(list)  # (last start or None, ts)
        self.window_slices: dict[tuple[str, str], dict[int, int]] = defaultdict(dict)  # slice -> ttl
        self.window_counters: dict[tuple, dict[str, int]] = defaultdict(dict)  # counter -> ttl
        self.clear_cells: dict[tuple[str, str], tuple[int, object]] = {}
        # rank lists: partition -> (value, base) -> (write timestamp, ttl); row and partition tombstones
        self.ranks: dict[tuple, dict[tuple[int, str], tuple[int, int]]] = defaultdict(dict)
        self.rank_tombs: dict[tuple, dict[tuple[int, str], int]] = defaultdict(dict)
        self.rank_partition_tombs: dict[tuple, int] = {}
        self.rank_lists: dict[tuple[str, str, int], dict[tuple[str, int], int]] = defaultdict(dict)  # -> ttl
        # combination registry: (namespace, counter) -> combination -> is_full (None: never set)
        self.combos: dict[tuple[str, str], dict[str, bool | None]] = defaultdict(dict)
        # sketch store: partition -> start_us -> (timestamp, (sketch, computed_upto), ttl), tombstones as buckets'
        self.sketches: dict[tuple, dict[int, tuple[int, tuple[bytes, int], int]]] = defaultdict(dict)
        self.sketch_tombs: dict[tuple, list[tuple[int | None, int]]] = defaultdict(list)
        self.sketch_slices: dict[tuple[str, str], dict[int, int]] = defaultdict(dict)  # slice -> ttl
        self.sketch_counters: dict[tuple, dict[str, int]] = defaultdict(dict)  # counter -> ttl

    # -- Executor protocol ----------------------------------------------------------------------

    async def run(self, stmt: Stmt) -> list[tuple]:
        assert stmt.cql.count("?") == len(stmt.params), (stmt.op, stmt.cql, stmt.params)
        assert stmt.cql.startswith(("SELECT", "INSERT", "UPDATE", "DELETE")), stmt.cql
        assert f" {self.keyspace}." in stmt.cql, stmt.cql
        loop = asyncio.get_running_loop()
        if loop not in self._slots:  # as CassandraSession: requests in flight bounded per event loop
            self._slots = {loop: asyncio.Semaphore(self.concurrency)}
        async with self._slots[loop]:
            return await self._run(stmt)

    async def _run(self, stmt: Stmt) -> list[tuple]:
        self.log.append(stmt)
        paxos = self._schema_check(stmt)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.peaks[stmt.op] = max(self.peaks.get(stmt.op, 0), self.in_flight)
        if paxos is not None:
            self.paxos[paxos] += 1
            self.paxos_contended += self._paxos_busy[paxos] > 0
            self._paxos_busy[paxos] += 1
        try:
            await asyncio.sleep(0)  # let other requests interleave
            if self.fail_next.get(stmt.op):
                self.fail_next[stmt.op] -= 1
                raise TimeoutError(f"injected failure of {stmt.op}")
            handler = getattr(self, "_" + stmt.op.replace(".", "_"))
            return handler(stmt, *stmt.params) or []
        finally:
            self.in_flight -= 1
            if paxos is not None:
                self._paxos_busy[paxos] -= 1

    def _schema_check(self, stmt: Stmt) -> tuple[str, tuple] | None:
        """A statement on a fixed table (``stmt.table`` None) names a table of the schema; a lightweight transaction
        restricts its table's whole partition key (Cassandra: one partition, one Paxos instance) and a fixed table is
        written either by transactions or by plain writes, never both. Returns the Paxos instance of a transaction
        (table, partition key values), else None."""
        if stmt.table is not None:
            return None
        table = re.search(rf"(?:FROM|UPDATE|INTO) {self.keyspace}\.(\w+)", stmt.cql).group(1)
        assert table in SCHEMA_KEYS, f"{stmt.op}: no table {table} in the schema"
        if stmt.cql.startswith("SELECT"):
            return None
        lwt = " IF " in stmt.cql
        self.write_kinds[table].add("lwt" if lwt else "plain")
        assert len(self.write_kinds[table]) == 1, f"{table} written both with and without lightweight transactions"
        if not lwt:
            return None
        values = _key_values(stmt)
        assert all(c in values for c in SCHEMA_KEYS[table]), (stmt.cql, SCHEMA_KEYS[table])
        return table, tuple(values[c] for c in SCHEMA_KEYS[table])

    async def run_all(self, stmts: Sequence[Stmt], *, missing_ok: bool = False) -> list[list[tuple] | None]:
        return await run_bounded(stmts, self.run, self.concurrency, missing_ok=missing_ok)

    async def ddl(self, stmt: Stmt) -> None:
        assert "?" not in stmt.cql
        self.ddl_log.append(stmt.cql)
        await asyncio.sleep(0)
        if stmt.op == "slice.create":
            assert stmt.cql.startswith(f"CREATE TABLE IF NOT EXISTS {self.keyspace}.{stmt.table} (")
            self._expiry(int(stmt.cql.split("default_time_to_live = ")[1].split()[0]))  # must hold from creation on
            if stmt.table not in self.tables:
                self.tables.add(stmt.table)
                self.events[stmt.table] = {}
                self.range_tombs[stmt.table] = {}
        elif stmt.op == "slice.drop":
            assert stmt.cql == f"DROP TABLE IF EXISTS {self.keyspace}.{stmt.table}"
            self.tables.discard(stmt.table)
            self.events.pop(stmt.table, None)
            self.range_tombs.pop(stmt.table, None)
        else:
            raise AssertionError(stmt.op)

    def acquire(self) -> None:
        self.refs += 1

    async def close(self) -> None:
        self.refs -= 1
        self.closed = self.refs <= 0

    # -- helpers --------------------------------------------------------------------------------

    def _expiry(self, ttl: int) -> int:
        """When a cell written now with ``ttl`` expires (NEVER for 0). As Cassandra < 5.0 with the default
        expiration_date_overflow_policy REJECT, a write expiring after 2038-01-19T03:14:06Z fails."""
        assert isinstance(ttl, int) and 0 <= ttl <= MAX_TTL_SECONDS, ttl
        if not ttl:
            return NEVER
        expiry = int(self.clock_s()) + ttl
        if expiry > MAX_EXPIRY_S:
            raise InvalidRequest(f"ttl of {ttl} seconds exceeds maximum supported expiration date of "
                                 "2038-01-19T03:14:06+00:00 (CASSANDRA-14092)")
        return expiry

    def _table(self, stmt: Stmt) -> dict[tuple, dict[tuple, tuple[int, tuple]]]:
        if stmt.table not in self.tables:
            raise MissingTable(stmt.table)
        return self.events[stmt.table]

    def _visible(self, stmt: Stmt, pk: tuple) -> list[tuple[tuple, tuple]]:
        """Live rows of a partition in clustering order (event_time DESC, event_id, event_item_key)."""
        rows = self._table(stmt).get(pk, {})
        tombs = self.range_tombs[stmt.table].get(pk, [])
        live = [(ck, (cells["delta"][1], cells["is_clear"][1])) for ck, cells in rows.items()
                if not any(ck[0] < cutoff and tomb_ts >= cells["delta"][0] for cutoff, tomb_ts in tombs)]
        live.sort(key=lambda item: (-item[0][0], item[0][1], item[0][2]))
        return live

    # -- event store ops ------------------------------------------------------------------------

    def _ns_pin(self, stmt, ns, bpi, spb, sps):
        assert stmt.cql.endswith("IF NOT EXISTS")
        if ns not in self.pins:
            self.pins[ns] = (bpi, spb, sps)
            return [(True,)]
        return [(False, ns, *self.pins[ns])]

    def _ns_get(self, stmt, ns):
        return [self.pins[ns]] if ns in self.pins else []

    def _slices_add(self, stmt, ns, slice_no, table, start, end):
        self.catalog[ns][slice_no] = (table, start, end)

    def _slices_list(self, stmt, ns):
        return [(s, *v) for s, v in sorted(self.catalog[ns].items())]

    def _slices_remove(self, stmt, ns, slice_no):
        self.catalog[ns].pop(slice_no, None)

    def _index_add(self, stmt, ns, c, tb, eb, ttl):
        self._expiry(ttl)
        self.index[(ns, c)].setdefault((tb, eb), False)

    def _index_add_clear(self, stmt, ns, c, tb, eb, ttl):
        self._expiry(ttl)
        self.index[(ns, c)][(tb, eb)] = True

    def _index_range(self, stmt, ns, c, lo, hi):
        return [(tb, eb, flag) for (tb, eb), flag in sorted(self.index[(ns, c)].items()) if lo <= tb <= hi]

    def _index_newest(self, stmt, ns, c):
        assert stmt.cql.endswith("ORDER BY time_bucket DESC LIMIT 1")
        return [(tb,) for tb, _eb in sorted(self.index[(ns, c)], reverse=True)[:1]]

    def _counters_add(self, stmt, ns, shard, c):
        self.registry[(ns, shard)].add(c)

    def _counters_first(self, stmt, ns, shard, limit):
        return [(c,) for c in sorted(self.registry[(ns, shard)])[:limit]]

    def _counters_after(self, stmt, ns, shard, after, limit):
        return [(c,) for c in sorted(self.registry[(ns, shard)]) if c > after][:limit]

    def _counters_forget(self, stmt, ns, shard):
        self.registry.pop((ns, shard), None)

    def _index_remove(self, stmt, ns, c, tb, eb):
        self.index[(ns, c)].pop((tb, eb), None)

    def _index_trim(self, stmt, ns, c, below):
        for key in [k for k in self.index[(ns, c)] if k[0] < below]:
            del self.index[(ns, c)][key]

    def _event_insert(self, stmt, ns, c, tb, eb, t, eid, key, delta, clear, ts, ttl):
        assert isinstance(clear, bool) and ts == t
        expiry = self._expiry(ttl)
        row = self._table(stmt).setdefault((ns, c, tb, eb), {}).setdefault((t, eid, key), {})
        for name, value in (("delta", delta), ("is_clear", clear)):  # each cell reconciled on its own
            if _wins((ts, value, expiry), row.get(name)):
                row[name] = (ts, value, expiry)

    def _event_span(self, stmt, ns, c, tb, eb, lo, hi):
        return [ck for ck, _ in self._visible(stmt, (ns, c, tb, eb)) if lo <= ck[0] <= hi]

    def _event_rows(self, stmt, ns, c, tb, eb, after, upto):
        return [(*ck, d, clear) for ck, (d, clear) in self._visible(stmt, (ns, c, tb, eb)) if after < ck[0] <= upto]

    def _event_sum(self, stmt, ns, c, tb, eb, after, upto):
        chosen = [d for ck, (d, _) in self._visible(stmt, (ns, c, tb, eb)) if after < ck[0] <= upto]
        total = sum(chosen)
        if not stmt.cql.startswith("SELECT sum(cast(delta AS varint)),"):  # a bigint sum: a Java long, it wraps
            total = (total + 2**63) % 2**64 - 2**63
        return [(total, len(chosen))]  # Cassandra: one row even when nothing matched

    def _event_count_before(self, stmt, ns, c, tb, eb, cutoff):
        return [(sum(1 for ck, _ in self._visible(stmt, (ns, c, tb, eb)) if ck[0] < cutoff),)]

    def _event_delete_before(self, stmt, ns, c, tb, eb, cutoff):
        self._table(stmt)
        self.range_tombs[stmt.table].setdefault((ns, c, tb, eb), []).append((cutoff, _now_us()))

    # -- rollup store ops -----------------------------------------------------------------------

    def _cell_live(self, key, name):
        cell = self.cells[key].get(name)
        if cell is None or cell[0] <= self.row_tombs.get(key, -(2**63)):
            return None
        return cell[1]

    def _set_cell(self, key, name, ts, value):
        if _wins((ts, value), self.cells[key].get(name)):
            self.cells[key][name] = (ts, value)

    def _rollup_get(self, stmt, ns, c):
        values = [self._cell_live((ns, c), n) for n in ("count", "rts", "lw")]
        return [tuple(values)] if any(v is not None for v in values) else []

    def _rollup_bump(self, stmt, ts, lw, ns, c):
        self._set_cell((ns, c), "lw", ts, lw)

    def _rollup_write(self, stmt, ts, count, rts, ns, c):
        _bigint(count)
        self._set_cell((ns, c), "count", ts, count)
        self._set_cell((ns, c), "rts", ts, rts)

    def _rollup_delete(self, stmt, ts, ns, c):
        self.row_tombs[(ns, c)] = max(ts, self.row_tombs.get((ns, c), -(2**63)))

    def _rollup_scan(self, stmt):
        out = []
        for key in list(self.cells):
            rows = self._rollup_get(stmt, *key)
            if rows:
                out.append((*key, rows[0][1], rows[0][2]))
        return out

    def _marker_live(self, key):
        ts = self.markers.get(key)
        return ts is not None and ts > self.marker_tombs.get(key, -(2**63))

    def _pending_mark(self, stmt, shard, ns, c, ts):
        key = (shard, ns, c)
        self.markers[key] = max(ts, self.markers.get(key, -(2**63)))

    def _pending_clear(self, stmt, ts, shard, ns, c):
        key = (shard, ns, c)
        self.marker_tombs[key] = max(ts, self.marker_tombs.get(key, -(2**63)))

    def _live_markers(self, shard):
        return sorted((ns, c) for (s, ns, c) in self.markers if s == shard and self._marker_live((s, ns, c)))

    def _pending_first(self, stmt, shard, limit):
        return self._live_markers(shard)[:limit]

    def _pending_after(self, stmt, shard, ns, c, limit):
        return [k for k in self._live_markers(shard) if k > (ns, c)][:limit]

    def _pending_of_ns(self, stmt, shard, ns, limit=None):
        return [(c,) for n, c in self._live_markers(shard) if n == ns][:limit]

    def _bounds_set(self, stmt, ts, rts, ns, shard):
        if _wins((ts, rts), self.bounds[ns].get(shard)):
            self.bounds[ns][shard] = (ts, rts)

    def _bounds_get(self, stmt, ns):
        tomb = self.bound_tombs.get(ns, -(2**63))
        return [(v,) for ts, v in self.bounds[ns].values() if ts > tomb]

    def _bounds_delete(self, stmt, ts, ns):
        self.bound_tombs[ns] = max(ts, self.bound_tombs.get(ns, -(2**63)))

    def _marks_set(self, stmt, ts, mark, topic, partition):
        if _wins((ts, mark), self.marks[topic].get(partition)):
            self.marks[topic][partition] = (ts, mark)

    def _marks_get(self, stmt, topic):
        return [(p, v) for p, (_ts, v) in sorted(self.marks[topic].items())]

    def _cas(self, stmt, topic, partition, applies, column, value) -> list[tuple]:
        """A lightweight transaction on one row of watermark_claims: applied (the row changed) iff
        ``applies(claim, marks)``; as Cassandra, one row leading with ``[applied]``, and no custom timestamp allowed.
        (``_run`` counts it against the Paxos instance of its Cassandra partition.)"""
        assert " IF " in stmt.cql and "USING TIMESTAMP" not in stmt.cql, stmt.cql
        row = self.claims.get((topic, partition), [None, {}])
        if not applies(row[0], row[1]):
            return [(False, row[0])]
        if column == "claim":
            row[0] = value
        else:
            row[1][column] = value
        self.claims[(topic, partition)] = row
        return [(True,)]

    def _claims_get(self, stmt, topic, partition):
        assert stmt.serial, "a claim is read back at the serial level"
        row = self.claims.get((topic, partition))
        return [(row[0], dict(row[1]) or None)] if row else []

    def _claims_first(self, stmt, claim, topic, partition):
        _bigint(claim)
        return self._cas(stmt, topic, partition, lambda stored, _marks: stored is None, "claim", claim)

    def _claims_next(self, stmt, claim, topic, partition, latest):
        _bigint(claim)
        return self._cas(stmt, topic, partition, lambda stored, _marks: stored == latest, "claim", claim)

    def _claims_raise(self, stmt, key, mark, topic, partition, claim, key_again, mark_again):
        assert (key, mark) == (key_again, mark_again)
        return self._cas(stmt, topic, partition,  # a missing element compares as null: only != applies
                         lambda stored, marks: stored == claim and key in marks and marks[key] < mark, key, mark)

    def _claims_first_mark(self, stmt, key, mark, topic, partition, claim, key_again):
        assert key == key_again
        return self._cas(stmt, topic, partition, lambda stored, marks: stored == claim and key not in marks, key,
                         mark)

    def _claims_marks(self, stmt, topic, partition):
        row = self.claims.get((topic, partition))
        return [(dict(row[1]) or None,)] if row else []

    def _claimed_add(self, stmt, partitions, topic):
        assert isinstance(partitions, frozenset) and all(isinstance(p, int) for p in partitions), partitions
        self.claimed[topic] |= partitions

    def _claimed_get(self, stmt, topic):
        # as the driver returns a set<int>: sorted; an empty set is no value (a row without it is no row here)
        return [(sorted(self.claimed[topic]),)] if self.claimed.get(topic) else []

    # -- bucket store ops -----------------------------------------------------------------------

    def _bucket_live(self, pk: tuple, start: int, ts: int) -> bool:
        return not any(ts <= tomb_ts and (last is None or start <= last) for last, tomb_ts in self.bucket_tombs[pk])

    def _wbucket_write(self, stmt, ts, ttl, value, upto, ns, c, g, slice_no, start):
        assert ts == upto and isinstance(ttl, int) and ttl >= 0
        _bigint(value)
        assert start // _SLICE_US[g] == slice_no, "a bucket must be written in its own slice's partition"
        self._expiry(ttl)
        rows = self.buckets[(ns, c, g, slice_no)]
        if _wins((ts, (value, upto)), rows.get(start, (None, None))[:2] if start in rows else None):
            rows[start] = (ts, (value, upto), ttl)

    def _wbucket_range(self, stmt, ns, c, g, slice_no, lo, hi):
        pk = (ns, c, g, slice_no)
        return [(start, *value) for start, (ts, value, _ttl) in sorted(self.buckets[pk].items())
                if lo <= start < hi and self._bucket_live(pk, start, ts)]

    def _wbucket_drop(self, stmt, ts, ns, c, g, slice_no):
        self.bucket_tombs[(ns, c, g, slice_no)].append((None, ts))

    def _wbucket_drop_through(self, stmt, ts, ns, c, g, slice_no, last_start):
        self.bucket_tombs[(ns, c, g, slice_no)].append((last_start, ts))

    def _wslices_add(self, stmt, ns, g, slice_no, ttl):
        self._expiry(ttl)
        self.window_slices[(ns, g)][slice_no] = ttl

    def _wslices_list(self, stmt, ns, g):
        return [(s,) for s in sorted(self.window_slices[(ns, g)])]

    def _wslices_remove(self, stmt, ns, g, slice_no):
        self.window_slices[(ns, g)].pop(slice_no, None)

    def _wcounters_add(self, stmt, ns, g, slice_no, shard, c, ttl):
        self._expiry(ttl)
        self.window_counters[(ns, g, slice_no, shard)][c] = ttl

    def _wcounters_list(self, stmt, ns, g, slice_no, shard):
        return [(c,) for c in sorted(self.window_counters[(ns, g, slice_no, shard)])]

    def _wcounters_forget(self, stmt, ns, g, slice_no, shard):
        self.window_counters.pop((ns, g, slice_no, shard), None)

    def _wclears_bump(self, stmt, ts, clear_us, ns, c):
        assert ts == clear_us
        if _wins((ts, clear_us), self.clear_cells.get((ns, c))):
            self.clear_cells[(ns, c)] = (ts, clear_us)

    def _wclears_get(self, stmt, ns, c):
        cell = self.clear_cells.get((ns, c))
        return [(cell[1],)] if cell else []

    def _rank_live(self, pk: tuple) -> list[tuple[int, str]]:
        """Live entries of a rank partition in clustering order (bucket_count DESC, counter_name ASC): a tombstone
        shadows writes stamped at or before it."""
        floor = self.rank_partition_tombs.get(pk, -(2**63))
        tombs = self.rank_tombs[pk]
        live = [key for key, (ts, _ttl) in self.ranks[pk].items() if ts > floor and ts > tombs.get(key, -(2**63))]
        return sorted(live, key=lambda e: (-e[0], e[1].encode()))

    def _wrank_add(self, stmt, ns, sig, g, start, value, base, ts, ttl):
        assert isinstance(ttl, int) and ttl >= 0 and isinstance(value, int)
        self._expiry(ttl)
        key = (value, base)
        old = self.ranks[(ns, sig, g, start)].get(key)
        if old is None or ts >= old[0]:
            self.ranks[(ns, sig, g, start)][key] = (ts, ttl)

    def _wrank_remove(self, stmt, ts, ns, sig, g, start, value, base):
        tombs = self.rank_tombs[(ns, sig, g, start)]
        tombs[(value, base)] = max(ts, tombs.get((value, base), -(2**63)))

    def _wrank_drop(self, stmt, ts, ns, sig, g, start):
        pk = (ns, sig, g, start)
        self.rank_partition_tombs[pk] = max(ts, self.rank_partition_tombs.get(pk, -(2**63)))

    def _wrank_first(self, stmt, ns, sig, g, start, limit):
        assert limit > 0
        return [(base, value) for value, base in self._rank_live((ns, sig, g, start))[:limit]]

    def _wrank_tie(self, stmt, ns, sig, g, start, value, after, limit):
        assert limit > 0
        return [(b, v) for v, b in self._rank_live((ns, sig, g, start))
                if v == value and b.encode() > after.encode()][:limit]

    def _wrank_below(self, stmt, ns, sig, g, start, value, limit):
        assert limit > 0
        return [(b, v) for v, b in self._rank_live((ns, sig, g, start)) if v < value][:limit]

    def _reversed(self, stmt, pk):
        assert stmt.cql.endswith("ORDER BY bucket_count ASC, counter_name DESC LIMIT ?"), stmt.cql
        return [(b, v) for v, b in reversed(self._rank_live(pk))]

    def _wrank_last(self, stmt, ns, sig, g, start, limit):
        assert limit > 0
        return self._reversed(stmt, (ns, sig, g, start))[:limit]

    def _wrank_tie_back(self, stmt, ns, sig, g, start, value, before, limit):
        assert limit > 0
        return [(b, v) for b, v in self._reversed(stmt, (ns, sig, g, start))
                if v == value and b.encode() < before.encode()][:limit]

    def _wrank_above(self, stmt, ns, sig, g, start, value, limit):
        assert limit > 0
        return [(b, v) for b, v in self._reversed(stmt, (ns, sig, g, start)) if v > value][:limit]

    def _wranklists_add(self, stmt, ns, g, slice_no, sig, start, ttl):
        assert start // _SLICE_US[g] == slice_no, "a rank list is listed in its own bucket slice"
        self._expiry(ttl)
        self.rank_lists[(ns, g, slice_no)][(sig, start)] = ttl

    def _wranklists_list(self, stmt, ns, g, slice_no):
        return sorted(self.rank_lists[(ns, g, slice_no)], key=lambda e: (e[0].encode(), e[1]))

    def _wranklists_remove(self, stmt, ns, g, slice_no, sig, start):
        self.rank_lists[(ns, g, slice_no)].pop((sig, start), None)

    def _wranklists_forget(self, stmt, ns, g, slice_no):
        self.rank_lists.pop((ns, g, slice_no), None)

    # -- combination registry ops ---------------------------------------------------------------

    def _combos_add(self, stmt, ns, c, combination):
        self.combos[(ns, c)].setdefault(combination, None)  # the row's key only: is_full untouched

    def _combos_add_full(self, stmt, ns, c, combination):
        self.combos[(ns, c)][combination] = True

    def _combos_page(self, stmt, ns, c, *rest):
        """Every variant of combos.page: [lower] [upper] limit, in clustering (UTF-8 byte) order."""
        *bounds, limit = rest
        lower = bounds.pop(0) if ".from" in stmt.op or ".after" in stmt.op else None
        upper = bounds.pop(0) if ".below" in stmt.op else None
        assert not bounds
        names = sorted(self.combos[(ns, c)], key=lambda n: n.encode())
        if lower is not None:
            names = [n for n in names if (n.encode() >= lower.encode() if ".from" in stmt.op
                                          else n.encode() > lower.encode())]
        if upper is not None:
            names = [n for n in names if n.encode() < upper.encode()]
        return [(n, self.combos[(ns, c)][n]) for n in names[:limit]]

    _combos_page_from = _combos_page_after = _combos_page_below = _combos_page
    _combos_page_from_below = _combos_page_after_below = _combos_page

    # -- sketch store ops -----------------------------------------------------------------------

    def _sketch_live(self, pk: tuple, start: int, ts: int) -> bool:
        return not any(ts <= tomb_ts and (last is None or start <= last) for last, tomb_ts in self.sketch_tombs[pk])

    def _wsketch_write(self, stmt, ts, ttl, sketch, upto, ns, c, g, slice_no, start):
        assert ts == upto and isinstance(ttl, int) and ttl >= 0 and isinstance(sketch, bytes)
        assert start // _SLICE_US[g] == slice_no, "a sketch must be written in its own slice's partition"
        self._expiry(ttl)
        rows = self.sketches[(ns, c, g, slice_no)]
        if _wins((ts, (sketch, upto)), rows[start][:2] if start in rows else None):
            rows[start] = (ts, (sketch, upto), ttl)

    def _sketch_rows(self, ns, c, g, slice_no, lo, hi):
        pk = (ns, c, g, slice_no)
        return [(start, *value) for start, (ts, value, _ttl) in sorted(self.sketches[pk].items())
                if lo <= start < hi and self._sketch_live(pk, start, ts)]

    def _wsketch_range(self, stmt, ns, c, g, slice_no, lo, hi):
        return self._sketch_rows(ns, c, g, slice_no, lo, hi)

    def _wsketch_marks(self, stmt, ns, c, g, slice_no, lo, hi):
        return [(start, upto) for start, _sketch, upto in self._sketch_rows(ns, c, g, slice_no, lo, hi)]

    def _wsketch_drop(self, stmt, ts, ns, c, g, slice_no):
        self.sketch_tombs[(ns, c, g, slice_no)].append((None, ts))

    def _wsketch_drop_through(self, stmt, ts, ns, c, g, slice_no, last_start):
        self.sketch_tombs[(ns, c, g, slice_no)].append((last_start, ts))

    def _sslices_add(self, stmt, ns, g, slice_no, ttl):
        self._expiry(ttl)
        self.sketch_slices[(ns, g)][slice_no] = ttl

    def _sslices_list(self, stmt, ns, g):
        return [(s,) for s in sorted(self.sketch_slices[(ns, g)])]

    def _sslices_remove(self, stmt, ns, g, slice_no):
        self.sketch_slices[(ns, g)].pop(slice_no, None)

    def _scounters_add(self, stmt, ns, g, slice_no, shard, c, ttl):
        self._expiry(ttl)
        self.sketch_counters[(ns, g, slice_no, shard)][c] = ttl

    def _scounters_list(self, stmt, ns, g, slice_no, shard):
        return [(c,) for c in sorted(self.sketch_counters[(ns, g, slice_no, shard)])]

    def _scounters_forget(self, stmt, ns, g, slice_no, shard):
        self.sketch_counters.pop((ns, g, slice_no, shard), None)


_SLICE_US = {g.value: g.slice_us for g in Granularity}


def fake_stores(fake: FakeCassandra | None = None, part: Partitioning = contract.PART,
                **kw) -> tuple[FakeCassandra, CassandraEventStore, CassandraRollupStore]:
    fake = fake or FakeCassandra()
    fake.acquire()
    return fake, CassandraEventStore(fake, lambda ns: part, **kw), CassandraRollupStore(fake, pending_shards=4)


def fake_bucket_store(fake: FakeCassandra, **kw) -> CassandraBucketStore:
    fake.acquire()
    return CassandraBucketStore(fake, **kw)


# -- the shared contract suite, on the fake --------------------------------------------------------

CONTRACT_TESTS = sorted(name for name in dir(contract)
                        if name.startswith("test_") and not name.startswith("test_sqlite"))


def test_the_contract_suite_is_discovered():
    assert len(CONTRACT_TESTS) >= 10 and "test_rollups_only_move_forward" in CONTRACT_TESTS


@pytest.mark.parametrize("name", CONTRACT_TESTS)
def test_contract_on_the_fake(name: str) -> None:
    fake, events, rollups = fake_stores()
    buckets = fake_bucket_store(fake)
    getattr(contract, name)(contract.Stores(events, rollups, buckets, f"ns_{uuid.uuid4().hex[:8]}"))
    for store in (events, rollups, buckets):
        asyncio.run(store.close())
    assert fake.closed and fake.max_in_flight <= fake.concurrency


# -- behaviour the contract does not spell out ------------------------------------------------------

S = contract.S
BASE = contract.BASE
ev = contract.ev


def test_first_rollup_reads_only_partitions_that_exist():
    """rollup_ts 0 must not fan out over every bucket since 1970: the bucket index bounds the work."""
    fake, events, _ = fake_stores()
    asyncio.run(events.write_events([ev("ns", BASE + 5 * S, "a", 2), ev("ns", BASE + 5 * S + 1, "b", 3)]))
    fake.log.clear()
    agg = asyncio.run(events.aggregate("ns", "c", 0, BASE + 100 * S))
    assert agg.delta == 5 and agg.events == 2
    ops = [s.op for s in fake.log]
    assert ops.count("index.range") == 1 and ops.count("slices.list") == 0  # catalog known from the write
    assert len(ops) <= 2 + contract.PART.buckets_per_id, ops  # index + catalog + one query per partition


def test_clear_flag_routes_partitions_to_row_reads_and_the_rest_to_server_sums():
    fake, events, _ = fake_stores()
    rows = [ev("ns", BASE + i * S, f"e{i}", 1) for i in range(40)]
    rows.append(ev("ns", BASE + 25 * S, "clear", 0, clear=True))
    asyncio.run(events.write_events(rows))
    fake.log.clear()
    agg = asyncio.run(events.aggregate("ns", "c", 0, BASE + 100 * S))
    assert (agg.delta, agg.cleared, agg.last_clear_us) == (14, True, BASE + 25 * S)
    assert agg.events == 1 + 1 + 14  # the clear, the add at its instant, the adds after it
    ops = [s.op for s in fake.log]
    assert ops.count("event.rows") == 1  # only the flagged partition's rows cross the wire
    assert "event.sum" in ops
    sums = [s for s in fake.log if s.op == "event.sum"]
    assert all(s.params[2] >= (BASE + 25 * S) // contract.PART.bucket_us for s in sums)  # none before the clear


def test_writes_are_ordered_table_then_index_then_events():
    fake, events, _ = fake_stores()
    asyncio.run(events.write_events([ev("ns", BASE + 1, "a", 1, clear=True)]))
    ops = [s.op for s in fake.log if not s.op.startswith(("ns.", "slices.list"))]
    assert ops == ["slices.add", "index.add_clear", "counters.add", "event.span", "event.insert"], ops
    asyncio.run(events.write_events([ev("ns", BASE + 2, "b", 1)]))
    assert [s.op for s in fake.log].count("counters.add") == 1  # registered once per process
    assert len(fake.ddl_log) == 1 and "default_time_to_live = 0" in fake.ddl_log[0]


def test_a_second_process_sees_slices_created_by_another():
    fake = FakeCassandra()
    _, writer, _ = fake_stores(fake)
    _, reader, _ = fake_stores(fake)
    asyncio.run(writer.write_events([ev("ns", BASE + 1, "a", 1)]))
    assert asyncio.run(reader.aggregate("ns", "c", 0, BASE + S)).delta == 1
    asyncio.run(writer.write_events([ev("ns", BASE + 90 * S, "b", 1)]))  # a new slice, after reader cached nothing
    assert asyncio.run(reader.aggregate("ns", "c", 0, BASE + 100 * S)).delta == 2
    assert asyncio.run(reader.write_events([ev("ns", BASE + 90 * S, "b", 1)])) == 0


def test_reads_skip_a_slice_dropped_by_another_process_meanwhile():
    fake = FakeCassandra()
    now = BASE + 3600 * S  # the first slice ends an hour and more ago: past the namespace's 30 min retention
    _, events, _ = fake_stores(fake, delete_after_for=lambda ns: 1800.0, clock_us=lambda: now)
    asyncio.run(events.write_events([ev("ns", BASE + 1, "a", 1), ev("ns", BASE + 3500 * S, "b", 1)]))
    table = next(iter(sorted(fake.tables)))
    fake.tables.discard(table)  # dropped, catalog row not yet removed: reads must treat it as empty
    assert asyncio.run(events.aggregate("ns", "c", 0, BASE + 3600 * S)).delta == 1
    assert len(asyncio.run(events.scan("ns", "c", 0, BASE + 3600 * S))) == 1


@pytest.mark.parametrize("retention", [None, 1800.0])
def test_a_listed_slice_retention_cannot_have_dropped_that_the_coordinator_does_not_know_is_an_outage(retention):
    """A review: a coordinator that has not applied a new slice table's schema answers "unconfigured table"; read
    as empty, the rollup wrote count 0 at a boundary past the slice's 5 stored events, which were never counted."""
    from sinks import store_unavailable
    from sinks.cassandra.session import SliceTableUnknown

    fake = FakeCassandra()
    _, events, _ = fake_stores(fake, delete_after_for=lambda ns: retention,
                               clock_us=lambda: BASE + 60 * S)
    asyncio.run(events.write_events([ev("ns", BASE + i, f"e{i}", 1) for i in range(5)]))
    table = next(iter(fake.tables))
    fake.tables.discard(table)  # as the lagging coordinator answers it; the catalog lists it, within retention
    for read in (lambda: events.aggregate("ns", "c", 0, BASE + 60 * S),
                 lambda: events.scan("ns", "c", 0, BASE + 60 * S),
                 lambda: events.contains("ns", [("c", BASE + 1, "e1", "")])):
        with pytest.raises(SliceTableUnknown, match=table) as raised:
            asyncio.run(read())
        assert store_unavailable(raised.value)  # the rollup waits it out, the API answers 503
    fake.tables.add(table)  # agreement: the events are read
    assert asyncio.run(events.aggregate("ns", "c", 0, BASE + 60 * S)).delta == 5


def test_write_recreates_a_table_that_vanished():
    fake = FakeCassandra()
    _, events, _ = fake_stores(fake)
    asyncio.run(events.write_events([ev("ns", BASE + 1, "a", 1)]))
    fake.tables.clear()
    assert asyncio.run(events.write_events([ev("ns", BASE + 2, "b", 1)])) == 1
    assert asyncio.run(events.aggregate("ns", "c", 0, BASE + S)).delta == 1  # "a" went with the table


def test_partitioning_is_pinned_on_first_write():
    fake = FakeCassandra()
    _, first, _ = fake_stores(fake)
    asyncio.run(first.write_events([ev("ns", BASE + 1, "a", 1)]))
    _, changed, _ = fake_stores(fake, Partitioning(16, 5, 30))
    assert asyncio.run(changed.write_events([ev("ns", BASE + 1, "a", 1)])) == 0
    assert asyncio.run(changed.aggregate("ns", "c", 0, BASE + S)).delta == 1
    assert fake.pins["ns"] == (4, 10, 60)


def test_ttl_follows_delete_after_per_namespace():
    fake = FakeCassandra()
    _, events, _ = fake_stores(fake, delete_after_for=lambda ns: {"a": 3600.0}[ns], ttl_grace_s=100)
    asyncio.run(events.write_events([ev("a", BASE + 1, "x", 1), ev("b", BASE + 1, "y", 1)]))
    ddl = {cql.split("(")[0].split(".")[1].strip(): cql for cql in fake.ddl_log}
    ttl_a = next(v for k, v in ddl.items() if k.startswith("ev_a_"))
    ttl_b = next(v for k, v in ddl.items() if k.startswith("ev_b_"))
    assert "default_time_to_live = 3760" in ttl_a  # 3600 + one 60 s slice + 100 s grace
    assert "default_time_to_live = 0" in ttl_b  # unknown namespace: no TTL
    index_ttls = {s.params[1]: s.params[-1] for s in fake.log if s.op == "index.add"}
    assert index_ttls == {"c": index_ttls["c"]} and index_ttls["c"] in (0, 3760 + 3600)


def test_concurrency_is_bounded():
    fake = FakeCassandra(concurrency=3)
    _, events, _ = fake_stores(fake)
    asyncio.run(events.write_events([ev("ns", BASE + i * S, f"e{i}", 1, counter=f"c{i % 7}") for i in range(200)]))
    assert fake.max_in_flight <= 3


def test_failed_batch_can_be_retried_and_counts_stay_exact():
    fake, events, _ = fake_stores()
    rows = [ev("ns", BASE + i, f"e{i}", 1) for i in range(50)]
    fake.fail_next["event.insert"] = 1
    with pytest.raises(TimeoutError):
        asyncio.run(events.write_events(rows))
    written = asyncio.run(events.write_events(rows))  # Kafka redelivers the batch
    assert 0 < written <= 50
    assert asyncio.run(events.aggregate("ns", "c", 0, BASE + S)).delta == 50


def test_write_rollup_races_converge():
    _, _, rollups = fake_stores()

    async def race() -> list[bool]:
        return await asyncio.gather(*(rollups.write_rollup("ns", "c", b * 10, b) for b in (5, 9, 7, 9, 3)))
    applied = asyncio.run(race())
    assert asyncio.run(rollups.get("ns", "c")).rollup_ts == 9 and asyncio.run(rollups.get("ns", "c")).count == 90
    assert any(applied)


def test_markers_follow_timestamps_not_arrival_order():
    _, _, rollups = fake_stores()
    asyncio.run(rollups.bump_last_write([("ns", "c", 100)]))
    asyncio.run(rollups.write_rollup("ns", "c", 1, 100))  # converged: marker deleted at ts 100
    assert asyncio.run(rollups.stale()) == []
    asyncio.run(rollups.bump_last_write([("ns", "c", 90)]))  # a late bump below the rollup: stays clean
    assert asyncio.run(rollups.stale()) == []
    asyncio.run(rollups.bump_last_write([("ns", "c", 150)]))
    assert asyncio.run(rollups.stale()) == [("ns", "c")]


def test_stale_heals_a_marker_left_by_a_crash():
    fake, _, rollups = fake_stores()
    asyncio.run(rollups.bump_last_write([("ns", "c", 100)]))
    fake.fail_next["pending.clear"] = 1
    with pytest.raises(TimeoutError):
        asyncio.run(rollups.write_rollup("ns", "c", 1, 100))  # rollup stored, marker delete lost
    assert asyncio.run(rollups.stale()) == []  # converged: not returned, and the marker is deleted
    assert not any(fake._marker_live(k) for k in fake.markers)
    assert asyncio.run(rollups.min_rollup_ts("ns")) == 100


def test_pending_rollups_only_read_and_skip_a_marker_left_by_a_crash():
    """The operator view reads markers and their rows, nothing else, and writes nothing: a marker left by a crash
    is not counted, and stays for the sweep to delete."""
    fake, _, rollups = fake_stores()
    asyncio.run(rollups.bump_last_write([("ns", "c", 100), ("ns", "d", 200), ("other", "e", 50)]))
    fake.fail_next["pending.clear"] = 1
    with pytest.raises(TimeoutError):
        asyncio.run(rollups.write_rollup("ns", "c", 1, 100))  # rollup stored, marker delete lost
    fake.log.clear()
    assert asyncio.run(rollups.pending_rollups(["ns"], limit=8)) == {"ns": PendingRollups(1, 200, False)}
    ops = [s.op for s in fake.log]
    assert set(ops) == {"pending.of_ns", "rollup.get"} and ops.count("pending.of_ns") == 4  # a page per shard
    limits = [s.params[-1] for s in fake.log if s.op == "pending.of_ns"]
    assert limits[0] == 9 and min(limits) >= 7 and ops.count("rollup.get") == 2  # what the limit leaves, + 1
    assert sum(fake._marker_live(k) for k in fake.markers) == 3  # c's marker is still there


# -- claims: one Paxos instance per Kafka partition -------------------------------------------------------------


async def _publish(store: CassandraRollupStore, topic: str, claims: dict[int, int], mark: int) -> list[set[int]]:
    """What a worker publishes at a tick, key after key (offsets, floors, watermarks), each key's partitions at once."""
    return [await store.set_watermarks(key, dict.fromkeys(claims, mark), claims=claims)
            for key in (*arrival_keys(topic), topic)]


def _publish_all(store: CassandraRollupStore, topic: str, claims: dict[int, int], mark: int) -> list[set[int]]:
    return asyncio.run(_publish(store, topic, claims, mark))


def test_claims_and_marks_of_different_partitions_never_share_a_paxos_instance():
    """Keyed by the topic alone, every claim and publication of every worker would be a transaction on one Cassandra
    partition, contending in one Paxos instance; each Kafka partition has its own."""
    fake, _, first = fake_stores()
    second = CassandraRollupStore(fake)  # another worker

    async def two_workers() -> tuple[dict[int, int], dict[int, int]]:
        a, b = await asyncio.gather(first.claim_partitions("t", range(4)), second.claim_partitions("t", range(4, 8)))
        assert await asyncio.gather(_publish(first, "t", a, 100), _publish(second, "t", b, 100)) == [[set()] * 3] * 2
        return a, b

    a, b = asyncio.run(two_workers())
    assert len(set(a.values()) | set(b.values())) == 8
    assert set(fake.paxos) == {("watermark_claims", ("t", p)) for p in range(8)}
    assert fake.paxos_contended == 0  # a partition's own statements are sent one after another
    # a claim (no race), and a first mark per key: a raise, not applied (no mark yet), then the first mark
    assert set(fake.paxos.values()) == {1 + 3 * 2}
    assert _publish_all(first, "t", a, 200) == [set()] * 3
    assert [fake.paxos["watermark_claims", ("t", p)] for p in (0, 4)] == [7 + 3, 7]  # then one per key
    assert asyncio.run(second.watermarks("t")) == {0: 200, 1: 200, 2: 200, 3: 200, 4: 100, 5: 100, 6: 100, 7: 100}


def test_the_fake_sees_the_contention_of_a_topic_wide_key(monkeypatch):
    """The model behind the test above: with the topic as the whole partition key, the same workload contends."""
    monkeypatch.setitem(SCHEMA_KEYS, "watermark_claims", ("topic",))
    fake, _, store = fake_stores()
    claims = asyncio.run(store.claim_partitions("t", range(4)))
    _publish_all(store, "t", claims, 100)
    assert set(fake.paxos) == {("watermark_claims", ("t",))} and fake.paxos_contended > 0


def test_the_fake_holds_statements_to_the_schema():
    fake = FakeCassandra()
    with pytest.raises(AssertionError, match="no table watermark_claims_old in the schema"):
        asyncio.run(fake.run(Stmt("claims.marks", "SELECT marks FROM ks.watermark_claims_old WHERE topic = ? "
                                                  "AND kafka_partition = ?", ("t", 0))))
    with pytest.raises(AssertionError):  # a transaction must name its whole partition
        asyncio.run(fake.run(Stmt("claims.first", "UPDATE ks.watermark_claims SET claim = ? WHERE topic = ? "
                                                  "IF claim = null", (1, "t"))))
    asyncio.run(fake.run(Stmt("marks.set", "UPDATE ks.watermarks USING TIMESTAMP ? SET mark_us = ? WHERE topic = ? "
                                           "AND kafka_partition = ?", (1, 1, "t", 0))))
    with pytest.raises(AssertionError, match="written both with and without"):
        asyncio.run(fake.run(Stmt("marks.set", "UPDATE ks.watermarks SET mark_us = ? WHERE topic = ? "
                                               "AND kafka_partition = ? IF mark_us < ?", (1, "t", 0, 1))))


def test_watermarks_read_a_partition_claimed_after_this_reader_last_read():
    """The list of claimed partitions is read at every call: a partition another worker claimed since this reader's
    last read is read too (a reader that kept an old list would leave its marks out: a floor missed at a handover).
    Once the list is known, the list and the partitions are read in one round trip."""
    fake, _, reader = fake_stores()
    one, two = CassandraRollupStore(fake), CassandraRollupStore(fake)
    _publish_all(one, "t", asyncio.run(one.claim_partitions("t", [0])), 100)
    assert asyncio.run(reader.watermarks("t")) == {0: 100}
    _publish_all(two, "t", asyncio.run(two.claim_partitions("t", [1])), 50)
    assert asyncio.run(reader.watermarks("t/arrival-floor")) == {0: 100, 1: 50}
    fake.log.clear()
    assert asyncio.run(reader.watermarks("t")) == {0: 100, 1: 50}
    ops = [s.op for s in fake.log]
    assert sorted(ops) == ["claimed.get", "claims.marks", "claims.marks", "marks.get"]
    assert fake.peaks["claims.marks"] >= 3  # sent together with the list's read
    fake.log.clear()
    assert asyncio.run(reader.watermarks("other")) == {} and [s.op for s in fake.log] == ["marks.get", "claimed.get"]


def test_a_claim_is_listed_before_it_is_returned():
    """A claim whose partition could not be listed is not returned (the caller retries), so no mark is ever
    published under a claim that readers of the list would not find."""
    fake, _, store = fake_stores()
    fake.fail_next["claimed.add"] = 1
    with pytest.raises(TimeoutError):
        asyncio.run(store.claim_partitions("t", [0, 1]))
    assert not fake.claimed
    claims = asyncio.run(store.claim_partitions("t", [0, 1]))
    assert fake.claimed["t"] == {0, 1} and _publish_all(store, "t", claims, 10) == [set()] * 3
    assert asyncio.run(CassandraRollupStore(fake).watermarks("t")) == {0: 10, 1: 10}


def test_racing_stores_read_one_identity_and_a_fresh_keyspace_another():
    """`RollupStore.identity` (the rollup cache's keys carry it): first writer wins by a lightweight transaction; the
    processes racing it and those after read the winner's, and a fresh keyspace draws another."""
    fake, _, store = fake_stores()
    others = [CassandraRollupStore(fake) for _ in range(3)]

    async def race() -> list[str]:
        return list(await asyncio.gather(store.identity(), *(o.identity() for o in others)))

    ids = asyncio.run(race())
    assert len(set(ids)) == 1 and len(ids[0]) == 16
    assert [s.op for s in fake.log].count("claims.first") >= 1 and fake.write_kinds["watermark_claims"] == {"lwt"}
    assert asyncio.run(CassandraRollupStore(fake).identity()) == ids[0]
    assert asyncio.run(fake_stores()[2].identity()) != ids[0]


def test_claims_never_repeat_after_the_claims_were_lost():
    """Claims were the previous one + 1 from 1: after the claims table was lost (dropped and recreated, truncated) a
    stale worker's claim equalled the next owner's, and its publications landed."""
    fake, _, stale = fake_stores()
    claims = asyncio.run(stale.claim_partitions("t", [0]))
    assert _publish_all(stale, "t", claims, 100) == [set()] * 3
    fake.claims.clear()  # the table is lost
    successor = CassandraRollupStore(fake)
    assert asyncio.run(successor.claim_partitions("t", [0]))[0] != claims[0]
    assert _publish_all(stale, "t", claims, 500) == [{0}] * 3
    assert asyncio.run(successor.watermarks("t")) == {}


def test_delete_beats_future_stamped_cells():
    _, _, rollups = fake_stores()
    future = _now_us() + 10 * S  # an event time inside max_clock_skew
    asyncio.run(rollups.bump_last_write([("ns", "c", future)]))
    assert asyncio.run(rollups.delete("ns", "c")) == 1
    assert asyncio.run(rollups.get("ns", "c")) is None
    assert asyncio.run(rollups.stale()) == []


def test_adds_at_the_clear_instant_in_other_partitions_count_as_events_not_delta():
    part = contract.PART
    clear_id = "the-clear"
    other = next(f"add{i}" for i in range(100) if part.event_bucket(f"add{i}") != part.event_bucket(clear_id))
    _, events, _ = fake_stores()
    t = BASE + 5 * S
    asyncio.run(events.write_events([ev("ns", t, clear_id, 0, clear=True), ev("ns", t, other, 7),
                                     ev("ns", t + 1, "after", 2), ev("ns", t - 1, "before", 100)]))
    agg = asyncio.run(events.aggregate("ns", "c", 0, t + S))
    assert (agg.delta, agg.cleared, agg.last_clear_us, agg.events) == (2, True, t, 3)


def test_counters_page_in_name_order_like_sqlite(tmp_path):
    from sinks.sqlite.events import SqliteEventStore

    names = [f"k{i:03d}" for i in range(0, 120, 3)] + ["Z", "a", "é", "a b"]
    rows = [ev("ns", BASE + (i % 5) * 70 * S + i, f"e{i}", 1, counter=n) for i, n in enumerate(names)]
    rows.append(ev("other", BASE + 1, "x", 1, counter="k000"))
    _, events, _ = fake_stores()
    sqlite = SqliteEventStore(tmp_path / "events.sqlite3", lambda ns: contract.PART)

    async def pages(store, limit):
        out, after = [], None
        while True:
            page = await store.counters("ns", after=after, limit=limit)
            assert len(page) <= limit
            out += page
            if len(page) < limit:
                return out
            after = page[-1]

    async def body():
        await events.write_events(rows)
        await sqlite.write_events(rows)
        expected = sorted(set(names))
        for limit in (1, 7, 40, 1000):
            assert await pages(events, limit) == await pages(sqlite, limit) == expected
        assert await events.counters("ns", after="k050", limit=3) == ["k051", "k054", "k057"]
        assert await events.counters("ns", limit=0) == [] and await events.counters("nope") == []
        # a counter whose only slices were dropped by retention has no stored events any more
        await events.write_events([ev("ns", BASE + 10_000 * S, "late", 1, counter="fresh")])
        await events.drop_expired_slices("ns", BASE + 5_000 * S, BASE + 5_000 * S)
        assert await pages(events, 10) == ["fresh"]
        await sqlite.close()
    asyncio.run(body())


def test_the_stores_implement_every_protocol_method():
    import inspect

    from sinks.base import BucketStore, EventStore, RollupStore

    fake, events, rollups = fake_stores()
    buckets = fake_bucket_store(fake)
    assert isinstance(events, EventStore) and isinstance(rollups, RollupStore) and isinstance(buckets, BucketStore)
    for proto, store in ((EventStore, events), (RollupStore, rollups), (BucketStore, buckets)):
        for name, member in inspect.getmembers(proto, inspect.iscoroutinefunction):
            if not name.startswith("_"):
                mine = getattr(type(store), name)
                assert inspect.iscoroutinefunction(mine), name
                assert list(inspect.signature(mine).parameters) == list(inspect.signature(member).parameters), name


# -- the bucket store and bucket sums: behaviour the contract does not spell out ----------------------

MINUTE, HOUR, DAY = Granularity.MINUTE, Granularity.HOUR, Granularity.DAY
DAY0 = contract.DAY0
M = contract.M


def test_bucket_sums_many_is_two_fan_outs_for_a_whole_batch():
    fake, events, _ = fake_stores()
    rows = [ev("ns", BASE + i * S, f"e{i}", 1, counter=f"c{i % 20}") for i in range(400)]
    asyncio.run(events.write_events(rows))
    fake.log.clear()
    windows = [(f"c{i}", BASE - 1, BASE + 400 * S) for i in range(20)]
    sums = asyncio.run(events.bucket_sums_many("ns", windows, 60 * S))
    assert [sum(v for _s, v, _c, _n in per) for per in sums] == [20] * 20
    ops = [s.op for s in fake.log]
    assert ops.count("index.range") == 20 and set(ops) == {"index.range", "event.rows"}  # no per-counter catalog
    assert asyncio.run(events.bucket_sums_many("nope", windows, 60 * S)) == [[]] * 20


def test_bucket_writes_register_their_partition_first_and_once():
    fake = FakeCassandra()
    buckets = fake_bucket_store(fake)
    t = DAY0 + 5 * M
    asyncio.run(buckets.write_buckets("ns", [("c", MINUTE, t, 1, t + 1), ("c", HOUR, DAY0, 1, t + 1)]))
    ops = [s.op for s in fake.log]
    assert ops.index("wbucket.write") > max(ops.index("wslices.add"), ops.index("wcounters.add"))
    assert ops.count("wslices.add") == 2 and ops.count("wcounters.add") == 2
    fake.log.clear()
    asyncio.run(buckets.write_buckets("ns", [("c", MINUTE, t + M, 2, t + M + 1), ("d", MINUTE, t, 1, t + 1)]))
    assert [s.op for s in fake.log].count("wcounters.add") == 1  # only d is new in that slice
    assert [s.op for s in fake.log].count("wslices.add") == 0


def test_bucket_ttl_follows_retention_per_granularity():
    fake = FakeCassandra()
    retention = {MINUTE: 48 * 3600.0, HOUR: 90 * 86400.0, DAY: None}
    buckets = fake_bucket_store(fake, retention_for=lambda ns, g: retention[g], ttl_grace_s=100)
    t = DAY0 + 5 * M
    asyncio.run(buckets.write_buckets("ns", [("c", MINUTE, t, 1, t + 1), ("c", HOUR, DAY0, 1, t + 1),
                                             ("c", DAY, DAY0, 1, t + 1)]))
    ttls = {s.params[6]: s.params[1] for s in fake.log if s.op == "wbucket.write"}
    assert ttls == {"minute": 48 * 3600 + 60 + 86400 + 100, "hour": 90 * 86400 + 3600 + 32 * 86400 + 100, "day": 0}
    slice_ttls = {s.params[1]: s.params[-1] for s in fake.log if s.op == "wslices.add"}
    assert slice_ttls == ttls  # catalog rows live as long as the buckets they point at


def test_racing_bucket_writers_converge_on_the_latest_boundary():
    fake = FakeCassandra()
    one, two = fake_bucket_store(fake), fake_bucket_store(fake)
    t = DAY0 + 5 * M

    async def race() -> list[list[bool]]:
        return await asyncio.gather(*(store.write_buckets("ns", [("c", MINUTE, t, b * 10, t + b)])
                                      for store, b in ((one, 5), (two, 9), (one, 7), (two, 3))))
    applied = asyncio.run(race())
    assert asyncio.run(two.read_buckets_many("ns", [("c", MINUTE, t, t + 1)])) == [[(t, 90, t + 9)]]
    assert applied[1] == [True] and applied[3] == [False]


def test_retention_deletes_whole_partitions_and_range_deletes_only_a_cut_slice():
    fake = FakeCassandra()
    buckets = fake_bucket_store(fake)
    rows = [(f"c{i}", MINUTE, DAY0 + k * 60 * M, 1, DAY0 + k * 60 * M + 1) for i in range(3) for k in range(-48, 24)]
    asyncio.run(buckets.write_buckets("ns", rows))
    fake.log.clear()
    assert asyncio.run(buckets.drop_expired("ns", MINUTE, DAY0)) == 2  # slice-aligned: whole partitions
    ops = [s.op for s in fake.log]
    assert ops.count("wbucket.drop") == 6 and "wbucket.drop_through" not in ops
    assert ops.count("wcounters.forget") == 2 * 16 and ops.count("wslices.remove") == 2
    fake.log.clear()
    assert asyncio.run(buckets.drop_expired("ns", MINUTE, DAY0 + 3 * 3600 * S)) == 0
    assert [s.op for s in fake.log].count("wbucket.drop_through") == 3
    left = asyncio.run(buckets.read_buckets_many("ns", [("c0", MINUTE, 0, 2**60)]))[0]
    assert [start for start, _v, _u in left] == [DAY0 + k * 60 * M for k in range(3, 24)]


def test_wide_reads_use_the_slice_catalog_narrow_reads_do_not():
    fake = FakeCassandra()
    buckets = fake_bucket_store(fake)
    asyncio.run(buckets.write_buckets("ns", [("c", DAY, DAY0, 5, DAY0 + 1)]))
    fake.log.clear()
    assert asyncio.run(buckets.read_buckets_many("ns", [("c", DAY, 0, 2**60)])) == [[(DAY0, 5, DAY0 + 1)]]
    assert [s.op for s in fake.log] == ["wslices.list", "wbucket.range"]
    fake.log.clear()
    asyncio.run(buckets.read_buckets_many("ns", [("c", MINUTE, DAY0 - M, DAY0 + M)]))  # two minute slices
    assert [s.op for s in fake.log] == ["wbucket.range", "wbucket.range"]


def _ranks(store, sig, g, start, ns="ns"):
    return asyncio.run(store.read_ranks_many(ns, [(sig, g, start, None, 100)]))[0]


def test_rank_entries_are_written_before_their_bucket_and_replaced_entries_deleted_after():
    fake = FakeCassandra()
    buckets = fake_bucket_store(fake)
    t = DAY0 + 5 * M
    asyncio.run(buckets.write_buckets("ns", [("c country=BR", MINUTE, t, 4, t + 1)]))
    ops = [s.op for s in fake.log]
    assert ops.index("wranklists.add") < ops.index("wrank.add") < ops.index("wbucket.write")
    assert "wrank.remove" not in ops  # nothing replaced
    fake.log.clear()
    asyncio.run(buckets.write_buckets("ns", [("c country=BR", MINUTE, t, 6, t + 2), ("d", MINUTE, t, 1, t + 2)]))
    ops = [s.op for s in fake.log if s.op.startswith(("wrank.", "wbucket."))]
    assert ops == ["wbucket.range", "wbucket.range", "wrank.add", "wrank.add", "wbucket.write", "wbucket.write",
                   "wbucket.range", "wbucket.range", "wrank.remove"], ops
    remove = next(s for s in fake.log if s.op == "wrank.remove")
    assert remove.params == (t + 2, "ns", "country=BR", "minute", t, 4, "c")  # the old value, stamped with the new
    listed = [s.params for s in fake.log if s.op == "wranklists.add"]
    assert listed == [("ns", "minute", t // (86400 * S), "", t, 0)]  # d's list is new; c's was listed once
    assert _ranks(buckets, "country=BR", MINUTE, t) == [("c", 6)] and _ranks(buckets, "", MINUTE, t) == [("d", 1)]
    ttls = {s.params[-1] if s.op == "wrank.add" else s.params[1] for s in fake.log
            if s.op in ("wrank.add", "wbucket.write")}
    assert ttls == {0}  # no retention: no TTL


def test_rank_entries_live_as_long_as_their_buckets():
    fake = FakeCassandra()
    buckets = fake_bucket_store(fake, retention_for=lambda ns, g: 3600.0, ttl_grace_s=100)
    t = DAY0 + 5 * M
    asyncio.run(buckets.write_buckets("ns", [("c country=BR", MINUTE, t, 4, t + 1), ("c", HOUR, DAY0, 4, t + 1)]))
    for g in ("minute", "hour"):
        bucket = {s.params[1] for s in fake.log if s.op == "wbucket.write" and s.params[6] == g}
        entry = {s.params[-1] for s in fake.log if s.op == "wrank.add" and s.params[2] == g}
        listed = {s.params[-1] for s in fake.log if s.op == "wranklists.add" and s.params[1] == g}
        assert len(bucket) == 1 and bucket == entry == listed and bucket != {0}, g


def test_a_crash_between_the_steps_leaves_every_bucket_its_entry():
    """Entries are inserted before their buckets and removed after: a failure anywhere leaves at worst a stale
    entry next to the stored bucket's, and the next write of the bucket removes it."""
    fake = FakeCassandra()
    buckets = fake_bucket_store(fake)
    t = DAY0 + 5 * M
    asyncio.run(buckets.write_buckets("ns", [("c", MINUTE, t, 4, t + 1)]))
    for failing, upto in (("wbucket.write", t + 2), ("wrank.remove", t + 3)):
        fake.fail_next[failing] = 1
        with pytest.raises(TimeoutError):
            asyncio.run(buckets.write_buckets("ns", [("c", MINUTE, t, 9, upto)]))
        [[(_, stored, _)]] = asyncio.run(buckets.read_buckets_many("ns", [("c", MINUTE, t, t + 1)]))
        assert ("c", stored) in _ranks(buckets, "", MINUTE, t), failing
    assert _ranks(buckets, "", MINUTE, t) == [("c", 9), ("c", 4)]  # the bucket holds 9; 4 is stale
    asyncio.run(buckets.write_buckets("ns", [("c", MINUTE, t, 9, t + 4)]))  # the next rollup step
    assert _ranks(buckets, "", MINUTE, t) == [("c", 9), ("c", 4)]  # same value: nothing to replace...
    asyncio.run(buckets.write_buckets("ns", [("c", MINUTE, t, 2, t + 5)]))
    assert _ranks(buckets, "", MINUTE, t) == [("c", 4), ("c", 2)]  # ...the old entry 4 stays stale until then


def test_racing_writers_leave_the_winning_value_ranked():
    fake = FakeCassandra()
    stores = [fake_bucket_store(fake) for _ in range(3)]
    t = DAY0 + 5 * M
    asyncio.run(stores[0].write_buckets("ns", [("c", MINUTE, t, 1, t + 1)]))

    async def race() -> None:
        await asyncio.gather(*(store.write_buckets("ns", [("c", MINUTE, t, b * 10, t + b)])
                               for store, b in zip(stores * 2, (5, 9, 7, 3, 8, 6), strict=True)))
    asyncio.run(race())
    [[(_, value, upto)]] = asyncio.run(stores[1].read_buckets_many("ns", [("c", MINUTE, t, t + 1)]))
    assert (value, upto) == (90, t + 9)
    entries = _ranks(stores[2], "", MINUTE, t)
    assert ("c", 90) in entries and ("c", 10) not in entries and entries == sorted(entries, key=lambda e: -e[1])


def test_retention_drops_the_rank_partitions_a_slice_lists():
    fake = FakeCassandra()
    buckets = fake_bucket_store(fake)
    rows = [(c, MINUTE, DAY0 + k * 60 * M, 1, DAY0 + k * 60 * M + 1) for c in ("a", "a country=BR", "b device=tv")
            for k in range(-48, 24)]
    asyncio.run(buckets.write_buckets("ns", rows))
    fake.log.clear()
    assert asyncio.run(buckets.drop_expired("ns", MINUTE, DAY0)) == 2
    ops = [s.op for s in fake.log]
    assert ops.count("wrank.drop") == 3 * 48 and ops.count("wranklists.forget") == 2  # three signatures
    fake.log.clear()
    asyncio.run(buckets.drop_expired("ns", MINUTE, DAY0 + 3 * 3600 * S))
    assert [s.op for s in fake.log].count("wrank.drop") == 3 * 3  # the cut slice: its expired lists only
    assert [s.op for s in fake.log].count("wranklists.remove") == 3 * 3
    assert sum(len(v) for v in fake.rank_lists.values()) == 3 * 21
    for k in (-48, -1, 0, 2):
        assert _ranks(buckets, "country=BR", MINUTE, DAY0 + k * 60 * M) == []
    assert _ranks(buckets, "country=BR", MINUTE, DAY0 + 3 * 60 * M) == [("a", 1)]


def test_bucket_maintenance_on_cassandra_matches_sqlite(tmp_path):
    """agents.windows over the Cassandra stores builds the same buckets as over SQLite, step by step."""
    import random

    from agents.windows import BucketWork, maintain_buckets
    from sinks.sqlite import SqliteBucketStore, SqliteEventStore
    from tests.unit.test_windows_maintenance import NS, T0

    part = Partitioning.of(NS.time_partition)
    fake = FakeCassandra()
    _, c_events, _ = fake_stores(fake, part)
    c_buckets = fake_bucket_store(fake)
    s_events = SqliteEventStore(tmp_path / "events.sqlite3", lambda ns: part)
    s_buckets = SqliteBucketStore(tmp_path / "buckets.sqlite3")
    rng = random.Random(8)
    rows = [("ns", rng.choice("ab"), T0 + rng.randrange(30 * 3600 * S), f"e{i}", "", rng.randint(-3, 9),
             rng.random() < 0.02) for i in range(500)]

    async def body() -> None:
        for events in (c_events, s_events):
            await events.write_events(rows)
        previous = 0
        for boundary in sorted(T0 + rng.randrange(31 * 3600 * S) for _ in range(6)):
            for events, buckets in ((c_events, c_buckets), (s_events, s_buckets)):
                work = [BucketWork(c, previous, boundary, (await events.aggregate("ns", c, previous, boundary))
                                   .last_clear_us) for c in "ab"]
                await maintain_buckets(NS, work, events=events, buckets=buckets, now_us=boundary + 6 * S)
            ranges = [(c, g, 0, 2**62) for c in "ab" for g in Granularity]
            found = await s_buckets.read_buckets_many("ns", ranges)
            assert await c_buckets.read_buckets_many("ns", ranges) == found and all(found)
            lists = sorted({("", g, start, None, 10) for (_c, g, _lo, _hi), rows in zip(ranges, found, strict=True)
                            for start, _v, _u in rows})
            assert await c_buckets.read_ranks_many("ns", lists) == await s_buckets.read_ranks_many("ns", lists)
            assert await c_buckets.clears("ns", ["a", "b"]) == await s_buckets.clears("ns", ["a", "b"])
            previous = boundary
        for store in (c_events, c_buckets, s_events, s_buckets):
            await store.close()
    asyncio.run(body())


# -- the review's fixes: TTLs before 2038, per-cell reconciliation, batched aggregates, deletes --------------

YEAR = 365 * 86_400


def _bound_ttls(fake: FakeCassandra) -> list[int]:
    """Every TTL the stores sent: bound per statement, and the slice tables' defaults."""
    ttls = [s.params[-1] for s in fake.log if s.op in ("event.insert", "index.add", "index.add_clear",
                                                       "wslices.add", "wcounters.add", "wrank.add", "wranklists.add")]
    ttls += [s.params[1] for s in fake.log if s.op == "wbucket.write"]
    return ttls + [int(cql.split("default_time_to_live = ")[1].split()[0]) for cql in fake.ddl_log]


def test_a_long_retention_is_capped_before_2038_and_warned_about_once(caplog):
    """19 years of retention: before the cap every write expired after 2038-01-19 and Cassandra (like the fake)
    rejected it, stalling the pipeline."""
    fake = FakeCassandra()
    _, events, _ = fake_stores(fake, delete_after_for=lambda ns: 19.0 * YEAR)
    buckets = fake_bucket_store(fake, retention_for=lambda ns, g: 19.0 * YEAR)
    t = DAY0 + 5 * M
    with caplog.at_level(logging.WARNING, logger="sinks.cassandra.config"):
        for i in range(2):
            assert asyncio.run(events.write_events([ev("ns", BASE + i, f"e{i}", 1)])) == 1
            assert asyncio.run(buckets.write_buckets("ns", [("c", MINUTE, t, i + 1, t + i + 1)])) == [True]
    ttls = _bound_ttls(fake)
    assert len(ttls) >= 8 and all(0 < ttl <= MAX_EXPIRY_S - EXPIRY_MARGIN_S - int(time.time()) + 1 for ttl in ttls)
    cuts = [r.getMessage() for r in caplog.records if "cut to" in r.getMessage()]
    assert len(cuts) == 2 and "'ns' events" in cuts[0] and "'ns' minute buckets" in cuts[1]  # once per subject


def test_the_cap_is_computed_at_write_time():
    """A TTL bound per statement shrinks as 2038 nears: a month before the limit even one year is cut."""
    now = MAX_EXPIRY_S - 30 * 86_400
    fake = FakeCassandra()
    fake.clock_s = lambda: now
    _, events, _ = fake_stores(fake, delete_after_for=lambda ns: 1.0 * YEAR, expiry_cap=ExpiryCap(lambda: now))
    asyncio.run(events.write_events([ev("ns", BASE + 1, "a", 1)]))
    assert set(_bound_ttls(fake)) == {30 * 86_400 - EXPIRY_MARGIN_S}


def test_the_fake_reconciles_each_cell_like_cassandra():
    """Equal timestamps (CASSANDRA-14592): the later expiry wins, then the greater value as unsigned bytes;
    comparing reprs would keep 5 over 10."""
    assert _wins((7, 10), (7, 5)) and not _wins((7, 5), (7, 10))
    assert _wins((7, -1), (7, 10))  # two's complement: a negative bigint's bytes are greater
    assert _wins((7, True), (7, False)) and _wins((7, "b"), (7, "a"))
    assert _wins((7, 1, 200), (7, 9, 100)) and _wins((7, 1), (7, 9, 100))  # later expiry; no TTL never expires
    assert _wins((8, 1, 100), (7, 9, 200))  # the timestamp first


def test_a_reused_identity_is_not_first_write_wins_when_writers_miss_each_other():
    """Two writers of one identity that both read it absent (a race, or a read that missed a partly-landed
    write) both insert it: stored once, counted once, but with the delta Cassandra's tie-break keeps."""
    fake = FakeCassandra()
    stores = [fake_stores(fake)[1] for _ in range(2)]

    async def race(deltas: tuple[int, int], eid: str) -> list[int]:
        return list(await asyncio.gather(*(s.write_events([ev("ns", BASE + 1, eid, d)])
                                           for s, d in zip(stores, deltas, strict=True))))
    assert asyncio.run(race((5, 10), "x")) == [1, 1]  # both reported new
    assert asyncio.run(race((10, -1), "y")) == [1, 1]
    rows = {r[3]: r[5] for r in asyncio.run(stores[0].scan("ns", "c", 0, BASE + S))}
    assert rows == {"x": 10, "y": -1}  # the greater value as bytes, not the first write
    agg = asyncio.run(stores[0].aggregate("ns", "c", 0, BASE + S))
    assert (agg.delta, agg.events) == (9, 2)


def test_aggregate_many_runs_its_windows_concurrently():
    fake, events, _ = fake_stores()
    asyncio.run(events.write_events([ev("ns", BASE + i * S, f"e{i}", 1, counter=f"c{i}") for i in range(12)]))
    fake.log.clear()
    windows = [(f"c{i}", 0, BASE + 20 * S) for i in range(12)]
    aggs = asyncio.run(events.aggregate_many("ns", windows))
    assert [a.delta for a in aggs] == [1] * 12
    ops = [s.op for s in fake.log]
    assert ops.count("index.range") == 12 and "slices.list" not in ops
    assert fake.peaks["event.sum"] > 1  # one partition per window: sequential windows never overlap


def test_counters_forget_a_counter_whose_events_were_all_deleted(tmp_path):
    """The index row of the cutoff's bucket goes too once its partition is empty, as SQLite lists only
    counters with events."""
    from sinks.sqlite.events import SqliteEventStore

    _, events, _ = fake_stores()
    sqlite = SqliteEventStore(tmp_path / "events.sqlite3", lambda ns: contract.PART)
    rows = [ev("ns", BASE + 1, "a", 1, counter="gone"), ev("ns", BASE + 1, "b", 1, counter="kept"),
            ev("ns", BASE + 3, "c", 1, counter="kept")]

    async def body() -> None:
        for store in (events, sqlite):
            await store.write_events(rows)
            for counter in ("gone", "kept"):
                assert await store.delete_rolled_up("ns", counter, BASE + 2, BASE + 30 * S) == 1
            assert await store.counters("ns") == ["kept"]
        await sqlite.close()
    asyncio.run(body())


def test_re_sent_events_shadowed_by_a_delete_are_not_counted_new():
    _, events, _ = fake_stores()
    rows = [ev("ns", BASE + 1, "a", 1), ev("ns", BASE + 5, "b", 1)]
    assert asyncio.run(events.write_events(rows)) == 2
    assert asyncio.run(events.delete_rolled_up("ns", "c", BASE + 2, BASE + 30 * S)) == 1
    assert asyncio.run(events.write_events(rows)) == 0  # "a" is re-inserted but stays deleted; "b" is stored
    assert asyncio.run(events.aggregate("ns", "c", 0, BASE + S)).delta == 1
