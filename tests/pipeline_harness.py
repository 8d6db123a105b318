"""A real worker process per test, on its own topics, data directory and consumer group.

Everything is real: the session broker, the session memcached, SQLite files; results are read from the
rollup store file and the cache, and waited for with deadlines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import urllib.error
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from confluent_kafka import Consumer, TopicPartition

from infra.broker import LocalBroker
from infra.memcached import LocalMemcached
from infra.process import ManagedProcess
from infra.stack import LocalStack
from sinks import RollupState, SqliteRollupStore, scoped_prefix
from streams.positions import watermarks
from streams.settings import load_settings
from streams.topics import ensure_topics, topic_specs
from tests.helpers import wait_for

NAMESPACES = Path(__file__).parent / "data" / "pipeline_namespaces.yaml"
ACCEPT_LIMIT_S = 3.0
COALESCE_S = 0.2
# The defaults block of a namespace file for tests that wait on rollups: a short accept window and rollup window,
# 10 s buckets (ACCEPT_LIMIT_S and COALESCE_S above); a test's file is this plus its own `namespaces:`.
FAST_DEFAULTS = """\
defaults:
  accept_limit: 3s
  max_clock_skew: 250ms
  queue_config: { coalesce_ms: 200 }
  time_partition: { buckets_per_id: 4, seconds_per_bucket: 10, seconds_per_slice: 60 }
"""
SKEW_S = 0.25


@dataclass(frozen=True, slots=True)
class Event:
    """One mutation as the oracle sees it."""

    counter: str
    event_time: int
    token: str
    delta: int
    clear: bool = False


def oracle(events: Iterable[Event]) -> dict[str, int]:
    """Exact counts: distinct events; per counter, the deltas after its latest clear."""
    by_counter: dict[str, dict[tuple[int, str], Event]] = defaultdict(dict)
    for e in events:
        by_counter[e.counter].setdefault((e.event_time, e.token), e)
    counts = {}
    for counter, evs in by_counter.items():
        clears = [e.event_time for e in evs.values() if e.clear]
        cut = max(clears) if clears else -1
        counts[counter] = sum(e.delta for e in evs.values() if not e.clear and e.event_time > cut)
    return counts


@dataclass
class PipelineEnv:
    bootstrap: str
    memcached: str
    data_dir: Path
    prefix: str = field(default_factory=lambda: f"t{uuid.uuid4().hex[:10]}")
    partitions: int = 4
    namespaces: Path = NAMESPACES
    extra_env: dict[str, str] = field(default_factory=dict)  # more COUNTER_* for every process (Kafka security)
    _stack: LocalStack | None = None

    @property
    def mutations_topic(self) -> str:
        return f"{self.prefix}-mutations"

    @property
    def dlq_topic(self) -> str:
        return f"{self.prefix}-dlq"

    @property
    def worker_id(self) -> str:
        """COUNTER_WORKER_ID: the consumer group's name, and the prefix of the rollup cache's keys."""
        return f"{self.prefix}-worker"

    def env(self) -> dict[str, str]:
        return {
            "COUNTER_KAFKA_BOOTSTRAP": self.bootstrap,
            "COUNTER_CACHE": f"memcached://{self.memcached}",
            "COUNTER_DATA_DIR": str(self.data_dir),
            "COUNTER_NAMESPACES": str(self.namespaces),
            "COUNTER_MUTATIONS_TOPIC": self.mutations_topic,
            "COUNTER_ROLLUPS_TOPIC": f"{self.prefix}-rollups",
            "COUNTER_DLQ_TOPIC": self.dlq_topic,
            "COUNTER_MUTATIONS_PARTITIONS": str(self.partitions),
            "COUNTER_ROLLUPS_PARTITIONS": str(self.partitions),
            "COUNTER_WORKER_ID": self.worker_id,
            "COUNTER_SWEEP_INTERVAL_S": "1",
            "COUNTER_WORKER_LOG_LEVEL": "info",
            **self.extra_env,
        }

    def prepare(self) -> PipelineEnv:
        """Create the data directory and the topics; returns self."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.create_topics()
        return self

    def create_topics(self) -> None:
        settings = load_settings(**{k.removeprefix("COUNTER_").lower(): v for k, v in self.env().items()})
        ensure_topics(self.bootstrap, topic_specs(settings), admin_config=settings.kafka_security.librdkafka())

    @property
    def stack(self) -> LocalStack:
        if self._stack is None:
            self._stack = LocalStack(self.data_dir, self.env())
        return self._stack

    @property
    def workers(self) -> list[ManagedProcess]:
        return self.stack.workers

    @property
    def apis(self) -> list[ManagedProcess]:
        return self.stack.apis

    def start_worker(self) -> ManagedProcess:
        return self.stack.start_worker()

    def start_api(self, **extra_env: str) -> ManagedProcess:
        return self.stack.start_api(**extra_env)

    def stop(self) -> None:
        if self._stack is not None:
            self._stack.stop()

    def owned(self, worker: ManagedProcess) -> set[int] | None:
        """The mutations partitions a worker's persist consumer owns (its /ready), None while it answers 503."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{worker.port}/ready", timeout=5) as response:
                body = json.load(response)
        except (urllib.error.URLError, OSError):
            return None
        prefix = f"{self.mutations_topic}:"
        return {int(p[len(prefix):]) for p in body["partitions"] if p.startswith(prefix)}

    def shared(self, a: ManagedProcess, b: ManagedProcess) -> bool:
        """Whether the rebalance is over: each worker owns some partitions, together all, none twice."""
        mine, theirs = self.owned(a), self.owned(b)
        return bool(mine and theirs and not mine & theirs and mine | theirs == set(range(self.partitions)))

    def pause_settled(self, worker: ManagedProcess, timeout: float = 30.0) -> None:
        """Freeze `worker` once it has committed every mutations record the topic holds now, and not inside a write
        transaction of the event store. A test of what works while the worker is frozen needs both: the API's
        AddAndGetCount stores its own event early only once the worker has every write acknowledged before
        (query_api.early_persist), and a worker frozen holding the store's write lock holds off every writer."""
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"{self.worker_id}.persist",
                             "enable.auto.commit": False})
        try:
            parts = [TopicPartition(self.mutations_topic, p) for p in range(self.partitions)]
            ends = {p: high for p, (_, high) in watermarks(consumer, self.mutations_topic,
                                                            list(range(self.partitions))).items()}

            def committed_all() -> bool:
                done = {tp.partition: tp.offset for tp in consumer.committed(parts, timeout=10)}
                return all(done[p] >= end for p, end in ends.items() if end > 0)
            wait_for(committed_all, timeout, message=lambda: f"the worker to commit {ends}")
        finally:
            consumer.close()

        def paused_outside_writes() -> bool:
            worker.pause()
            if _write_locked(self.data_dir / "events.sqlite3"):
                worker.resume()
                return False
            return True
        wait_for(paused_outside_writes, timeout, interval=0.005, message="the worker between two store writes")

    def rollups(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], RollupState]:
        async def read() -> dict[tuple[str, str], RollupState]:
            store = SqliteRollupStore(self.data_dir / "rollups.sqlite3")
            try:
                return await store.get_many(keys)
            finally:
                await store.close()
        return asyncio.run(read())

    def cache_prefix(self) -> str:
        """The keys' prefix of the deployment's rollup cache: its id and its store's identity (`sinks.cache`)."""
        async def read() -> str:
            store = SqliteRollupStore(self.data_dir / "rollups.sqlite3")
            try:
                return scoped_prefix(self.worker_id, await store.identity())
            finally:
                await store.close()
        return asyncio.run(read())

    def converged(self, namespace: str, expected: dict[str, int]) -> bool:
        """Every counter's rollup equals the oracle and has caught up with its last write."""
        keys = [(namespace, c) for c in expected]
        states = self.rollups(keys)
        return all(
            (s := states.get((namespace, c))) is not None and s.count == n and s.rollup_ts >= s.last_write_ts
            for c, n in expected.items())

    def mismatches(self, namespace: str, expected: dict[str, int]) -> dict[str, tuple[int, object]]:
        states = self.rollups([(namespace, c) for c in expected])
        return {c: (n, states.get((namespace, c))) for c, n in expected.items()
                if (s := states.get((namespace, c))) is None or s.count != n or s.rollup_ts < s.last_write_ts}


