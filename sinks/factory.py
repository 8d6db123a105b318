"""Open the configured stores from a COUNTER_STORE url."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sinks.base import BucketStore, SketchStore, Stores
from sinks.model import Partitioning
from sinks.sqlite import SqliteBucketStore, SqliteEventStore, SqliteRollupStore, SqliteSketchStore
from sinks.windows import Granularity

__all__ = ["BUCKETS_FILE", "EVENTS_FILE", "ROLLUPS_FILE", "SKETCHES_FILE", "Stores", "open_namespace_sketch_store",
           "open_namespace_stores", "open_sketch_store", "open_stores", "sqlite_directory", "store_identity",
           "store_location"]

EVENTS_FILE = "events.sqlite3"
ROLLUPS_FILE = "rollups.sqlite3"
BUCKETS_FILE = "buckets.sqlite3"
SKETCHES_FILE = "sketches.sqlite3"


def open_stores(store_url: str, data_dir: Path, partitioning_for: Callable[[str], Partitioning], *,
                delete_after_for: Callable[[str], float | None] | None = None,
                retention_for: Callable[[str, Granularity], float | None] | None = None,
                lock_wait_s: float | None = None) -> Stores:
    """``"sqlite"``: files under data_dir; ``"sqlite:///abs/dir"``: files under that directory;
    ``"cassandra://h1,h2:9042/keyspace?dc=..."``: a Cassandra cluster (see ``sinks.cassandra.config``).

    ``delete_after_for(namespace)`` (seconds) sets the Cassandra slice tables' TTL backstop and
    ``retention_for(namespace, granularity)`` (seconds, None: forever) the bucket TTL backstop; SQLite ignores
    both (its retention is ``drop_expired_slices`` and ``drop_expired`` alone). ``lock_wait_s``: how long a SQLite
    call waits for another process's lock (`SqliteThread`; None: about 4 minutes); Cassandra takes no locks.
    """
    url = store_url.strip()
    directory = sqlite_directory(url, data_dir)
    if directory is not None:
        if url != "sqlite" and not directory.is_absolute():
            raise ValueError(f"expected 'sqlite:///absolute/dir', got {store_url!r}")
    elif url.startswith("cassandra://"):
        from sinks.cassandra.store import open_cassandra_stores  # the driver loads only when used

        return open_cassandra_stores(url, partitioning_for, delete_after_for=delete_after_for,
                                     retention_for=retention_for)
    else:
        raise ValueError(f"unknown store {store_url!r}: expected 'sqlite', 'sqlite:///dir' or 'cassandra://...'")
    directory.mkdir(parents=True, exist_ok=True)
    return Stores(SqliteEventStore(directory / EVENTS_FILE, partitioning_for, lock_wait_s=lock_wait_s),
                  SqliteRollupStore(directory / ROLLUPS_FILE, lock_wait_s=lock_wait_s),
                  SqliteBucketStore(directory / BUCKETS_FILE, lock_wait_s=lock_wait_s))


def store_location(store_url: str, data_dir: Path) -> str:
    """The store `open_stores` opens, as a URL that names it wherever it is read: `sqlite` (the data directory) and a
    relative one become `sqlite:///<absolute dir>`; a Cassandra URL with its password masked (it is recorded and
    printed: endpoints.json, the store bindings topic)."""
    if (directory := sqlite_directory(store_url, data_dir)) is not None:
        return f"sqlite://{directory.resolve()}"
    from sinks.cassandra.config import masked_url  # a pure module: no driver import

    return masked_url(store_url)


def sqlite_directory(store_url: str, data_dir: Path) -> Path | None:
    """The directory of a SQLite store URL (None for another backend)."""
    if store_url == "sqlite":
        return Path(data_dir)
    return Path(store_url.removeprefix("sqlite://")) if store_url.startswith("sqlite://") else None


def store_identity(store_url: str, data_dir: Path, registry: Mapping[str, Any], *, new: bool = False) -> str:
    """The identity of a store this process has not opened (`RollupStore.identity`, drawn now for a new store; with
    `new`, replaced by a new one): opened, read and closed on an event loop of its own (never call it from one)."""
    stores = open_namespace_stores(store_url, data_dir, registry)

    async def read() -> str:
        try:
            return await (stores.rollups.new_identity() if new else stores.rollups.identity())
        finally:
            for store in stores:
                await store.close()

    return asyncio.run(read())


def open_namespace_stores(store_url: str, data_dir: Path, registry: Mapping[str, Any], *,
                          lock_wait_s: float | None = None) -> Stores:
    """`open_stores` with each namespace's partitioning and retention taken from the control plane."""
    def partitioning_for(namespace: str) -> Partitioning:
        ns = registry.get(namespace)
        if ns is None:
            raise KeyError(f"unknown namespace {namespace!r}")
        return Partitioning.of(ns.time_partition)

    def delete_after_for(namespace: str) -> float | None:
        ns = registry.get(namespace)
        return None if ns is None else ns.retention.delete_after_s

    def retention_for(namespace: str, granularity: Granularity) -> float | None:
        ns = registry.get(namespace)
        if ns is None or not ns.windows.enabled(granularity):
            return None
        return ns.windows.retention_s(granularity)

    return open_stores(store_url, data_dir, partitioning_for, delete_after_for=delete_after_for,
                       retention_for=retention_for, lock_wait_s=lock_wait_s)


def open_sketch_store(buckets: BucketStore, *,
                      retention_for: Callable[[str, Granularity], float | None] | None = None,
                      lock_wait_s: float | None = None) -> SketchStore:
    """The sketch store of unique counts beside an opened bucket store, on the same backend: ``sketches.sqlite3``
    in the bucket file's directory, or the Cassandra bucket store's session (closing the sketch store releases
    its reference). ``retention_for`` sets the Cassandra TTL backstop, as for buckets."""
    if isinstance(buckets, SqliteBucketStore):
        return SqliteSketchStore(buckets.path.with_name(SKETCHES_FILE), lock_wait_s=lock_wait_s)
    from sinks.cassandra.buckets import CassandraBucketStore  # the driver loads only when used
    from sinks.cassandra.sketches import CassandraSketchStore

    if isinstance(buckets, CassandraBucketStore):
        return CassandraSketchStore.beside(buckets, retention_for=retention_for)
    raise TypeError(f"no sketch store beside a {type(buckets).__name__}")


def open_namespace_sketch_store(buckets: BucketStore, registry: Mapping[str, Any], *,
                                lock_wait_s: float | None = None) -> SketchStore:
    """`open_sketch_store` with each namespace's retention taken from the control plane."""
    def retention_for(namespace: str, granularity: Granularity) -> float | None:
        ns = registry.get(namespace)
        if ns is None or not ns.windows.enabled(granularity):
            return None
        return ns.windows.retention_s(granularity)

    return open_sketch_store(buckets, retention_for=retention_for, lock_wait_s=lock_wait_s)
