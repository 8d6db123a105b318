"""SQLite rollup store: per-counter (count, rollup_ts, last_write_ts) and per-partition persist watermarks.

A separate file from the events: rollup writes and event batches then never wait on each other's
write lock. Every rule that makes concurrent workers safe is a conditional UPSERT, so it holds
across processes without application locks:
* write_rollup applies only with a later rollup_ts (forward-only, invariant 4);
* bump_last_write and set_watermarks keep the max;
* a fenced set_watermarks reads the partitions' claims (``watermark_claims``) in its write transaction, so no claim
  can land between the check and the write; claim_partitions bumps them in one.
A partial index over ``last_write_ts > rollup_ts`` makes the convergence sweep and the operator view's pending
figures (``pending_rollups``: at most ``limit`` index entries and row lookups per namespace) read only stale rows.
The retention bound (``min_rollup_ts``, per namespace every retention interval) reads that index too, and else one
row of ``rollup_bounds``: the namespace's newest rollup_ts, raised by every rollup write in its transaction. So it
costs the namespace's pending counters, never its converged ones (a read of them all held the store's thread for
seconds with millions of counters). A file from before the bounds gets them from its rows once, when opened.
The registry of dimension combinations per base counter lives here too (``combinations``): its primary key
(namespace, counter, combination) serves every listing as one range of the index.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from sinks.keys import IDENTITY_CLAIM, claim_topic, claims_for, new_claim
from sinks.model import PendingRollups, RollupState, later_than_stored, prefix_end
from sinks.sqlite.bulk import RowsStatement, insert_rows, json_rows
from sinks.sqlite.thread import SqliteThread

__all__ = ["SqliteRollupStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS rollups (
    namespace TEXT NOT NULL, counter TEXT NOT NULL, count INTEGER NOT NULL DEFAULT 0,
    rollup_ts INTEGER NOT NULL DEFAULT 0, last_write_ts INTEGER NOT NULL DEFAULT 0,
    pending_since INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (namespace, counter)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS rollups_stale ON rollups (namespace, counter) WHERE last_write_ts > rollup_ts;
CREATE TABLE IF NOT EXISTS rollup_bounds (
    namespace TEXT NOT NULL PRIMARY KEY, newest INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS watermarks (
    topic TEXT NOT NULL, partition INTEGER NOT NULL, mark_us INTEGER NOT NULL,
    PRIMARY KEY (topic, partition)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS watermark_claims (
    topic TEXT NOT NULL, partition INTEGER NOT NULL, claim INTEGER NOT NULL,
    PRIMARY KEY (topic, partition)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS combinations (
    namespace TEXT NOT NULL, counter TEXT NOT NULL, combination TEXT NOT NULL, is_full INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (namespace, counter, combination)) WITHOUT ROWID;
"""
_REGISTER = RowsStatement("INSERT INTO combinations (namespace, counter, combination, is_full) VALUES", "(?, ?, ?, 0)",
                          "ON CONFLICT (namespace, counter, combination) DO NOTHING")
_REGISTER_FULL = RowsStatement("INSERT INTO combinations (namespace, counter, combination, is_full) VALUES",
                               "(?, ?, ?, 1)", "ON CONFLICT (namespace, counter, combination) DO UPDATE "
                               "SET is_full = 1 WHERE combinations.is_full = 0")

_GET = "SELECT count, rollup_ts, last_write_ts FROM rollups WHERE namespace = ? AND counter = ?"
_GET_MANY = RowsStatement("WITH k (namespace, counter) AS (VALUES", "(?, ?)",
                          ") SELECT json_group_array(json_array(namespace, counter, count, rollup_ts, last_write_ts)) "
                          "FROM k JOIN rollups USING (namespace, counter)")
# A counter that turns pending (it had converged: last_write_ts <= rollup_ts) notes when, for the operator view: the
# newest event time of the batch that turned it (what the persist path passes, one per counter; its first event
# may be earlier by up to the namespace's accept window); one still pending keeps it. SET reads the row as it was.
_BUMP = RowsStatement("INSERT INTO rollups (namespace, counter, count, rollup_ts, last_write_ts, pending_since) VALUES",
                      "(?, ?, 0, 0, ?, ?)", "ON CONFLICT (namespace, counter) DO UPDATE SET last_write_ts = "
                      "excluded.last_write_ts, pending_since = CASE WHEN rollups.last_write_ts > rollups.rollup_ts "
                      "THEN rollups.pending_since ELSE excluded.pending_since END "
                      "WHERE excluded.last_write_ts > rollups.last_write_ts")