def _write_locked(db: Path) -> bool:
    """Whether another connection holds the SQLite file's write lock (asked without waiting)."""
    connection = sqlite3.connect(db, timeout=0, isolation_level=None)
    try:
        connection.execute("BEGIN IMMEDIATE")
        connection.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            return True
        raise
    finally:
        connection.close()


@contextlib.contextmanager
def serving(kafka_bootstrap: str, memcached_address: str, tmp_path: Path,
            namespaces_yaml: str) -> Iterator[PipelineEnv]:
    """A PipelineEnv on fresh topics serving the namespaces of `namespaces_yaml` (written to tmp_path); whatever
    the test starts in it is stopped on exit."""
    config = tmp_path / "namespaces.yaml"
    config.write_text(namespaces_yaml)
    env = PipelineEnv(kafka_bootstrap, memcached_address, tmp_path / "data", namespaces=config).prepare()
    try:
        yield env
    finally:
        env.stop()


@contextlib.contextmanager
def worker_and_api(kafka_bootstrap: str, memcached_address: str, tmp_path: Path,
                   namespaces_yaml: str) -> Iterator[tuple[PipelineEnv, httpx.Client]]:
    """A worker and an API on fresh topics, serving the namespaces of `namespaces_yaml`, and a client of the API;
    all stopped on exit."""
    with serving(kafka_bootstrap, memcached_address, tmp_path, namespaces_yaml) as env:
        env.start_worker()
        api = env.start_api()
        with httpx.Client(base_url=f"http://127.0.0.1:{api.port}", timeout=30) as client:
            yield env, client


@contextlib.contextmanager
def own_broker(tmp_path: Path, namespaces: Path) -> Iterator[tuple[LocalBroker, LocalMemcached, PipelineEnv,
                                                                   httpx.Client]]:
    """A broker and a memcached of the test's own (to pause or stop: the session's are shared), topics, a worker,
    an API serving the namespaces file `namespaces`, and a client of the API; all stopped on exit."""
    broker = LocalBroker(tmp_path / "broker.log").start()
    mc = LocalMemcached(tmp_path / "mc.log").start()
    env = PipelineEnv(broker.bootstrap, mc.address, tmp_path / "data", namespaces=namespaces)
    env.data_dir.mkdir()
    try:
        env.create_topics()
        env.start_worker()
        api = env.start_api()
        with httpx.Client(base_url=f"http://127.0.0.1:{api.port}", timeout=30) as client:
            yield broker, mc, env, client
    finally:
        env.stop()
        mc.stop()
        broker.stop()
