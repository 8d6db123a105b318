"""Which store a deployment persists into, recorded in Kafka: a fence against a worker or an API on another store.

Why: a worker persists the writes of the partitions it owns into its own store and commits their offsets. One
started with another store (COUNTER_STORE unset on one host, a data directory typed wrong) joins the consumer group,
persists its share where no API reads, and commits: those acknowledged writes are never counted, and nothing says
so. `counter up` checks the processes that join it through its endpoints file; a deployment of separate hosts has
no such file, only the broker they share. So the first worker or API to start records its store's identity
(`RollupStore.identity`) in the topic `<mutations topic>-stores` (`Settings.stores_topic`), keyed by the consumer
group (COUNTER_WORKER_ID), and every later one compares its own: another store refuses to start, naming both.

The binding is the group's first record, unless a later one says `rebind` (`counter store rebind`, moving the
deployment to another store on purpose): then the last of those. Two processes starting at once on different
stores both append; the log orders them, and each reads back after appending, so the first wins for both. Running
workers and APIs read the binding again every `store_binding_check_s` (`BindingWatch`): a worker then on another
store stops, an API fails its readiness.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from streams.settings import Settings
from streams.topics import ensure_topics, stores_spec

log = logging.getLogger(__name__)
QUIET = 2  # librdkafka's log level for these short-lived clients: a broker away is their error, not a line a second


@dataclass(frozen=True, slots=True)
class StoreClaim:
    """One record of the bindings topic: a store's identity and, for people, where it is and who claimed it."""

    store: str  # RollupStore.identity
    location: str  # its URL, password masked (sinks.store_location)
    host: str
    at: str  # ISO 8601, UTC
    rebind: bool = False

    @classmethod
    def now(cls, store: str, location: str, *, rebind: bool = False) -> StoreClaim:
        return cls(store, location, socket.gethostname(), datetime.now(UTC).isoformat(timespec="seconds"), rebind)

    def encode(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes | None) -> StoreClaim | None:
        """The claim a record holds; None for one that is not a claim (written by something else: never binding)."""
        try:
            data = json.loads(raw or b"")
            return cls(str(data["store"]), str(data.get("location", "?")), str(data.get("host", "?")),
                       str(data.get("at", "?")), data.get("rebind") is True) if isinstance(data["store"], str) else None
        except (ValueError, TypeError, KeyError):
            return None

    def described(self) -> str:
        how = "rebound" if self.rebind else "bound"
        return f"store {self.store} ({self.location}, {how} {self.at} from {self.host})"


class StoreMismatch(RuntimeError):
    """This process's store is not the one its consumer group persists into."""


def binding_of(records: Iterable[tuple[bytes | None, bytes | None]], group: str) -> StoreClaim | None:
    """The binding of `group` in the bindings topic's records (key, value), in log order: the last rebind, else the
    first claim; None before any."""
    key = group.encode()
    first: StoreClaim | None = None
    rebound: StoreClaim | None = None
    for record_key, value in records:
        if record_key != key or (claim := StoreClaim.decode(value)) is None:
            continue
        if claim.rebind:
            rebound = claim
        elif first is None:
            first = claim
    return rebound or first


def check(binding: StoreClaim | None, store: str, location: str, group: str, topic: str) -> None:
    """Raise StoreMismatch when `binding` names another store than `store` (this process's)."""
    if binding is None or binding.store == store:
        return
    raise StoreMismatch(
        f"this process's store {store} ({location}) is not the one consumer group {group} persists into: "
        f"{binding.described()}, recorded in topic {topic}. A worker on another store would persist its share of the "
        "writes where no API reads them, and an API would answer from counts no worker keeps. Point COUNTER_STORE "
        "(and COUNTER_DATA_DIR for SQLite) at that store; or, to move the deployment to this store on purpose "
        "(writes already persisted stay in the old one), stop every worker and API and run `counter store rebind`")


def read_binding(bootstrap: str, topic: str, group: str, *, config: Mapping[str, str] | None = None,
                 timeout_s: float = 15.0) -> StoreClaim | None:
    """`group`'s binding as the broker has it now (None before any, or with no bindings topic)."""
    return binding_of(read_records(bootstrap, topic, config or {}, timeout_s), group)


def claimed(bootstrap: str, topic: str, group: str, claim: StoreClaim, *, config: Mapping[str, str] | None = None,
            timeout_s: float = 15.0) -> StoreClaim:
    """`group`'s binding, `claim` appended first when there is none or when it is a rebind (the topic must exist)."""
    config = config or {}
    binding = None if claim.rebind else read_binding(bootstrap, topic, group, config=config, timeout_s=timeout_s)
    if binding is None:
        append_records(bootstrap, topic, [(group.encode(), claim.encode())], config, timeout_s)
        binding = read_binding(bootstrap, topic, group, config=config, timeout_s=timeout_s)
        if binding is None:
            raise RuntimeError(f"the store claim appended to {topic} is not there to read back")
    return binding


