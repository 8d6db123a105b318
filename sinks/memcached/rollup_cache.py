"""The rollup cache in memcached: one value `count:rollup_ts` per counter, over pipelined asyncio connections."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from operator import methodcaller
from typing import Any

import xxhash
from pymemcache.client.rendezvous import RendezvousHash

from sinks.cache import Key
from sinks.memcached.client import AsyncMemcached, is_legal_key

__all__ = ["MemcachedRollupCache", "cache_key", "parse_servers", "scoped_prefix"]

log = logging.getLogger(__name__)

_MAX_RELATIVE_TTL_S = 30 * 24 * 3600  # memcached reads larger expiries as absolute unix times
_MAX_ABSOLUTE_EXPIRE = 2**31 - 1


def cache_key(namespace: str, counter: str, prefix: str = "") -> str:
    """``rollup/<ns>:<counter>`` (``rollup/<prefix>:<ns>:<counter>`` with a prefix: the deployment's, so two sharing
    one memcached never read each other's rollups) when that is a legal memcached key (printable ASCII, <= 250
    bytes); otherwise ``rollup#<xxh3-128 hex>`` of the UTF-8 key. Readable keys always start ``rollup/`` and hashed
    ones ``rollup#``, so the two forms never collide; a prefix holds no ``:`` (a Kafka group name's characters).
    A BEST_EFFORT key (`counters.best_effort_key`) is ``<ns>:<counter>`` or ``be#<hex>``, and a namespace holds no
    ``/``: no rollup key is one (``rollup:<prefix>:...`` was namespace ``rollup``'s counter ``<prefix>:...``, whose
    GetCount then read a rollup: a review's 500)."""
    key = f"rollup/{prefix}:{namespace}:{counter}" if prefix else f"rollup/{namespace}:{counter}"
    if is_legal_key(key):
        return key
    return "rollup#" + xxhash.xxh3_128_hexdigest(key.encode("utf-8"))


def scoped_prefix(key_prefix: str, identity: str) -> str:
    """`cache_key`'s prefix for a deployment (`key_prefix`) on the store with `identity` (`RollupStore.identity`)."""
    return f"{key_prefix}.{identity}" if key_prefix else identity


def _encode(count: int, rollup_ts: int) -> bytes:
    return f"{int(count)}:{int(rollup_ts)}".encode("ascii")


def _decode(raw: bytes | str | None) -> tuple[int, int] | None:
    if raw is None:
        return None
    try:
        text = raw.decode("ascii") if isinstance(raw, bytes) else raw
        count, rollup_ts = text.split(":")
        return int(count), int(rollup_ts)
    except (ValueError, UnicodeDecodeError):
        return None


GETS_CHUNK = 256  # keys in one multi-key `gets` of `advance_many` (a chunk's writes are pipelined)
ADVANCE_TRIES = 64  # compare-and-set rounds: each lost one means another writer's value was stored meanwhile


async def _advance(client: AsyncMemcached, key: str, value: bytes, rollup_ts: int, expire: int,
                   held: tuple[bytes, int] | None = None, *, read: bool = False) -> None:
    """`RollupCache.advance` on one server: add when absent, compare-and-set while the held rollup is not later.
    An undecodable value is replaced. A round is lost only to a writer that stored (some writer moves on every
    round), so a counter's few concurrent writers settle in a few rounds; ADVANCE_TRIES only bounds a pathology.
    `read`: `held` is what a `gets` shared with other keys found (`_advanced_all`), so the first round sends none."""
    for _ in range(ADVANCE_TRIES):
        if not read:
            held = await client.gets(key)
        read = False
        if held is None:
            if await client.add(key, value, expire):
                return
            continue
        current = _decode(held[0])
        if current is not None and current[1] > rollup_ts:
            return
        if await client.cas(key, value, held[1], expire) == b"STORED":
            return
    log.warning("memcached %s: rollup %d of %s not cached after %d contended rounds", client.address, rollup_ts,
                key, ADVANCE_TRIES)


CAS_PROBE_KEY = "counter-abstraction/cas-probe"  # not a rollup key (`rollup/`, `rollup#`) nor a BEST_EFFORT one


async def _cas_works(client: AsyncMemcached) -> bool:
    """Whether the server keeps compare-and-set. One started with `-C` answers every `gets` with the unique 0 and
    every `cas` with EXISTS: no cached rollup would ever advance, and reads would serve a counter's first cached
    count for good."""
    await client.set(CAS_PROBE_KEY, b"1", 60)
    held = await client.gets(CAS_PROBE_KEY)
    return held is None or held[1] != 0  # None: evicted at once, which says nothing against it


async def _advanced(client: AsyncMemcached, key: str, value: bytes, rollup_ts: int, expire: int) -> bool:
    await _advance(client, key, value, rollup_ts, expire)
    return True


async def _advanced_all(client: AsyncMemcached, writes: Sequence[tuple[str, bytes, int, int]]) -> bool:
    """`_advance` for many (key, value, rollup_ts, expire) on one server, its first round shared: one `gets` for
    them all, then an add or a compare-and-set each, pipelined. A key whose first round is lost goes round again
    alone. Why: a rollup batch paid two requests a counter (`gets`, then `cas`), about a fifth of its time."""
    held = await client.gets_many(key for key, _, _, _ in writes)
    await asyncio.gather(*(_advance(client, key, value, rollup_ts, expire, held.get(key), read=True)
                           for key, value, rollup_ts, expire in writes))
    return True


def parse_servers(spec: str) -> list[tuple[str, int]]:
    body = spec.strip()
    if body.startswith("memcached://"):
        body = body[len("memcached://"):]
    body = body.rstrip("/")
    servers = []
    for part in filter(None, (p.strip() for p in body.split(","))):
        host, sep, port = part.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"expected memcached://host:port[,host:port], got {spec!r}")
        servers.append((host.strip("[]"), int(port)))
    if not servers:
        raise ValueError(f"no memcached server in {spec!r}")
    return servers


