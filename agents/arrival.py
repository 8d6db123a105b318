"""Each mutations partition's arrival floor, kept across a handover.

Admission judges an event against when its record reached Kafka (`agents.persist.prepare`). A CreateTime topic
(the local Tansu broker) stamps when the producer built the record, so the worker keeps per partition the
timestamp of the last heartbeat it stored, its arrival floor: every record after that heartbeat reached Kafka
after it. The watermark that lets rollups pass a boundary comes from the same heartbeats. A worker that took a
partition over used to start with no floor, so a record appended after a heartbeat whose watermark the previous
owner had published, but stamped earlier, was admitted behind a boundary a rollup had already passed: stored,
never counted, never dead-lettered.

So the floor is published with the watermark, and the next owner starts from it:

* a heartbeat counts toward the watermark only once the offsets past it are committed (`committed`), and the
  worker publishes the floor, with the committed offset from which it holds, before the watermark it allows
  (`publishable`; two keys of the rollup store's watermark table, `sinks.arrival_keys`);
* a worker given a partition loads the published pair before its first batch (`load`) and applies the floor from
  that offset on, as if it had read the heartbeat itself (`with_seeds` puts a heartbeat record there).

Every published watermark then comes from a heartbeat before an offset whose floor is published, and a new owner
starts at the committed offset, at or after it. A pair holds only from its offset: if the group's committed
offsets were lost and a worker re-reads older records, those are judged as they were the first time, not
dead-lettered against a later heartbeat.

A previous owner can still be publishing when the new one loads: the group dropped it while it stalled (a GC or VM
pause, SIGSTOP) after it had committed past a heartbeat H, and it wakes to publish H's floor and the watermark from
H, which rollups then pass while the new owner judges the records after that commit by the older floor it loaded.
So publications are fenced by claims (`sinks.RollupStore.claim_partitions`): `load` claims the partitions before it
reads what was published, every floor, offset and watermark is published under the claim
(`set_watermarks(..., claims=)`), and the store refuses, atomically with the write, one whose claim is no longer
the partition's latest. A publication then either landed before the new owner's claim, and its load sees it, or is
refused; the refused worker drops what was refused and claims again (`refused`), which is harmless from a worker the
group dropped (it has no committed heartbeat to publish) and ends the fence of a late claimant.
Claims come from the store, not from the group's generation, which a broker that keeps its groups in memory (the
local Tansu) starts again at every restart while the store keeps what was claimed.

A published floor is no more trusted than the heartbeat it came from: one ahead of the loading worker's clock by more
than a worker's heartbeat can be (`agents.watermark.heartbeat_skew_s`) is the mark of a heartbeat forged by a client
(or of a worker whose clock was wrong) and is ignored, with a warning: `prepare` judges the seed (a `PublishedFloor`)
as it judges a heartbeat read from Kafka. Kept, it would dead-letter every valid record of the partition until the
clock caught up with it, at every handover, as the store keeps the highest floor it was given. Ignored, the
partition's records are judged by their own timestamps until this worker's first heartbeat, as before floors were
published.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence

from agents.persist import KafkaRecord, PublishedFloor
from schemas.record_headers import HEARTBEAT_HEADERS
from sinks import RollupStore, arrival_keys

log = logging.getLogger("counter.persist")

Pair = tuple[int, int]  # (offset from which the floor holds, floor µs)


class ArrivalFloors:
    """The arrival floors of the partitions a worker owns (see the module docstring). Called from the persist
    path under its batch lock, except `assigned` (the rebalance) and `publishable` (the heartbeat timer)."""

    def __init__(self) -> None:
        self.floor: dict[int, int] = {}  # partition -> µs: the last heartbeat stored; what `prepare` judges by
        self._committed: dict[int, Pair] = {}  # partition -> the offset its floor was first committed at, the floor
        self._seeds: dict[int, Pair] = {}  # partition -> a published pair not yet applied
        self._unseeded: set[int] = set()  # assigned partitions whose published pairs are not loaded yet
        self.claims: dict[int, int] = {}  # partition -> this worker's claim on it: what its publications carry
        # partition -> how many commits had been sent when it was refused or revoked: a commit sent by then whose
        # reply comes later must not make a floor to publish (under a claim taken since)
        self._dropped_after: dict[int, int] = {}

    def assigned(self, partitions: Iterable[int]) -> None:
        self._unseeded.update(partitions)

    def revoked(self, partitions: Iterable[int], commits_sent: int = 0) -> None:
        """A handover: the next owner starts from what was published. `commits_sent`: the persist consumer's count of
        commits sent so far (`committed` ignores the replies of those for these partitions)."""
        for partition in partitions:
            self._dropped_after[partition] = commits_sent
            self.floor.pop(partition, None)
            self._committed.pop(partition, None)
            self._seeds.pop(partition, None)
            self._unseeded.discard(partition)
            self.claims.pop(partition, None)

    async def load(self, rollups: RollupStore, topic: str) -> None:
        """Claim the partitions assigned since the last call, then fetch their published pairs (a store error
        propagates: the persist path retries its batch). The claim comes first: a previous owner's publication after
        it is refused, one before it is read here. A retry keeps the claims already taken: claiming again would fence
        the owner once more at every retry of a worker the group dropped. The floors are read before the offsets,
        which are written first."""
        if not self._unseeded:
            return
        loading = set(self._unseeded)
        if unclaimed := loading - self.claims.keys():
            self.claims.update(await rollups.claim_partitions(topic, unclaimed))
        from_key, floor_key = arrival_keys(topic)
        floors = await rollups.watermarks(floor_key)
        froms = await rollups.watermarks(from_key)
        for partition in loading & floors.keys() & froms.keys():
            if floors[partition] > self.floor.get(partition, 0):
                self._seeds[partition] = (froms[partition], floors[partition])
        self._unseeded -= loading

    def refused(self, partitions: Iterable[int], commits_sent: int = 0) -> None:
        """The store refused a publication for these partitions: another worker claimed them since. Either this one
        lost them in a rebalance it has not heard of yet, or a worker that did claimed late (it stalled between its
        assignment and its claim) and may be gone. What was refused is dropped, and the partitions are claimed again
        with the next batch, their published pairs loaded again: a worker that lost them has no commit to publish
        under the new claim (the group refuses its commits, and only committed heartbeats are published), and the
        owner's claim ends a late claimant's fence, so its watermark does not stand still until the next rebalance.
        Their floors stay, so the records in hand are judged as before. A commit sent before the refusal
        (`commits_sent` of them) whose reply comes after it publishes nothing: the broker may have applied it before
        the group moved on (a reply delayed on the network), and its floor was never published before the next
        owner loaded; only commits sent after the refusal count."""
        for partition in partitions:
            self._dropped_after[partition] = commits_sent
            if self.claims.pop(partition, None) is not None:
                log.warning("publications for mutations partition %d refused: another worker claimed it since; "
                            "claiming it again with the next batch (a worker the group dropped publishes nothing "
                            "under it: its commits are refused)", partition)
                self._unseeded.add(partition)
            self._committed.pop(partition, None)

    def with_seeds(self, records: Sequence[KafkaRecord]) -> tuple[Sequence[KafkaRecord], set[int]]:
        """The records with a heartbeat put before the first record of each seeded partition at or past its
        pair's offset, and the partitions so seeded (`stored` retires their seeds once the batch is stored)."""
        if not self._seeds:
            return records, set()
        seeds, first = self._seeds, {}
        for index, rec in enumerate(records):
            partition = rec.partition
            if partition in seeds and partition not in first and rec.offset >= seeds[partition][0]:
                first[partition] = index
        if not first:
            return records, set()
        out: list[KafkaRecord] = list(records)
        for partition, index in sorted(first.items(), key=lambda item: item[1], reverse=True):
            offset, floor_us = seeds[partition]
            rec = records[index]
            out.insert(index, PublishedFloor(rec.topic, partition, offset - 1, floor_us // 1000, None, b"",
                                             HEARTBEAT_HEADERS))
        return out, set(first)

    def stored(self, heartbeats: Iterable[tuple[int, int]], seeded: Iterable[int]) -> None:
        """A batch is stored: its heartbeats (partition, µs) raise the floors, and its seeds are applied."""
        floor = self.floor
        for partition, timestamp_us in heartbeats:
            if timestamp_us > floor.get(partition, 0):
                floor[partition] = timestamp_us
        for partition in seeded:
            self._seeds.pop(partition, None)

    def committed(self, offsets: Mapping[int, int], sent: int | None = None) -> dict[int, int]:
        """The offsets (partition -> next offset) are committed: the floors they were stored with may be published.
        Returns those floors, the latest heartbeats now behind committed offsets: what the watermark may use.
        `sent`: the commit's number (`PersistConsumer.commits_sent` when it was sent); one sent before its partition
        was refused or revoked counts for nothing (None: sent after everything so far)."""
        out = {}
        for partition, offset in offsets.items():
            floor_us = self.floor.get(partition)
            if floor_us is None or (sent is not None and sent <= self._dropped_after.get(partition, -1)):
                continue
            out[partition] = floor_us
            if self._committed.get(partition, (0, -1))[1] != floor_us:
                self._committed[partition] = (offset, floor_us)
        return out

    def publishable(self, partitions: Iterable[int]) -> tuple[dict[int, int], dict[int, int]]:
        """The pairs to publish for these partitions, those claimed: (partition -> offset, partition -> floor).
        Publish the offsets, then the floors, then the watermarks, each under `claims`, and nothing more of a
        partition once one is refused: a half-done publication never holds a floor too early, nor a watermark whose
        floor is unpublished."""
        pairs = {p: self._committed[p] for p in partitions if p in self._committed and p in self.claims}
        return {p: offset for p, (offset, _) in pairs.items()}, {p: floor for p, (_, floor) in pairs.items()}