class BindingWatch:
    """A process's claim on the binding of its settings' consumer group: `bind()` at start, then `check()` while it
    runs. Either raises StoreMismatch when the binding names another store, and `mismatch` keeps it. A check while
    the broker does not answer leaves it as it was (the outage shows elsewhere), and binds if `bind()` could not."""

    def __init__(self, settings: Settings, store: str, location: str) -> None:
        """`store`: this process's store identity (`RollupStore.identity`); `location`: its URL, for people."""
        self.bootstrap, self.config = settings.kafka_bootstrap or "", settings.kafka_security.librdkafka()
        self.spec = stores_spec(settings)
        self.group = settings.worker_id
        self.claim = StoreClaim.now(store, location)
        self.bound = False  # the claim was made (appended, or another binding found)
        self.mismatch: StoreMismatch | None = None

    def bind(self, timeout_s: float = 15.0) -> None:
        """Create the bindings topic if needed and claim it for this store (blocking): StoreMismatch, or the broker's
        error (each request waits up to `timeout_s`)."""
        self._judge(self._binding(timeout_s))

    async def check(self) -> None:
        try:
            binding = await asyncio.to_thread(self._binding)
        except Exception as exc:  # a broker away: the next check reads it
            log.debug("could not read the store binding from %s: %r", self.spec.name, exc)
            return
        self._judge(binding)

    def _binding(self, timeout_s: float = 15.0) -> StoreClaim | None:
        if self.bound:
            return read_binding(self.bootstrap, self.spec.name, self.group, config=self.config, timeout_s=timeout_s)
        ensure_topics(self.bootstrap, [self.spec], timeout=timeout_s, admin_config=self.config)
        binding = claimed(self.bootstrap, self.spec.name, self.group, self.claim, config=self.config,
                          timeout_s=timeout_s)
        self.bound = True
        return binding

    def _judge(self, binding: StoreClaim | None) -> None:
        try:
            check(binding, self.claim.store, self.claim.location, self.group, self.spec.name)
        except StoreMismatch as exc:
            self.mismatch = exc
            raise
        self.mismatch = None


def read_records(bootstrap: str, topic: str, config: Mapping[str, str],
                 timeout_s: float) -> list[tuple[bytes | None, bytes | None]]:
    """Every record of the topic's one partition, read to its end; [] when the topic does not exist."""
    # A short fetch wait: the local broker answers a fetch only when its wait ends, which made each read of this
    # short topic take the default 500 ms at least (a second or two of every worker's and API's start)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}.reader", "enable.auto.commit": False,
                         "allow.auto.create.topics": False, "fetch.wait.max.ms": 20, "log_level": QUIET, **config})
    try:
        tp = TopicPartition(topic, 0)
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=timeout_s)
        except KafkaException as exc:
            if exc.args[0].code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION):
                return []
            raise
        if high <= low:
            return []
        consumer.assign([TopicPartition(topic, 0, low)])
        records: list[tuple[bytes | None, bytes | None]] = []
        deadline = time.monotonic() + timeout_s
        last = low - 1
        while last < high - 1:  # the local broker's high watermark is its last batch's base offset + 1
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{topic} not read to its end ({high}) within {timeout_s:g} s (at {last + 1})")
            # consume() waits out its timeout unless it fills its 500: short, so a read ends once at the end
            for message in consumer.consume(500, timeout=min(left, 0.05)):
                if (error := message.error()) is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(error)
                records.append((message.key(), message.value()))
                last = max(last, message.offset() or 0)
        return records
    finally:
        consumer.close()


def append_records(bootstrap: str, topic: str, records: Iterable[tuple[bytes | None, bytes | None]],
                   config: Mapping[str, str], timeout_s: float) -> None:
    """Append records (key, value) to the topic's one partition, in order, acknowledged by every in-sync replica."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "message.timeout.ms": int(timeout_s * 1000), "log_level": QUIET, **config})
    failed: list[KafkaError] = []
    for key, value in records:
        producer.produce(topic, value, key, partition=0,
                         on_delivery=lambda err, _msg: failed.append(err) if err is not None else None)
    if producer.flush(timeout_s) or failed:
        raise KafkaException(failed[0] if failed else KafkaError(KafkaError._MSG_TIMED_OUT))