_ROLLUP_ON_CONFLICT = ("ON CONFLICT (namespace, counter) DO UPDATE SET count = excluded.count, rollup_ts = "
                       "excluded.rollup_ts WHERE excluded.rollup_ts > rollups.rollup_ts")
_ROLLUP = ("INSERT INTO rollups (namespace, counter, count, rollup_ts, last_write_ts) VALUES (?, ?, ?, ?, 0) "
           + _ROLLUP_ON_CONFLICT)
_ROLLUPS = RowsStatement("INSERT INTO rollups (namespace, counter, count, rollup_ts, last_write_ts) VALUES",
                         "(?, ?, ?, ?, 0)", _ROLLUP_ON_CONFLICT)
_ROLLUP_TS = RowsStatement("WITH k (namespace, counter) AS (VALUES", "(?, ?)",
                           ") SELECT json_group_array(json_array(counter, rollup_ts)) FROM k JOIN rollups "
                           "USING (namespace, counter)")
# The newest rollup_ts per namespace: one upsert per rollup write (the call's latest rollup_ts) keeps the max.
_NEWEST = RowsStatement("INSERT INTO rollup_bounds (namespace, newest) VALUES", "(?, ?)",
                        "ON CONFLICT (namespace) DO UPDATE SET newest = excluded.newest "
                        "WHERE excluded.newest > rollup_bounds.newest")
_SEED_BOUNDS = ("INSERT INTO rollup_bounds (namespace, newest) "
                "SELECT namespace, MAX(rollup_ts) FROM rollups GROUP BY namespace")
_DELETE_NAMESPACE = "DELETE FROM rollups WHERE namespace = ?"
_DELETE_COUNTER = "DELETE FROM rollups WHERE namespace = ? AND counter = ? RETURNING rollup_ts"
# A namespace's bound, after its rows went; after a counter's, if that row may have held it (not later than its
# rollup_ts): the rows left may all be older.
_DROP_BOUND = "DELETE FROM rollup_bounds WHERE namespace = ?"
_DROP_BOUND_UPTO = _DROP_BOUND + " AND newest <= ?"
# The retention bound: the oldest rollup_ts of the namespace's pending counters (a range of the partial index and a
# row lookup each), else its newest rollup_ts (a row of rollup_bounds), else 0. One statement: one snapshot, so a
# counter turning pending cannot fall between the two reads.
_MIN_ROLLUP_TS = """
SELECT COALESCE(
    (SELECT MIN(rollup_ts) FROM rollups INDEXED BY rollups_stale WHERE namespace = ? AND last_write_ts > rollup_ts),
    (SELECT newest FROM rollup_bounds WHERE namespace = ?), 0)
"""
# The bound is raised by every rollup write (pending counters' too): one row, however many counters are pending.
_NEWEST_ROLLUP_TS = "SELECT COALESCE((SELECT newest FROM rollup_bounds WHERE namespace = ?), 0)"
_STALE_FIRST = """
SELECT namespace, counter FROM rollups INDEXED BY rollups_stale
WHERE last_write_ts > rollup_ts ORDER BY namespace, counter LIMIT ?
"""
_STALE_AFTER = """
SELECT namespace, counter FROM rollups INDEXED BY rollups_stale
WHERE last_write_ts > rollup_ts AND (namespace, counter) > (?, ?)
ORDER BY namespace, counter LIMIT ?
"""
# A namespace's pending counters, up to a limit, and where the oldest one's un-rolled-up work starts: a range of the
# partial index and a row lookup each, never the converged rows. A counter's work starts when it turned pending
# (pending_since), or at its rollup_ts once a rollup passed that (a counter written without pause never converges);
# a row from before the column (0) falls back on RollupState.pending_since, its rollup_ts.
_PENDING = """
SELECT COUNT(*), MIN(CASE WHEN pending_since > 0 THEN MAX(pending_since, rollup_ts)
                          WHEN rollup_ts > 0 THEN rollup_ts ELSE last_write_ts END) FROM (
    SELECT rollup_ts, last_write_ts, pending_since FROM rollups INDEXED BY rollups_stale
    WHERE namespace = ? AND last_write_ts > rollup_ts LIMIT ?)
"""
_MARK = RowsStatement("INSERT INTO watermarks (topic, partition, mark_us) VALUES", "(?, ?, ?)",
                      "ON CONFLICT (topic, partition) DO UPDATE SET mark_us = excluded.mark_us "
                      "WHERE excluded.mark_us > watermarks.mark_us")
