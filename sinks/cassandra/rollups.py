"""Cassandra rollup store: per-counter ``(count, rollup_ts, last_write_ts)``, pending markers, watermarks.

Forward-only without reads or locks, by write timestamps (Cassandra keeps, per cell, the value
written with the highest timestamp):
* ``last_write_ts`` is written ``USING TIMESTAMP`` = the event time: the cell holds the max.
* ``(rollup_count, rollup_ts)`` are written ``USING TIMESTAMP`` = the rollup boundary: a rollup
  with a later boundary always replaces an earlier one, in any order, on every replica (invariant 4).
  The two columns are independent cells, so bumps and rollups never overwrite each other.
* watermarks are written ``USING TIMESTAMP`` = the mark: never backwards.

Claims (``claim_partitions``) and the marks published under them (``set_watermarks(..., claims=)``) fence a worker
that lost its partitions while it stalled: a publication must apply only while the writer's claim is the
partition's latest, atomically with the check, which takes a lightweight transaction (Paxos: a claim and a
publication on one partition are linearized, so a publication either lands before the claim, where the new owner's
later reads see it, or meets the new claim and is refused). So each mutations partition has its own Cassandra
partition of ``watermark_claims`` (key ``(topic, kafka_partition)``) holding its latest claim and, in a map, the
marks of every key published under claims; they never meet the ``USING TIMESTAMP`` cells of ``watermarks`` (a
conditional write cannot set its timestamp), and ``watermarks`` reads both tables, the greater mark winning.
* a claim is a compare-and-set to a new random 63-bit id (``sinks.keys.new_claim``): ``claim = new IF claim =
  latest`` (``IF claim = null`` for the first), retried on a race, so the later of two claimants wins and claims
  never repeat, even after the table was lost (with ``latest + 1`` from 1, a stale worker's claim could equal the
  next owner's and its publications land);
* a mark is raised by ``IF claim = mine AND marks[key] < mark``; when that is not applied a serial read says why:
  another claim (refused), a mark already as high (nothing to do), or none yet (``IF ... marks[key] = null``).
Why a Cassandra partition per Kafka partition: Paxos serializes the transactions of one Cassandra partition, and
every publication is one. Keyed by the topic alone, a topic's every claim and mark would share one partition: every
worker's publications (3 keys x owned partitions, up to 4 times a second) would contend in one Paxos instance, which
under load ends in CAS write timeouts, a failing ``load`` retried under the persist batch lock and revokes held past
the rebalance timeout. So a Kafka partition's transactions meet only its owner's own (sent one key after another)
and, at a handover, a claimant's.
Costs: a claim is a serial read and a transaction per partition (more only on a race), with one plain write listing
the partitions; a publication is one transaction per partition whose mark rose, per key; none when nothing rose.

Reading a topic's claimed marks then takes the list of its partitions: ``watermark_claimed_partitions`` holds, per
topic, a ``set<int>`` of every partition ever claimed, added by a plain write (a table of its own: no cell written
both with and without a transaction) that completes before ``claim_partitions`` returns, so before any mark is
published under the claim. ``watermarks`` must never leave out a partition that has marks (a floor missing at a
``load`` is the handover bug the floors fix; a missing watermark holds rollups back), so every call reads the list;
to keep that one round trip, it reads at the same time the partitions it already knows (the last list it read and
the partitions this instance claimed), and a second round reads only partitions the list newly names. Per call:
the ``watermarks`` partition, the list, and one single-partition read per claimed Kafka partition, fanned out
concurrently (2 + N reads, N = the topic's partitions ever claimed), in one round trip once the list is known.
Publications are about one a second per partition and key, claims one per partition per rebalance: the
transactions' extra round trips are off the persist path. A timed-out transaction is not retried by the driver
(its outcome is unknown: ``IdempotentRetryPolicy``); the error reaches the caller, which retries whole.

``write_rollup`` must say whether it applied. Without a lightweight transaction that cannot be
known atomically, so: (1) read the row and refuse a boundary that is not later (this also covers
an *equal* boundary, where timestamps tie and Cassandra would keep the greater value instead of
the first); (2) write; (3) read back: applied iff the stored rollup is ours. Racing workers that
pass (1) together both write; the later boundary wins by timestamp, and with the same boundary both
computed the same count (the window is immutable), so any outcome is exact. ``False`` may also
mean "applied, then overtaken", which callers handle the same way (re-read, re-signal).
Reads use the configured consistency (LOCAL_QUORUM): the read-back sees the write.

Convergence sweep (``stale``): ``rollup_pending ((shard), namespace, counter_name)`` holds a marker
per counter whose ``last_write_ts > rollup_ts``, kept exact by timestamps, not reads:
* ``bump_last_write`` inserts the marker ``USING TIMESTAMP`` = event time;
* once a rollup reaches ``last_write_ts`` the marker is deleted ``USING TIMESTAMP`` = rollup_ts:
  the tombstone shadows markers written for events up to the rollup, never a later one.
So a marker exists iff some bumped event time is later than the newest rollup that cleared it.
``stale`` reads marker partitions round-robin (cursor = last key returned), checks each candidate's
row and returns the truly stale ones; markers it finds converged are deleted (self-healing after a
crash between a rollup and its marker delete). Cost: markers of *pending* counters only, never a
scan of all counters. Tombstones: one per counter per catch-up (not per rollup: the delete is only
sent when a rollup turns a stale counter converged); ``gc_grace_seconds`` is short on that table
because a resurrected marker is harmless (one extra signal, then deleted again).

``pending_rollups`` (the operator view, every few seconds): per namespace, markers shard after shard until ``limit``
of them are read (a page per shard, asking for what is left of the limit and one more), then their rows in one
fan-out: at most ``limit`` rows and ``limit + shards`` markers read per namespace, however many counters it holds or
has pending (namespaces are read concurrently). A marker whose row converged (a crash between a rollup and its
marker delete) is not counted; it is left for the sweep to delete: the view only reads, and leaves the sweep's
cursor alone.

``min_rollup_ts``: with pending markers of the namespace, the minimum of their rollup_ts; without,
the newest rollup that converged a counter (``rollup_bounds``, written ``USING TIMESTAMP`` = its
value by the same step that deletes a marker). That can trail SQLite's "newest rollup_ts of any
row" (it ignores rollups of counters that were never pending): retention is then conservative.

``register_combinations`` / ``combinations``: the dimension combinations of a base counter, one partition per
counter clustered by name; ``is_full`` is written only by full registrations, so it never goes back to unset.
``full_only`` filters client-side, page by page (the partition is bounded by max_combinations' subsets).

``delete``: row and marker tombstones are written ``USING TIMESTAMP T = max(now, stored timestamps)``;
a counter deleted at time T can only be rolled up again with boundaries after T (which the rollup
boundary reaches within about accept_limit), and events with ``event_time <= T`` persisted after the
delete no longer bump it or mark it pending: the tombstone shadows them. Unlike SQLite, where the next
bump recreates the row; until an event after T or a read signals the counter, the sweep does not see it
and ``min_rollup_ts`` does not hold retention for it (infra/README.md, Retention). A namespace-wide
delete scans the rollups table (paged, client-side filter): an ops action, not a hot path.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Mapping, Sequence

from sinks.cassandra.cql import RollupCql, Stmt, pending_shard
from sinks.cassandra.session import Executor
from sinks.keys import IDENTITY_CLAIM, claim_topic, claims_for, new_claim
from sinks.model import PendingRollups, RollupState, prefix_end

__all__ = ["CassandraRollupStore"]


LWT_ATTEMPTS = 8  # compare-and-set rounds of one claim or mark before giving up (each lost only to a new claim)


def _now_us() -> int:
    return time.time_ns() // 1000


class CassandraRollupStore:
    """The production rollup store (shares its executor with the event store)."""

    def __init__(self, executor: Executor, *, pending_shards: int = 16,
                 clock_us: Callable[[], int] = _now_us) -> None:
        self._x = executor
        self._cql = RollupCql(executor.keyspace)
        self._shards = pending_shards
        self._clock_us = clock_us
        self._sweep_after: tuple[int, str, str] | None = None  # stale() resumes after it
        # claim topic -> its partitions known to have been claimed (listed, or claimed here): what `watermarks` reads
        # while it reads the list
        self._claimed_parts: dict[str, set[int]] = {}
        self._identity: str | None = None

    def _shard(self, namespace: str, counter: str) -> int:
        return pending_shard(namespace, counter, self._shards)

    @staticmethod
    def _state(rows: list[tuple] | None) -> RollupState | None:
        if not rows:
            return None
        count, rollup_ts, last_write = rows[0]
        return RollupState(int(count or 0), int(rollup_ts or 0), int(last_write or 0))

    # -- RollupStore ----------------------------------------------------------------------------

    async def get(self, namespace: str, counter: str) -> RollupState | None:
        return self._state(await self._x.run(self._cql.get(namespace, counter)))

    async def get_many(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], RollupState]:
        unique = list(dict.fromkeys(keys))
        results = await self._x.run_all([self._cql.get(ns, c) for ns, c in unique])
        out: dict[tuple[str, str], RollupState] = {}
        for key, rows in zip(unique, results, strict=True):
            state = self._state(rows)
            if state is not None:
                out[key] = state
        return out

    async def bump_last_write(self, items: Sequence[tuple[str, str, int]]) -> None:
        newest: dict[tuple[str, str], int] = {}
        for namespace, counter, ts in items:  # one write per counter per batch
            key = (namespace, counter)
            if ts > newest.get(key, -(2**63)):
                newest[key] = ts
        stmts: list[Stmt] = []
        for (namespace, counter), ts in newest.items():
            stmts.append(self._cql.mark_pending(self._shard(namespace, counter), namespace, counter, ts))
            stmts.append(self._cql.bump(namespace, counter, ts))
        await self._x.run_all(stmts)

    async def write_rollup(self, namespace: str, counter: str, count: int, rollup_ts: int) -> bool:
        before = await self.get(namespace, counter)
        if before is not None and before.rollup_ts >= rollup_ts:
            return False  # not later: refused without writing (equal boundaries would tie)
        await self._x.run(self._cql.write(namespace, counter, count, rollup_ts))
        after = await self.get(namespace, counter)
        if after is None:
            return False  # shadowed by a later delete
        if before is not None and before.stale and not after.stale:
            await self._settle(self._shard(namespace, counter), namespace, counter, after.rollup_ts)
        return after.rollup_ts == rollup_ts and after.count == count

    async def write_rollups(self, namespace: str, items: Sequence[tuple[str, int, int]]) -> list[bool]:
        """Single writes (each a read, a timestamped write and a read), up to the session's concurrency at once."""
        slots = asyncio.Semaphore(max(1, self._x.concurrency))

        async def one(counter: str, count: int, rollup_ts: int) -> bool:
            async with slots:
                return await self.write_rollup(namespace, counter, count, rollup_ts)
        return list(await asyncio.gather(*(one(c, n, ts) for c, n, ts in items)))

    async def stale(self, limit: int = 1000) -> list[tuple[str, str]]:
        """Round-robin over pending markers: continue after the last key returned, wrapping once."""
        if limit <= 0:
            return []
        start = self._sweep_after
        shard = start[0] if start else 0
        after: tuple[str, str] | None = (start[1], start[2]) if start else None
        rounds = self._shards + (1 if start else 0)  # a mid-shard start revisits that shard's head
        result: list[tuple[str, str]] = []
        last: tuple[int, str, str] | None = None
        seen: set[tuple[str, str]] = set()
        visited = 0
        while len(result) < limit and visited < rounds:
            want = limit - len(result)
            stmt = (self._cql.pending_after(shard, after[0], after[1], want) if after
                    else self._cql.pending_first(shard, want))
            page = [(str(ns), str(c)) for ns, c in await self._x.run(stmt)]
            fresh = [k for k in page if k not in seen]
            states = await self.get_many(fresh) if fresh else {}
            settle: list[Stmt] = []
            for key in fresh:
                seen.add(key)
                state = states.get(key)
                if state is None or state.stale:
                    result.append(key)
                    last = (shard, key[0], key[1])
                    if len(result) >= limit:
                        break
                else:  # converged but still marked (a crash between rollup and marker delete)
                    settle += self._settle_stmts(shard, key[0], key[1], state.rollup_ts)
            if settle:
                await self._x.run_all(settle)
            if len(page) == want and len(result) < limit:
                after = page[-1]  # more may follow in this shard
                continue
            shard, after, visited = (shard + 1) % self._shards, None, visited + 1
        self._sweep_after = last if len(result) >= limit else None
        return result

    async def min_rollup_ts(self, namespace: str) -> int:
        pending = await self._marked_states(namespace)
        pending_ts = [s.rollup_ts if s is not None else 0 for s in pending if s is None or s.stale]
        if pending_ts:
            return min(pending_ts)
        return await self._bound(namespace)

    async def _marked_states(self, namespace: str) -> list[RollupState | None]:
        """The rows of the namespace's counters marked pending (None: a marker without its row yet)."""
        pages = await self._x.run_all([self._cql.pending_of_namespace(s, namespace) for s in range(self._shards)])
        keys = [(namespace, str(row[0])) for page in pages for row in (page or ())]
        states = await self.get_many(keys) if keys else {}
        return [states.get(k) for k in keys]

    async def _bound(self, namespace: str) -> int:
        """The newest rollup that converged a counter of the namespace (`rollup_bounds`), 0 if none."""
        rows = await self._x.run(self._cql.get_bounds(namespace))
        return max((int(r[0] or 0) for r in rows), default=0)

    async def newest_rollup_ts(self, namespace: str) -> int:
        """The pending counters' rows and the bounds (the newest rollup that converged a counter). A converged
        counter rolled up again without a write (a read's signal, a recount) can be later than both: SQLite raises its
        bound at every rollup write, this store only when a counter converges, so the admission floor it gives can
        trail such a counter's rollup (sinks.rolled; the issue's note)."""
        marked = await self._marked_states(namespace)
        return max([*(s.rollup_ts for s in marked if s is not None), await self._bound(namespace)])

    async def pending_rollups(self, namespaces: Sequence[str], limit: int = 10_000) -> dict[str, PendingRollups]:
        names, cap = list(dict.fromkeys(namespaces)), max(0, limit)
        marked = await asyncio.gather(*(self._marked(ns, cap) for ns in names))
        states = await self.get_many([(ns, c) for ns, (counters, _) in zip(names, marked, strict=True)
                                      for c in counters])
        out: dict[str, PendingRollups] = {}
        for ns, (counters, more) in zip(names, marked, strict=True):
            pending = [states.get((ns, c)) for c in counters]
            pending = [st for st in pending if st is None or st.stale]  # None: a marker without its row yet
            oldest = min((st.pending_since for st in pending if st is not None), default=0)
            out[ns] = PendingRollups(len(pending), oldest, more)
        return out

    async def set_watermarks(self, topic: str, marks: Mapping[int, int], *,
                             claims: Mapping[int, int] | None = None) -> set[int]:
        if not marks:
            return set()
        if claims is None:
            await self._x.run_all([self._cql.set_mark(topic, int(p), int(m)) for p, m in marks.items()])
            return set()
        owner, fence = claim_topic(topic), claims_for(marks, claims)
        refused = await asyncio.gather(*(self._set_claimed(owner, int(p), topic, int(m), fence[int(p)])
                                         for p, m in marks.items()))
        return {int(p) for p, no in zip(marks, refused, strict=True) if no}

    async def claim_partitions(self, topic: str, partitions: Collection[int]) -> dict[int, int]:
        ordered = sorted({int(p) for p in partitions})
        if not ordered:
            return {}
        # listed (at the same time) before this returns, so before any mark is published under these claims
        listing = asyncio.ensure_future(self._x.run(self._cql.list_claimed(topic, ordered)))
        try:
            claims = await asyncio.gather(*(self._claim(topic, p) for p in ordered))
        finally:
            await listing
        self._claimed_parts.setdefault(topic, set()).update(ordered)
        return dict(zip(ordered, claims, strict=True))

    async def watermarks(self, topic: str) -> dict[int, int]:
        owner = claim_topic(topic)
        known = sorted(self._claimed_parts.get(owner, ()))
        plain, listing, *rows = await self._x.run_all([self._cql.get_marks(topic), self._cql.get_claimed(owner),
                                                       *(self._cql.get_claimed_marks(owner, p) for p in known)])
        listed = {int(p) for row in listing or () for p in (row[0] or ())}
        new = sorted(listed.difference(known))
        if new:  # claimed since this instance last read the list: read them too, before answering
            rows += await self._x.run_all([self._cql.get_claimed_marks(owner, p) for p in new])
        self._claimed_parts.setdefault(owner, set()).update(listed)
        out = {int(p): int(m) for p, m in plain or () if m is not None}
        for p, found in zip([*known, *new], rows, strict=True):
            mark = (found[0][0] or {}).get(topic) if found else None
            if mark is not None:
                out[p] = max(int(mark), out.get(p, int(mark)))
        return out

    async def identity(self) -> str:
        if self._identity is None:
            for _ in range(LWT_ATTEMPTS):
                claim, _marks = await self._claimed(*IDENTITY_CLAIM)
                if claim is not None:
                    self._identity = f"{claim:016x}"
                    break
                await self._applied(self._cql.first_claim(*IDENTITY_CLAIM, new_claim()))  # first writer wins
            else:
                raise RuntimeError(f"could not read the store's identity: {LWT_ATTEMPTS} attempts")
        return self._identity

    async def new_identity(self) -> str:
        self._identity = f"{await self._claim(*IDENTITY_CLAIM):016x}"  # compare-and-set, as a partition's claim
        return self._identity

    async def delete(self, namespace: str, counter: str | None = None) -> int:
        now = self._clock_us()
        stmts: list[Stmt] = []
        if counter is not None:
            state = await self.get(namespace, counter)
            rows = [(counter, state.rollup_ts, state.last_write_ts)] if state is not None else []
            orphans: list[str] = []
        else:
            rows = [(str(c), int(rts or 0), int(lw or 0))
                    for ns, c, rts, lw in await self._x.run(self._cql.scan()) if ns == namespace]
            pages = await self._x.run_all([self._cql.pending_of_namespace(s, namespace)
                                           for s in range(self._shards)])
            known = {c for c, _, _ in rows}
            orphans = [str(r[0]) for page in pages for r in (page or ()) if str(r[0]) not in known]
            bounds = await self._x.run(self._cql.get_bounds(namespace))
            stmts.append(self._cql.delete_bounds(namespace, max([now, *(int(b[0] or 0) for b in bounds)])))
        for c, rollup_ts, last_write in rows:
            ts = max(now, rollup_ts, last_write)
            stmts.append(self._cql.delete(namespace, c, ts))
            stmts.append(self._cql.clear_pending(self._shard(namespace, c), namespace, c, ts))
        for c in orphans:
            stmts.append(self._cql.clear_pending(self._shard(namespace, c), namespace, c, now))
        await self._x.run_all(stmts)
        return len(rows)

    async def register_combinations(self, namespace: str, items: Sequence[tuple[str, str]], *,
                                    full: bool = False) -> None:
        await self._x.run_all([self._cql.register_combination(namespace, counter, combination, full=full)
                               for counter, combination in dict.fromkeys(items)])

    async def combinations(self, namespace: str, counter: str, *, prefix: str = "", after: str | None = None,
                           limit: int = 1000, full_only: bool = False) -> list[str]:
        if limit <= 0:
            return []
        lower, inclusive = (after, False) if after is not None and after >= prefix else (prefix or None, True)
        upper = prefix_end(prefix) if prefix else None
        out: list[str] = []
        while True:
            want = limit - len(out)
            page = await self._x.run(self._cql.combinations_page(namespace, counter, lower=lower,
                                                                 inclusive=inclusive, upper=upper, limit=want))
            out.extend(str(name) for name, is_full in page if is_full or not full_only)
            if len(page) < want or len(out) >= limit:
                return out
            lower, inclusive = str(page[-1][0]), False

    async def close(self) -> None:
        await self._x.close()

    # -- internals ------------------------------------------------------------------------------

    async def _applied(self, stmt: Stmt) -> bool:
        """Whether a lightweight transaction applied (the ``[applied]`` column leads its one row)."""
        rows = await self._x.run(stmt)
        return bool(rows and rows[0][0])

    async def _claimed(self, topic: str, partition: int) -> tuple[int | None, dict[str, int]]:
        """The partition's latest claim (None: never claimed) and its marks published under claims, read at the
        serial level: a transaction in flight is settled first."""
        rows = await self._x.run(self._cql.get_claim(topic, partition))
        if not rows:
            return None, {}
        claim, marks = rows[0]
        return (None if claim is None else int(claim)), {str(k): int(v) for k, v in (marks or {}).items()}

    async def _claim(self, topic: str, partition: int) -> int:
        """A new claim in place of the partition's latest, by compare-and-set: a race with another claimant
        re-reads."""
        for _ in range(LWT_ATTEMPTS):
            latest, _marks = await self._claimed(topic, partition)
            claim = new_claim()
            stmt = (self._cql.first_claim(topic, partition, claim) if latest is None
                    else self._cql.next_claim(topic, partition, claim, latest))
            if await self._applied(stmt):
                return claim
        raise RuntimeError(f"could not claim partition {partition} of {topic!r}: {LWT_ATTEMPTS} claims raced it")

    async def _set_claimed(self, owner: str, partition: int, key: str, mark_us: int, claim: int) -> bool:
        """Raise the partition's mark of ``key`` under ``claim``; whether refused (a later claim holds it)."""
        stmt = self._cql.raise_claimed_mark(owner, partition, key, mark_us, claim)
        for _ in range(LWT_ATTEMPTS):
            if await self._applied(stmt):
                return False
            latest, marks = await self._claimed(owner, partition)
            if latest != claim:
                return True
            current = marks.get(key)
            if current is not None and current >= mark_us:
                return False  # never backwards
            stmt = (self._cql.first_claimed_mark(owner, partition, key, mark_us, claim) if current is None
                    else self._cql.raise_claimed_mark(owner, partition, key, mark_us, claim))
        raise RuntimeError(f"could not publish {key!r}[{partition}] under claim {claim}: it kept changing")

    async def _marked(self, namespace: str, cap: int) -> tuple[list[str], bool]:
        """Up to ``cap`` of the namespace's marked counters, shard after shard (each page asks for what the cap
        leaves, and one more), and whether more are marked."""
        counters: list[str] = []
        for shard in range(self._shards):
            page = await self._x.run(self._cql.pending_of_namespace(shard, namespace, cap - len(counters) + 1))
            counters += [str(row[0]) for row in page]
            if len(counters) > cap:
                return counters[:cap], True
        return counters, False

    def _settle_stmts(self, shard: int, namespace: str, counter: str, rollup_ts: int) -> list[Stmt]:
        return [self._cql.clear_pending(shard, namespace, counter, rollup_ts),
                self._cql.set_bound(namespace, shard, rollup_ts)]

    async def _settle(self, shard: int, namespace: str, counter: str, rollup_ts: int) -> None:
        """A counter converged at ``rollup_ts``: drop its marker (unless re-marked by a later event)
        and record the rollup as the namespace's newest converged one."""
        await self._x.run_all(self._settle_stmts(shard, namespace, counter, rollup_ts))
