"""What replay and recount run against: namespaces, stores, the shared rollup cache and the persist watermark."""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass

from agents.rollup import global_watermark
from agents.watermark import request_heartbeats
from control_plane import NamespaceRegistry, load_namespaces
from control_plane import default_config_path as default_namespaces
from sinks import (
    BucketStore,
    EventStore,
    RollupCache,
    RollupStore,
    SketchStore,
    open_cache,
    open_namespace_sketch_store,
    open_namespace_stores,
)
from streams.settings import Settings, SettingsError
from streams.topics import partition_count


@dataclass
class Runtime:
    settings: Settings
    registry: NamespaceRegistry
    events: EventStore
    rollups: RollupStore
    buckets: BucketStore
    cache: RollupCache | None
    cache_note: str  # what a recount's cache refresh reaches, for the summary
    mutation_partitions: int
    sketches: SketchStore | None = None  # unique counts' sketches, when a namespace is UNIQUE

    async def watermark(self) -> int:
        """The global persist watermark (µs): every mutation appended before it is in the event store."""
        marks = await self.rollups.watermarks(self.settings.mutations_topic)
        return global_watermark(marks, self.mutation_partitions)

    async def request_heartbeats(self, at_us: int | None = None) -> None:
        """Have idle workers move the watermark past a write at `at_us` (default now) that did not go through them
        (`agents.watermark.request_heartbeats`)."""
        at_us = time.time_ns() // 1000 if at_us is None else at_us
        await request_heartbeats(self.rollups, self.settings.mutations_topic, at_us)

    async def close(self) -> None:
        await self.events.close()
        await self.rollups.close()
        await self.buckets.close()
        if self.sketches is not None:
            await self.sketches.close()
        if self.cache is not None:
            await self.cache.close()


def shared_cache(settings: Settings, rollups: RollupStore) -> tuple[RollupCache | None, str]:
    """The cache the readers of `rollups` share, or None with a note when there is none reachable from here."""
    spec = settings.cache
    if spec == "auto":
        with contextlib.suppress(OSError, ValueError):
            memcached = json.loads(settings.endpoints_path.read_text()).get("memcached")
            if memcached:
                spec = f"memcached://{memcached}"
    if spec.startswith("memcached://"):
        return open_cache(spec, key_prefix=settings.worker_id, scope=rollups.identity), f"cache {spec} refreshed"
    return None, ("no shared cache (COUNTER_CACHE=memory or no memcached of `counter up` found): in-process "
                  "caches of running API servers keep their values until the namespace TTL")


def open_runtime(settings: Settings) -> Runtime:
    """Namespaces, stores, the shared cache and the mutations partition count (for the watermark)."""
    if not settings.kafka_bootstrap:
        raise SettingsError("COUNTER_KAFKA_BOOTSTRAP: needed for the persist watermark (counter up sets it)")
    registry = load_namespaces(settings.namespaces or default_namespaces())
    partitions = partition_count(settings.kafka_bootstrap, settings.mutations_topic,
                                 config=settings.kafka_security.librdkafka())
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    events, rollups, buckets = open_namespace_stores(settings.store, settings.data_dir, registry)
    sketches = (open_namespace_sketch_store(buckets, registry) if any(ns.counts_unique for ns in registry.values())
                else None)
    cache, note = shared_cache(settings, rollups)
    return Runtime(settings, registry, events, rollups, buckets, cache, note, partitions, sketches)