# A claim is a random 63-bit id, not the previous one + 1: ids that restarted (a restored file) never match a claim
# a stale worker still holds. The last claim written is the latest: the write transactions are serial.
_CLAIM = RowsStatement("INSERT INTO watermark_claims (topic, partition, claim) VALUES", "(?, ?, ?)",
                       "ON CONFLICT (topic, partition) DO UPDATE SET claim = excluded.claim")


class SqliteRollupStore:
    """The embedded rollup store (one file, WAL); safe for several processes at once."""

    def __init__(self, path: str | Path, *, lock_wait_s: float | None = None) -> None:
        self._db = SqliteThread(path, "sqlite-rollups", self._setup, lock_wait_s=lock_wait_s)
        self._sweep_after: tuple[str, str] | None = None  # stale() resumes after it (thread-confined)
        self._identity: str | None = None

    @property
    def path(self) -> Path:
        return self._db.path

    async def get(self, namespace: str, counter: str) -> RollupState | None:
        return await self._db.run(self._get, namespace, counter)

    async def get_many(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], RollupState]:
        if not keys:
            return {}
        return await self._db.run(lambda conn: self._db.read(conn, self._get_many, keys))

    async def bump_last_write(self, items: Sequence[tuple[str, str, int]]) -> None:
        newest: dict[tuple[str, str], int] = {}
        for namespace, counter, ts in items:  # one row per counter per batch
            key = (namespace, counter)
            if ts > newest.get(key, -1):
                newest[key] = ts
        if newest:
            params = [(ns, c, ts, ts) for (ns, c), ts in newest.items()]
            await self._db.run(lambda conn: self._db.write(conn, lambda c: insert_rows(c, _BUMP, params)))

    async def write_rollup(self, namespace: str, counter: str, count: int, rollup_ts: int) -> bool:
        def apply(conn: sqlite3.Connection) -> bool:
            applied = conn.execute(_ROLLUP, (namespace, counter, count, rollup_ts)).rowcount > 0
            insert_rows(conn, _NEWEST, [(namespace, rollup_ts)])  # applied or not, the row now holds rollup_ts or later
            return applied
        return await self._db.run(lambda conn: self._db.write(conn, apply))

    async def write_rollups(self, namespace: str, items: Sequence[tuple[str, int, int]]) -> list[bool]:
        def apply(conn: sqlite3.Connection) -> list[bool]:
            # Which rows apply, from the stored rollup_ts read in this write transaction (so exact): one step,
            # where RETURNING would hand the GIL over once per row applied.
            counters = dict.fromkeys(c for c, _n, _t in items)
            stored = dict(json_rows(conn, _ROLLUP_TS, [(namespace, c) for c in counters]))
            applied = set(later_than_stored([(c, ts) for c, _n, ts in items], stored))
            insert_rows(conn, _ROLLUPS, [(namespace, c, n, ts) for c, n, ts in items])
            insert_rows(conn, _NEWEST, [(namespace, max(ts for _c, _n, ts in items))])
            return [i in applied for i in range(len(items))]
        if not items:
            return []
        return await self._db.run(lambda conn: self._db.write(conn, apply))

    async def stale(self, limit: int = 1000) -> list[tuple[str, str]]:
        return await self._db.run(self._stale, limit)

    async def min_rollup_ts(self, namespace: str) -> int:
        """Every stored event of the namespace with event_time <= the result is rolled up.

        Counters with pending events (last_write_ts > rollup_ts) bound it by their rollup_ts.
        Converged counters do not hold it back, however old their rollup: all their events are
        counted, and a rollup to B certifies nothing <= B can still arrive, so with none pending
        the bound is the newest rollup_ts. 0 when nothing was rolled up.

        Cost: the namespace's pending counters (the partial index and a row each) and one row of
        ``rollup_bounds``, never its converged counters. That newest rollup_ts is exact, except that it can be
        earlier than the newest of the rows (conservative: retention keeps more) after a ``delete`` took the
        row(s) holding it (0 until the namespace's next rollup) or after a process of an older version wrote
        rollups without raising it. A delete by an older version leaves it as it was, which can make it later than
        the rows left: hence infra/README.md's rule, no deletes with the old version once the new one has opened
        the file.
        """
        (bound,) = await self._db.run(lambda conn: conn.execute(_MIN_ROLLUP_TS, (namespace, namespace)).fetchone())
        return int(bound)

    async def newest_rollup_ts(self, namespace: str) -> int:
        (newest,) = await self._db.run(lambda conn: conn.execute(_NEWEST_ROLLUP_TS, (namespace,)).fetchone())
        return int(newest)

    async def pending_rollups(self, namespaces: Sequence[str], limit: int = 10_000) -> dict[str, PendingRollups]:
        def query(conn: sqlite3.Connection) -> dict[str, PendingRollups]:
            cap, out = max(0, limit), {}
            for namespace in dict.fromkeys(namespaces):
                found, oldest = conn.execute(_PENDING, (namespace, cap + 1)).fetchone()  # one more: truncated?
                out[namespace] = PendingRollups(min(found, cap), int(oldest or 0), found > cap)
            return out
        return await self._db.run(lambda conn: self._db.read(conn, query))

    async def set_watermarks(self, topic: str, marks: Mapping[int, int], *,
                             claims: Mapping[int, int] | None = None) -> set[int]:
        if not marks:
            return set()
        params = [(topic, int(p), int(m)) for p, m in marks.items()]
        if claims is None:
            await self._db.run(lambda conn: self._db.write(conn, lambda c: insert_rows(c, _MARK, params)))
            return set()
        fence = (claim_topic(topic), claims_for(marks, claims))
        return await self._db.run(lambda conn: self._db.write(conn, _set_claimed, params, *fence))

    async def claim_partitions(self, topic: str, partitions: Collection[int]) -> dict[int, int]:
        params = [(topic, int(p)) for p in sorted(set(partitions))]
        if not params:
            return {}
        claims = {p: new_claim() for _topic, p in params}
        rows = [(topic, p, claims[p]) for topic, p in params]
        await self._db.run(lambda conn: self._db.write(conn, lambda c: insert_rows(c, _CLAIM, rows)))
        return claims

    async def watermarks(self, topic: str) -> dict[int, int]:
        return await self._db.run(lambda conn: dict(conn.execute(
            "SELECT partition, mark_us FROM watermarks WHERE topic = ?", (topic,)).fetchall()))

    async def identity(self) -> str:
        if self._identity is None:
            self._identity = await self._db.run(lambda conn: self._db.write(conn, _identity))
        return self._identity

    async def new_identity(self) -> str:
        topic, partition = IDENTITY_CLAIM
        claims = await self.claim_partitions(topic, [partition])  # a claim replaces the latest: the same write
        self._identity = f"{claims[partition]:016x}"
        return self._identity

    async def delete(self, namespace: str, counter: str | None = None) -> int:
        return await self._db.run(lambda conn: self._db.write(conn, _delete, namespace, counter))

    async def register_combinations(self, namespace: str, items: Sequence[tuple[str, str]], *,
                                    full: bool = False) -> None:
        if items:
            params = [(namespace, counter, combination) for counter, combination in items]
            insert = _REGISTER_FULL if full else _REGISTER
            await self._db.run(lambda conn: self._db.write(conn, lambda c: insert_rows(c, insert, params)))

    async def combinations(self, namespace: str, counter: str, *, prefix: str = "", after: str | None = None,
                           limit: int = 1000, full_only: bool = False) -> list[str]:
        if limit <= 0:
            return []
        where = ["namespace = ?", "counter = ?"]
        args: list[object] = [namespace, counter]
        if after is not None and after >= prefix:
            where.append("combination > ?")
            args.append(after)
        elif prefix:
            where.append("combination >= ?")
            args.append(prefix)
        end = prefix_end(prefix) if prefix else None
        if end is not None:
            where.append("combination < ?")
            args.append(end)
        if full_only:
            where.append("is_full = 1")
        sql = f"SELECT combination FROM combinations WHERE {' AND '.join(where)} ORDER BY combination LIMIT ?"
        args.append(limit)
        rows = await self._db.run(lambda conn: conn.execute(sql, args).fetchall())
        return [r[0] for r in rows]

    async def close(self) -> None:
        await self._db.close()

    # -- thread side --------------------------------------------------------------------------

    def _setup(self, conn: sqlite3.Connection) -> None:
        found = {name for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN ('rollups', 'rollup_bounds')")}
        for stmt in _SCHEMA.split(";"):
            if stmt.strip():
                conn.execute(stmt)
        if "pending_since" not in {row[1] for row in conn.execute("PRAGMA table_info(rollups)")}:  # an older file
            conn.execute("ALTER TABLE rollups ADD COLUMN pending_since INTEGER NOT NULL DEFAULT 0")
        if found != {"rollups", "rollup_bounds"}:  # inside setup's write transaction: one process seeds them
            _seed_bounds(conn)

    def _get(self, conn: sqlite3.Connection, namespace: str, counter: str) -> RollupState | None:
        row = conn.execute(_GET, (namespace, counter)).fetchone()
        return RollupState(*row) if row else None

    def _get_many(self, conn: sqlite3.Connection,
                  keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], RollupState]:
        return {(ns, c): RollupState(n, ts, last) for ns, c, n, ts, last in json_rows(conn, _GET_MANY, keys)}

    def _stale(self, conn: sqlite3.Connection, limit: int) -> list[tuple[str, str]]:
        """Round-robin over stale counters: continue after the last one returned, wrapping once."""
        if self._sweep_after is None:
            found = conn.execute(_STALE_FIRST, (limit,)).fetchall()
        else:
            found = conn.execute(_STALE_AFTER, (*self._sweep_after, limit)).fetchall()
            if len(found) < limit:
                seen = set(found)
                found += [k for k in conn.execute(_STALE_FIRST, (limit - len(found),)).fetchall()
                          if k not in seen]
        result = [(ns, c) for ns, c in found]
        self._sweep_after = result[-1] if len(result) == limit else None
        return result


