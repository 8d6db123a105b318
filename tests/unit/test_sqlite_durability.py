"""Every SQLite store commits durably (`synchronous=FULL` in WAL mode): the worker commits its Kafka offsets once a
batch's transaction commits, and under NORMAL a power loss could roll back committed transactions whose records
would never be read again."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sinks import Partitioning, SqliteBucketStore, SqliteEventStore, SqliteRollupStore


def test_every_store_syncs_each_commit(tmp_path: Path) -> None:
    async def scenario() -> list[int]:
        stores = [SqliteEventStore(tmp_path / "e.db", lambda ns: Partitioning(4, 10, 60)),
                  SqliteRollupStore(tmp_path / "r.db"), SqliteBucketStore(tmp_path / "b.db")]
        try:
            return [s._db.run_sync(lambda conn: conn.execute("PRAGMA synchronous").fetchone()[0]) for s in stores]
        finally:
            for s in stores:
                await s.close()
    assert asyncio.run(scenario()) == [2, 2, 2]  # 2: FULL
