"""The in-memory form of a count mutation, shared by producers, the persist agent and the API."""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple

MICROS = 1_000_000
"""Microseconds per second: event times are epoch microseconds everywhere (Avro `event_time`)."""


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
        """The Kafka record key, `namespace:counter_name` (namespaces never contain ':')."""
        return counter_key(self.namespace, self.counter_name)


def counter_key(namespace: str, counter: str) -> str:
    """`namespace:counter`: how the service names a counter on Kafka (record keys, rollup-signal partitioning).
    Namespaces never contain ':', so the form is unambiguous."""
    return f"{namespace}:{counter}"