def _set_claimed(conn: sqlite3.Connection, params: list[tuple[str, int, int]], owner: str,
                 claims: dict[int, int]) -> set[int]:
    """A fenced set_watermarks, inside its write transaction: the marks of the partitions whose latest claim is still
    the writer's; returns the others (refused)."""
    stored = dict(conn.execute("SELECT partition, claim FROM watermark_claims WHERE topic = ?", (owner,)).fetchall())
    refused = {p for p, claim in claims.items() if stored.get(p) != claim}
    insert_rows(conn, _MARK, [row for row in params if row[1] not in refused])
    return refused


def _seed_bounds(conn: sqlite3.Connection) -> None:
    """The newest rollup_ts per namespace from the rows, once: for a file from before ``rollup_bounds`` (so an upgrade
    keeps the retention bound exact), and for one whose ``rollups`` table was lost (bounds it no longer holds would
    let retention drop events no rollup counts). One read of every row, at open only."""
    conn.execute("DELETE FROM rollup_bounds")
    conn.execute(_SEED_BOUNDS)


def _delete(conn: sqlite3.Connection, namespace: str, counter: str | None) -> int:
    """``delete``, inside its write transaction: the rows dropped. The namespace's bound goes too when a dropped row
    may have held it (the rows left may all be older): 0 until the namespace's next rollup write, which holds
    retention back where finding the newest of the rows left would read them all."""
    if counter is None:
        dropped = conn.execute(_DELETE_NAMESPACE, (namespace,)).rowcount
        conn.execute(_DROP_BOUND, (namespace,))
        return dropped
    found = conn.execute(_DELETE_COUNTER, (namespace, counter)).fetchall()
    for (rollup_ts,) in found:
        conn.execute(_DROP_BOUND_UPTO, (namespace, rollup_ts))
    return len(found)


def _identity(conn: sqlite3.Connection) -> str:
    """`RollupStore.identity`: the identity claim, taken if nobody has (in a write transaction: one process does)."""
    conn.execute("INSERT INTO watermark_claims (topic, partition, claim) VALUES (?, ?, ?) "
                 "ON CONFLICT (topic, partition) DO NOTHING", (*IDENTITY_CLAIM, new_claim()))
    (claim,) = conn.execute("SELECT claim FROM watermark_claims WHERE topic = ? AND partition = ?",
                            IDENTITY_CLAIM).fetchone()
    return f"{int(claim):016x}"