MAX_UNWRITTEN = 100_000
"""Rollups kept per server to write once it answers again (`MemcachedRollupCache.advance`); past it a failed
write is dropped, and its counter may read its older cached rollup until its next one (logged once an outage)."""


class _Node:
    """One memcached server with its connection pool and circuit breaker."""

    def __init__(self, host: str, port: int, timeout_s: float, pool_size: int) -> None:
        self.name = f"{host}:{port}"
        self.client = AsyncMemcached(host, port, timeout_s=timeout_s, pool_size=pool_size)
        self.down_until = 0.0  # monotonic time before which memcached is skipped
        self.failing = False  # inside an outage (already logged)
        self.unwritten: dict[str, tuple[bytes, int, int]] = {}  # key -> (value, rollup_ts, expire) not yet written
        self.rewriting: asyncio.Task[None] | None = None  # writes `unwritten` once the server answers
        self.dropped = 0  # failed writes not kept (past MAX_UNWRITTEN) this outage
        self.cas_works: bool | None = None  # whether the server keeps compare-and-set (`_cas_works`), once asked


class MemcachedRollupCache:
    """memcached over pipelined asyncio connections; several servers by rendezvous hashing.

    A key always maps to the same server: while one is down its keys just miss rather than
    moving to another server and coming back stale after the outage.
    """

    def __init__(self, servers: str | Sequence[str], *, default_ttl_s: float | None = None,
                 timeout_s: float = 0.2, breaker_s: float = 1.0, pool_size: int = 1, key_prefix: str = "",
                 scope: Callable[[], Awaitable[str]] | None = None) -> None:
        """`key_prefix` names the deployment; `scope`, when given, the store (`RollupStore.identity`): keys are then
        prefixed ``<key_prefix>.<identity>``, read once, at the first call that needs a key."""
        specs = [servers] if isinstance(servers, str) else list(servers)
        addresses = [addr for spec in specs for addr in parse_servers(spec)]
        self._nodes = {f"{h}:{p}": _Node(h, p, timeout_s, pool_size) for h, p in addresses}
        self._ring = RendezvousHash(list(self._nodes))
        self._single = next(iter(self._nodes.values())) if len(self._nodes) == 1 else None
        self.default_ttl_s = default_ttl_s
        self.breaker_s = breaker_s
        self.key_prefix = key_prefix  # the deployment's (open_cache)
        self._scope = scope
        self._prefix: str | None = None if scope is not None else key_prefix  # `cache_key`'s, once known
        self._scope_failing = False
        self._lock = threading.Lock()

    @property
    def servers(self) -> list[str]:
        return list(self._nodes)

    async def get(self, namespace: str, counter: str) -> tuple[int, int] | None:
        if (key := await self._key(namespace, counter)) is None:
            return None
        return _decode(await self._guard(self._node(key), lambda c: c.get(key), None))

    async def get_many(self, keys: Iterable[Key]) -> dict[Key, tuple[int, int]]:
        if (prefix := self._prefix if self._prefix is not None else await self._scoped()) is None:
            return {}
        by_node: dict[str, dict[str, Key]] = {}
        for namespace, counter in keys:
            key = cache_key(namespace, counter, prefix)
            by_node.setdefault(self._node(key).name, {})[key] = (namespace, counter)
        out: dict[Key, tuple[int, int]] = {}
        for name, wanted in by_node.items():
            found = await self._guard(self._nodes[name], methodcaller("get_many", list(wanted)), {})
            for key, raw in found.items():
                value = _decode(raw)
                if value is not None and key in wanted:
                    out[wanted[key]] = value
        return out

    async def set(self, namespace: str, counter: str, count: int, rollup_ts: int,
                  ttl_s: float | None = None) -> None:
        if (key := await self._key(namespace, counter)) is None:
            return
        expire = self._expire(self.default_ttl_s if ttl_s is None else ttl_s)
        value = _encode(count, rollup_ts)
        await self._guard(self._node(key), lambda c: c.set(key, value, expire), None)

    async def advance(self, namespace: str, counter: str, count: int, rollup_ts: int,
                      ttl_s: float | None = None) -> None:
        """Store the rollup unless a later one is held. One that cannot be written now (the server down, hung or
        in its breaker window) is written once the server answers again: the server may still hold the counter's
        older rollup, which reads would serve as current (a review saw 10 for 9 s after an outage, where the store
        had 15 for 25 s)."""
        if (key := await self._key(namespace, counter)) is None:
            return
        expire = self._expire(self.default_ttl_s if ttl_s is None else ttl_s)
        value = _encode(count, rollup_ts)
        node = self._node(key)
        if not await self._guard(node, lambda c: _advanced(c, key, value, rollup_ts, expire), False):
            self._keep_unwritten(node, key, value, rollup_ts, expire)

    async def advance_many(self, rollups: Iterable[tuple[str, str, int, int, float | None]]) -> None:
        """`advance` for each, sharing one `gets` per server and chunk (`_advanced_all`); a server that cannot be
        written now gets its rollups written once it answers, as `advance`'s. A counter given more than once is
        written once, with what `advance` for each in turn would leave: its latest rollup, and of equal ones the
        last given (sent together, its copies would race each other's compare-and-set, and the newest could lose
        every round)."""
        rollups = list(rollups)
        if not rollups or (prefix := self._prefix if self._prefix is not None else await self._scoped()) is None:
            return
        latest: dict[str, tuple[str, bytes, int, int]] = {}
        for namespace, counter, count, rollup_ts, ttl_s in rollups:
            key = cache_key(namespace, counter, prefix)
            if (held := latest.get(key)) is None or held[2] <= rollup_ts:
                expire = self._expire(self.default_ttl_s if ttl_s is None else ttl_s)
                latest[key] = (key, _encode(count, rollup_ts), rollup_ts, expire)
        by_node: dict[str, list[tuple[str, bytes, int, int]]] = {}
        for entry in latest.values():
            by_node.setdefault(self._node(entry[0]).name, []).append(entry)

        async def write(node: _Node, chunk: list[tuple[str, bytes, int, int]]) -> None:
            if not await self._guard(node, lambda c: _advanced_all(c, chunk), False):
                for key, value, rollup_ts, expire in chunk:
                    self._keep_unwritten(node, key, value, rollup_ts, expire)

        await asyncio.gather(*(write(self._nodes[name], writes[at:at + GETS_CHUNK])
                               for name, writes in by_node.items() for at in range(0, len(writes), GETS_CHUNK)))

    async def delete(self, namespace: str, counter: str) -> None:
        if (key := await self._key(namespace, counter)) is None:
            return
        await self._guard(self._node(key), lambda c: c.delete(key), None)

    async def healthy(self) -> bool:
        """True when every server answers now (a server in its breaker window counts as down)."""
        for node in self._nodes.values():
            if not await self._guard(node, lambda c: c.version(), False):
                return False
        return True

    async def close(self) -> None:
        for node in self._nodes.values():
            if node.rewriting is not None:
                node.rewriting.cancel()
            with contextlib.suppress(Exception):  # best effort, like everything here
                await node.client.close()

    # -- internals ----------------------------------------------------------------------------

    async def _key(self, namespace: str, counter: str) -> str | None:
        """The counter's key, None while the store's identity is not known (`_scoped`)."""
        prefix = self._prefix if self._prefix is not None else await self._scoped()
        return None if prefix is None else cache_key(namespace, counter, prefix)

    async def _scoped(self) -> str | None:
        """The keys' prefix with the store's identity, read once; None while the store cannot say (the call then
        does nothing: a read misses, a write is skipped, which only the store being unreachable right after it
        answered the rollup or clear that asked can cause)."""
        assert self._scope is not None
        try:
            identity = await self._scope()
        except Exception as exc:  # a cache must never fail its caller
            if not self._scope_failing:
                self._scope_failing = True
                log.warning("rollup cache unused until the store says its identity (%s: %s)", type(exc).__name__, exc)
            return None
        self._scope_failing = False
        self._prefix = scoped_prefix(self.key_prefix, identity)
        return self._prefix

    def _node(self, key: str) -> _Node:
        return self._single or self._nodes[self._ring.get_node(key)]

    def _keep_unwritten(self, node: _Node, key: str, value: bytes, rollup_ts: int, expire: int) -> None:
        held = node.unwritten.get(key)
        if held is not None and held[1] > rollup_ts:
            return
        if held is None and len(node.unwritten) >= MAX_UNWRITTEN:
            node.dropped += 1
            if node.dropped == 1:
                log.warning("memcached %s: over %d rollups wait to be cached; the counters of those not kept may "
                            "read an older cached count until their next rollup", node.name, MAX_UNWRITTEN)
            return
        node.unwritten[key] = (value, rollup_ts, expire)
        if node.rewriting is None or node.rewriting.done():
            node.rewriting = asyncio.get_running_loop().create_task(self._rewrite(node))

    async def _rewrite(self, node: _Node) -> None:
        """Write the node's unwritten rollups once it answers, each unless a later one is held; tried again after
        each breaker window while it does not."""
        while node.unwritten:
            await asyncio.sleep(max(node.down_until - time.monotonic(), 0.0) + 0.01)
            for key, (value, rollup_ts, expire) in list(node.unwritten.items()):
                write = functools.partial(_advanced, key=key, value=value, rollup_ts=rollup_ts, expire=expire)
                if not await self._guard(node, write, False):
                    break  # down again: after its breaker window
                if node.unwritten.get(key, (b"", -1, 0))[1] == rollup_ts:
                    del node.unwritten[key]
        if node.dropped:
            log.warning("memcached %s: %d rollups were not kept to be cached after its outage", node.name,
                        node.dropped)
            node.dropped = 0

    @staticmethod
    def _expire(ttl_s: float | None) -> int:
        if not ttl_s or ttl_s <= 0:
            return 0  # no expiry
        if ttl_s > _MAX_RELATIVE_TTL_S:  # absolute, read as int32 by memcached: past 2038 would be already expired
            return min(int(time.time() + ttl_s), _MAX_ABSOLUTE_EXPIRE)
        return max(1, math.ceil(ttl_s))

    async def _guard(self, node: _Node, op: Callable[[AsyncMemcached], Awaitable[Any]], default: Any) -> Any:
        """Run op unless the node's breaker is open or the server does not keep compare-and-set (asked at the first
        call, `_cas_works`: then the node is never used, and reads go to the rollup store); any failure opens the
        breaker and returns default."""
        if time.monotonic() < node.down_until or node.cas_works is False:
            return default
        try:
            if node.cas_works is None:
                node.cas_works = await _cas_works(node.client)
                if not node.cas_works:
                    log.error("memcached %s does not keep compare-and-set (started with -C): cached counts could not "
                              "be kept current there, so this process does not use it and reads go to the rollup "
                              "store; restart memcached without -C, then this process", node.name)
                    return default
            result = await op(node.client)
        except Exception as exc:  # a cache must never fail its caller
            with self._lock:
                node.down_until = time.monotonic() + self.breaker_s
                first = not node.failing
                node.failing = True
            if first:
                log.warning("memcached %s unavailable (%s: %s); reads fall back to the rollup store, "
                            "retrying every %.1fs", node.name, type(exc).__name__, exc, self.breaker_s)
            return default
        if node.failing:
            with self._lock:
                recovered, node.failing = node.failing, False
            if recovered:
                log.warning("memcached %s is back", node.name)
        return result
