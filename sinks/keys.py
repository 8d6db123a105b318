"""Where a rollup store keeps what is not a counter's rollup: the keys of the per-partition marks
(`RollupStore.set_watermarks`/`watermarks`: when the latest write reached Kafka, the arrival floors, retention's mark)
and the claims that fence their publication, with the rules every backend applies to them alike."""

from __future__ import annotations

import secrets
from collections.abc import Mapping

__all__ = ["IDENTITY_CLAIM", "arrival_keys", "claim_topic", "claims_for", "dropped_key", "new_claim",
           "retention_cutoff", "written_key"]


def written_key(topic: str) -> str:
    """Where `RollupStore.set_watermarks`/`watermarks` keep, per partition of `topic`, when the latest persisted
    write reached Kafka (µs): what the partitions' watermarks must cover before heartbeats may stop. Kafka topic
    names have no '/', so this key never meets a topic's own watermarks."""
    return f"{topic}/written"


def arrival_keys(topic: str) -> tuple[str, str]:
    """Where `RollupStore.set_watermarks`/`watermarks` keep each partition of `topic`'s published arrival floor
    (`agents.arrival`): the offset from which it holds, and the floor (µs). Written in that order, read in the
    other, so that a pair half-written or merged by max never holds a floor from an offset before its own."""
    return f"{topic}/arrival-from", f"{topic}/arrival-floor"


def dropped_key(namespace: str) -> str:
    """Where `RollupStore.set_watermarks`/`watermarks` keep (partition 0) the event time before which the retention
    timer may have deleted the namespace's events (`drop_expired_slices`): a recount cannot recompute a total from
    events before it. ' ' and ':' are in no Kafka topic name, so the key never meets a topic's."""
    return f"dropped events:{namespace}"


def retention_cutoff(before_us: int, rolled_up_to_us: int) -> int:
    """Retention deletes events before this time: older than delete_after (`before_us`) and rolled past by every
    counter of the namespace (`rolled_up_to_us`). One rule for the stores' deletions and the retention timer's mark
    (agents.retention)."""
    return min(before_us, rolled_up_to_us + 1)


def claim_topic(key: str) -> str:
    """The topic whose partitions' claims (`RollupStore.claim_partitions`) fence publications to watermark key `key`:
    the key itself, or what precedes its '/' (`written_key`, `arrival_keys`; Kafka topic names have no '/')."""
    return key.partition("/")[0]


def claims_for(marks: Mapping[int, int], claims: Mapping[int, int]) -> dict[int, int]:
    """The claim of each partition of `marks`, for a fenced `RollupStore.set_watermarks` (a backend's check)."""
    missing = sorted(set(marks) - set(claims))
    if missing:
        raise ValueError(f"no claim given for partition(s) {missing}: a fenced publication carries one per partition")
    return {int(p): int(claims[p]) for p in marks}


IDENTITY_CLAIM = ("", -1)
"""Where a rollup store keeps its identity (`RollupStore.identity`): the claim on partition -1 of topic '' (no Kafka
topic has that name, nothing claims or publishes under it), taken once by the first process that asks and never
replaced."""


def new_claim() -> int:
    """A claim id for `RollupStore.claim_partitions`: random 63 bits (positive, fits a bigint), so claims never
    repeat, even where a store's claims were lost or restored and would start again."""
    return secrets.randbits(63) or 1
