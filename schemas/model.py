"""The in-memory form of a count mutation, shared by producers, the persist agent and the API."""

from __future__ import annotations

import zlib
from enum import StrEnum
from typing import NamedTuple

MICROS = 1_000_000
"""Microseconds per second: event times are epoch microseconds everywhere (Avro `event_time`)."""

MAX_SHARDS = 256
"""The most Kafka keys one counter's writes may be spread over (a namespace's `shards`)."""


class MutationOp(StrEnum):
    """What a mutation does; the values are the Avro enum symbols (a str and an Enum: "ADD" == ADD)."""

    ADD = "ADD"
    CLEAR = "CLEAR"


class Mutation(NamedTuple):
    """One AddCount or ClearCount, as carried by a CountMutation record.

    A NamedTuple rather than a dataclass: the persist path builds one per mutation, and a tuple costs a
    third of a frozen dataclass to build (the decoders' share of a single-mutation record).

    `event_time` (epoch µs) and `event_id` (the idempotency token) may be None only for JSON records
    that carried no idempotency token (or a token without generation_time): the persist agent then
    derives them from the Kafka record (timestamp, topic/partition/offset), so replays stay idempotent.

    `dimensions` (sorted (key, value) pairs, `schemas.dimensions`) slice the count: the write is counted in the
    counter and in every combination of its dimensions. `item` is what a UNIQUE namespace counts (e.g. a user
    id); "" is none. Both travel in the v2 Avro records only, so a mutation without them encodes as v1.
    """

    namespace: str
    counter_name: str
    delta: int
    event_time: int | None
    event_id: str | None
    event_item_key: str = ""
    op: MutationOp = MutationOp.ADD
    dimensions: tuple[tuple[str, str], ...] = ()
    item: str = ""

    @property
    def key(self) -> str:
        """The Kafka record key of an unsharded counter, `namespace:counter_name` (namespaces never contain ':')."""
        return counter_key(self.namespace, self.counter_name)

    def sharded_key(self, shards: int) -> str:
        """The Kafka record key in a namespace of `shards` shards (`shard_key`): `key` when it has one."""
        return shard_key(self.namespace, self.counter_name, self.event_id, shards)


def counter_key(namespace: str, counter: str) -> str:
    """`namespace:counter`: how the service names a counter on Kafka (record keys, rollup-signal partitioning).
    Namespaces never contain ':', so the form is unambiguous."""
    return f"{namespace}:{counter}"


def position_identity(topic: str, partition: int, offset: int, index: int) -> str:
    """The event id of a token-less mutation: its record's Kafka position and its index in the record. The persist
    path gives it (`agents.persist`), and the DLQ tools recognise a dead letter's source event by it (`jobs.dlq`)."""
    return f"kafka:{topic}:{partition}:{offset}:{index}"


def shard_of(token: str | None, shards: int) -> int:
    """Which of a counter's `shards` a write goes to: the CRC-32 (IEEE, as zlib, java.util.zip.CRC32 and Go's
    crc32.ChecksumIEEE compute it) of its idempotency token's UTF-8 bytes, modulo `shards`. A retry carries the
    same token, so it lands on the same shard (and partition); a write without a token goes to shard 0."""
    if shards <= 1 or token is None:
        return 0
    return zlib.crc32(token.encode("utf-8", "surrogatepass")) % shards


def shard_key(namespace: str, counter: str, token: str | None, shards: int) -> str:
    """The Kafka record key of a write to `counter` in a namespace whose counters are spread over `shards` keys
    (its `shards` option): `namespace:counter#k` with k = `shard_of(token, shards)`, or `counter_key` with one
    shard (the default, so unsharded keys never change).

    Keys only spread load over partitions: nothing downstream reads a key to find the counter (the persist path
    reads the record's value), so exactness never depends on them and outside clients may key as they like.
    The form is not meant to be parsed: counter names may themselves contain '#'."""
    if shards <= 1:
        return f"{namespace}:{counter}"
    return f"{namespace}:{counter}#{shard_of(token, shards)}"
