"""The arrival floor across a handover (`agents.arrival`): a worker that takes a partition over judges the records
after the previous owner's last committed heartbeat by that heartbeat, as the previous owner would have.

Without it (the review's F2), on a CreateTime broker a record appended after heartbeat H but stamped earlier was
dead-lettered by the owner that read H, and admitted by the next owner behind the rollup boundary H's watermark
had already let through: stored, never counted, never dead-lettered.

The real persist path and SQLite stores; only the DLQ broker is a fake (`FakeKafka`)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from agents.arrival import ArrivalFloors
from agents.persist import RawRecord
from agents.rollup import rollup_counter
from agents.watermark import HeartbeatPace, PartitionCount, WatermarkTracker, heartbeats_needed
from agents.worker import Pipeline, _persist
from control_plane import parse_namespaces
from schemas import MICROS, Mutation, MutationOp, encode_mutation
from schemas.record_headers import is_heartbeat
from sinks import InProcessRollupCache, Partitioning, SqliteEventStore, SqliteRollupStore, arrival_keys
from streams.settings import Settings
from tests.unit.test_persist_faults import FakeKafka

REGISTRY = parse_namespaces({"namespaces": {"ev": {"counter_type": "EVENTUAL", "accept_limit": "2s",
                                                    "max_clock_skew": "500ms"}}})
T = 1_790_000_000 * MICROS  # a record timestamp in the past: the persist path refuses one stamped ahead
TOPIC = Settings().mutations_topic


def heartbeat(offset: int, ts: int, partition: int = 0) -> RawRecord:
    return RawRecord(TOPIC, partition, offset, ts // 1000, None, b"", [("counter.heartbeat", b"1")])


def write(offset: int, stamped: int, token: str, partition: int = 0) -> RawRecord:
    m = Mutation("ev", "c", 1, stamped, token, "", MutationOp.ADD)
    return RawRecord(TOPIC, partition, offset, stamped // 1000, b"k", encode_mutation(m))


class Stack:
    """Two workers' pipelines over the same stores, one after the other owning partition 0."""

    def __init__(self, tmp_path: Path) -> None:
        part = Partitioning(4, 10, 60)
        self.events = SqliteEventStore(tmp_path / "e.db", lambda ns: part)
        self.rollups = SqliteRollupStore(tmp_path / "r.db")
        self.cache = InProcessRollupCache()

    def worker(self) -> Pipeline:
        p = Pipeline(settings=Settings(), registry=REGISTRY, events=self.events, rollups=self.rollups, buckets=None,
                     cache=None, app=None, topics=None, tracker=WatermarkTracker(0.5),
                     mutation_partitions=PartitionCount("m", 1),
                     pressure=None, kafka=FakeKafka(), signals=None, heartbeats=HeartbeatPace(1.0))
        p.owned_mutation_partitions = lambda: [0]  # type: ignore[method-assign]  # no consumer here
        return p

    async def count(self, watermark_us: int) -> int:
        result = await rollup_counter(REGISTRY["ev"], "c", events=self.events, rollups=self.rollups, cache=self.cache,
                                      watermark_us=watermark_us, now_us=T + 600 * MICROS)
        return result.count

    async def close(self) -> None:
        await self.events.close()
        await self.rollups.close()


def run(tmp_path: Path, scenario: Any) -> Any:
    async def main() -> Any:
        stack = Stack(tmp_path)
        try:
            return await scenario(stack)
        finally:
            await stack.close()
    return asyncio.run(main())


async def hand_over(stack: Stack) -> tuple[Pipeline, int]:
    """Owner A stores and commits heartbeat H (appended at T) and a write before it, publishes its watermark and a
    rollup passes the boundary it allows; A then loses partition 0. Returns the next owner and that count."""
    a = stack.worker()
    a.arrivals.assigned({0})
    await _persist(a, [write(0, T - 5 * MICROS, "early"), heartbeat(1, T)])
    a.offsets_committed({0: 2})
    await a.publish_watermarks()
    counted = await stack.count(await a.watermark())
    await a.forget_partitions({0})
    b = stack.worker()
    b.arrivals.assigned({0})
    return b, counted


def test_the_next_owner_dead_letters_a_record_stamped_behind_a_published_boundary(tmp_path: Path) -> None:
    async def scenario(stack: Stack) -> tuple[int, int, list[str], int]:
        b, counted = await hand_over(stack)
        late = write(2, T - 4 * MICROS, "late")  # appended after H, stamped 4 s before it (accept_limit 2 s)
        await _persist(b, [late, heartbeat(3, T + 20 * MICROS)])
        b.offsets_committed({0: 4})
        await b.publish_watermarks()
        reasons = [headers["dlq.reason"].decode() for _key, _value, headers in b.kafka.sent]
        return counted, await stack.count(await b.watermark()), reasons, len(await stack.events.scan(
            "ev", "c", 0, T + 600 * MICROS, limit=10))

    counted, final, reasons, stored = run(tmp_path, scenario)
    assert counted == 1  # the write before H
    assert len(reasons) == 1 and "4.000s before the record reached Kafka" in reasons[0], reasons
    assert stored == 1 and final == 1  # the late write is not in the store behind the boundary: it is in the DLQ


def test_the_floor_holds_only_from_the_offset_it_was_committed_at(tmp_path: Path) -> None:
    """With the group's offsets lost, the next owner re-reads from the start: the records before the committed
    offset are judged as the first owner judged them (admitted, not dead-lettered against H)."""
    async def scenario(stack: Stack) -> tuple[list[Any], Any]:
        b, _counted = await hand_over(stack)
        batch = [write(0, T - 5 * MICROS, "early"), write(2, T - 4 * MICROS, "late")]  # offset 1 is H, compacted
        await _persist(b, batch)
        return b.kafka.sent, b.arrivals.floor

    sent, floor = run(tmp_path, scenario)
    assert len(sent) == 1 and sent[0][2]["dlq.offset"] == b"2"
    assert floor == {0: T}


def test_a_heartbeat_counts_toward_the_watermark_once_committed_and_its_floor_is_published_first(
        tmp_path: Path) -> None:
    async def scenario(stack: Stack) -> list[dict[int, int]]:
        a = stack.worker()
        a.arrivals.assigned({0})
        await _persist(a, [heartbeat(0, T)])
        from_key, floor_key = arrival_keys(TOPIC)
        seen = []
        _, marks, _ = await a.publish_watermarks()
        seen.append(marks)  # stored, not committed: no watermark yet
        a.offsets_committed({0: 1})
        real = stack.rollups.set_watermarks
        order: list[str] = []

        async def recorded(key: str, marks: Any, **fence: Any) -> set[int]:
            order.append(key)
            return await real(key, marks, **fence)

        stack.rollups.set_watermarks = recorded  # type: ignore[method-assign]
        _, marks, _ = await a.publish_watermarks()
        seen.append(marks)
        seen.append({0: len(order)})
        seen.append(await stack.rollups.watermarks(from_key) | {1: order.index(from_key), 2: order.index(floor_key),
                                                                3: order.index(TOPIC)})
        return seen

    before, after, n, published = run(tmp_path, scenario)
    assert before == {}
    assert after == {0: T - MICROS // 2}
    assert n == {0: 3}  # offsets, floors, watermarks (no write yet)
    assert published == {0: 1, 1: 0, 2: 1, 3: 2}


def test_a_handover_waits_for_a_publication_in_flight(tmp_path: Path) -> None:
    async def scenario(stack: Stack) -> tuple[bool, bool]:
        a = stack.worker()
        a.arrivals.assigned({0})
        await _persist(a, [heartbeat(0, T)])
        a.offsets_committed({0: 1})
        real, release, entered = stack.rollups.set_watermarks, asyncio.Event(), asyncio.Event()

        async def slow(key: str, marks: Any, **fence: Any) -> set[int]:
            entered.set()
            await release.wait()
            return await real(key, marks, **fence)

        stack.rollups.set_watermarks = slow  # type: ignore[method-assign]
        publishing = asyncio.create_task(a.publish_watermarks())
        await entered.wait()
        forgetting = asyncio.create_task(a.forget_partitions({0}))
        await asyncio.sleep(0)
        waited = not forgetting.done()
        release.set()
        await asyncio.gather(publishing, forgetting)
        return waited, a.arrivals.floor == {}

    assert run(tmp_path, scenario) == (True, True)


def test_a_previous_owner_waking_after_the_handover_publishes_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The zombie ordering: owner A commits past heartbeat H, then stalls past its session; the group gives the
    partition to B, which loads the older published floor. A wakes and publishes H's floor and the watermark from H.
    Unfenced, a rollup then passed H's time while B admitted a record appended after H but stamped before it (B
    judges by the older floor): stored, never counted. The store refuses A's publication: B claimed first."""
    async def scenario(stack: Stack) -> tuple[int, set[int], dict[int, int], int, list[str]]:
        a = stack.worker()
        a.arrivals.assigned({0})
        await _persist(a, [write(0, T - 5 * MICROS, "early"), heartbeat(1, T)])
        a.offsets_committed({0: 2})
        await a.publish_watermarks()  # floor T from offset 2, watermark T - skew
        await _persist(a, [heartbeat(2, T + 10 * MICROS)])  # H
        a.offsets_committed({0: 3})  # ... and A stalls before publishing H; B takes partition 0 over
        b = stack.worker()
        b.partitions_assigned({0}, True)
        await _persist(b, [write(3, T + 11 * MICROS, "b-first")])  # B's first batch loads floor T, claimed first
        await a.publish_watermarks()  # A wakes: H's floor from offset 3, the watermark from H
        after_zombie = await stack.count(await b.watermark())  # a rollup runs at the watermark now stored
        late = write(4, T + 6 * MICROS, "late")  # appended after H, stamped 4 s before it (accept_limit 2 s)
        await _persist(b, [late, heartbeat(5, T + 20 * MICROS)])  # B judges by floor T: admitted
        b.offsets_committed({0: 6})
        await b.publish_watermarks()
        calls: list[str] = []
        real = stack.rollups.set_watermarks

        async def recorded(key: str, marks: Any, **fence: Any) -> set[int]:
            calls.append(key)
            return await real(key, marks, **fence)

        stack.rollups.set_watermarks = recorded  # type: ignore[method-assign]
        a.published.clear()  # as if all were new: only the unfenced key (the writes' times) goes out
        await a.publish_watermarks()  # A publishes nothing more of partition 0
        warnings = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
        return (after_zombie, set(a.arrivals.claims), await stack.rollups.watermarks(TOPIC),
                await stack.count(await b.watermark()), calls + warnings)

    after_zombie, claims, marks, final, calls = run(tmp_path, scenario)
    assert final == 3  # early, b-first and late: nothing stored behind a boundary already passed
    assert after_zombie == 1 and marks == {0: T + 20 * MICROS - MICROS // 2}  # B's: A's from H never landed
    assert claims == set()
    assert calls[:-1] == [f"{TOPIC}/written"] and "partition 0 refused" in calls[-1], calls  # logged once


def test_a_refused_worker_claims_again_without_publishing_what_it_saw_before(tmp_path: Path) -> None:
    """A refused worker claims the partition again with its next batch. From the dropped owner that is harmless: the
    heartbeat it committed before it stalled (H) must not make its watermark under the new claim, or the fence only
    delayed F2. From the owner it is what ends a late claimant's fence (a worker that stalled between its assignment
    and its claim, then died): without it, the owner's watermark stood still until the next rebalance."""
    async def scenario(stack: Stack) -> tuple[int, int, int, int]:
        a, b = stack.worker(), stack.worker()
        a.arrivals.assigned({0})
        await _persist(a, [write(0, T - 5 * MICROS, "early"), heartbeat(1, T)])
        a.offsets_committed({0: 2})
        await a.publish_watermarks()  # floor T from offset 2, watermark T - skew
        await _persist(a, [heartbeat(2, T + 10 * MICROS)])  # H
        a.offsets_committed({0: 3})  # A stalls before publishing H; B takes partition 0 over
        b.partitions_assigned({0}, True)
        await _persist(b, [write(3, T + 11 * MICROS, "b-first")])  # B claims, loads floor T
        await a.publish_watermarks()  # refused
        await _persist(a, [write(4, T + 12 * MICROS, "a-late")])  # A's next batch: A claims again, fencing B
        a.published.clear()
        await a.publish_watermarks()  # nothing from H: its commits since are refused by the group, so none here
        after_a = (await stack.rollups.watermarks(TOPIC))[0]
        late_claimant = stack.worker()  # stalled between its assignment and its claim, then died
        late_claimant.arrivals.assigned({0})
        await _persist(late_claimant, [write(5, T + 13 * MICROS, "c")])
        await _persist(b, [write(6, T + 6 * MICROS, "late")])  # B judges by floor T: admitted
        b.offsets_committed({0: 7})
        await b.publish_watermarks()  # refused: another claim is the latest
        await _persist(b, [heartbeat(7, T + 20 * MICROS)])  # B claims again
        b.offsets_committed({0: 8})
        await b.publish_watermarks()
        mark = (await stack.rollups.watermarks(TOPIC))[0]
        return after_a, mark, await stack.count(mark), len(b.arrivals.claims)

    after_a, mark, count, b_claims = run(tmp_path, scenario)
    assert after_a == T - MICROS // 2  # A published no watermark from H under its second claim
    assert mark == T + 20 * MICROS - MICROS // 2 and b_claims == 1  # B publishes again
    assert count == 5  # early, b-first, a-late, c and late: nothing behind a boundary already passed


def test_a_commit_reply_that_comes_after_a_refusal_publishes_nothing(tmp_path: Path) -> None:
    """A dropped worker's commit that the broker applied before the group moved on, but whose reply came only after
    the worker's publication was refused (a reply delayed on the network): counted, it made a floor and a watermark
    that the worker published under the claim it took again, past the floor the next owner judges by."""
    async def scenario(stack: Stack) -> tuple[dict[int, int], int, int]:
        a = stack.worker()
        a.arrivals.assigned({0})
        await _persist(a, [write(0, T - 5 * MICROS, "early"), heartbeat(1, T)])
        a.offsets_committed({0: 2}, 1)
        await a.publish_watermarks()  # floor T, watermark T - skew
        await _persist(a, [heartbeat(2, T + 10 * MICROS)])  # H1
        a.offsets_committed({0: 3}, 2)  # not published yet
        await _persist(a, [heartbeat(3, T + 20 * MICROS)])  # H2: commit 3 (of offset 4) sent, its reply delayed
        b = stack.worker()
        b.partitions_assigned({0}, True)
        await _persist(b, [write(4, T + 21 * MICROS, "b-first")])  # B claims, loads floor T
        a._commits_sent = lambda: 3  # type: ignore[method-assign]  # as the persist consumer would count them
        await a.publish_watermarks()  # refused
        a.offsets_committed({0: 4}, 3)  # the late reply
        await _persist(a, [write(5, T + 22 * MICROS, "a-next")])  # A claims again
        await a.publish_watermarks()
        mark = (await stack.rollups.watermarks(TOPIC))[0]
        await _persist(b, [write(5, T + 22 * MICROS, "a-next"), write(6, T + 16 * MICROS, "late"),
                           heartbeat(7, T + 30 * MICROS)])  # B judges by floor T: "late" admitted
        b.offsets_committed({0: 8})
        await b.publish_watermarks()  # refused (A's claim), B claims again with its next batch
        await _persist(b, [heartbeat(8, T + 40 * MICROS)])
        b.offsets_committed({0: 9})
        await b.publish_watermarks()
        return await stack.rollups.watermarks(arrival_keys(TOPIC)[1]), mark, await stack.count(await b.watermark())

    floors, mark_after_a, count = run(tmp_path, scenario)
    assert mark_after_a == T - MICROS // 2  # nothing from H2 under A's second claim
    assert count == 4  # early, b-first, a-next and late
    assert floors == {0: T + 40 * MICROS}  # B's


def test_a_load_retried_after_a_failed_read_keeps_its_claims(tmp_path: Path) -> None:
    """A load whose reads failed claimed again at every retry: from a worker the group dropped, whose revoke waits
    for the batch it retries, each retry fenced the owner once more."""
    class FlakyReads(SqliteRollupStore):
        claims_taken = 0
        reads_to_fail = 1

        async def claim_partitions(self, topic: str, partitions: Any) -> dict[int, int]:
            self.claims_taken += 1
            return await super().claim_partitions(topic, partitions)

        async def watermarks(self, topic: str) -> dict[int, int]:
            if self.reads_to_fail:
                self.reads_to_fail -= 1
                raise OSError("store away")
            return await super().watermarks(topic)

    async def scenario() -> tuple[int, dict[int, int], dict[int, int]]:
        store = FlakyReads(tmp_path / "r.db")
        try:
            floors = ArrivalFloors()
            floors.assigned({0, 1})
            with pytest.raises(OSError):
                await floors.load(store, TOPIC)
            first = dict(floors.claims)
            await floors.load(store, TOPIC)
            return store.claims_taken, first, floors.claims
        finally:
            await store.close()

    taken, first, claims = asyncio.run(scenario())
    assert taken == 1 and set(first) == {0, 1} and claims == first


def test_a_worker_given_a_partition_back_publishes_no_watermark_past_the_published_floor(tmp_path: Path) -> None:
    """A revoke commits the batches in hand, so the heartbeats they hold count toward the worker's watermark though
    their floor is never published; given the partition back, the worker must not publish that watermark: the owner
    in between started from the older floor, and so does the worker."""
    async def scenario(stack: Stack) -> tuple[dict[int, int], dict[int, int]]:
        a = stack.worker()
        a.arrivals.assigned({0})
        await _persist(a, [heartbeat(0, T)])
        a.offsets_committed({0: 1})
        await a.publish_watermarks()  # floor T, watermark T - skew
        await _persist(a, [heartbeat(1, T + 10 * MICROS)])
        a.offsets_committed({0: 2})  # the revoke's last commit: not published
        await a.forget_partitions({0})
        b = stack.worker()
        b.arrivals.assigned({0})
        await _persist(b, [write(2, T + 11 * MICROS, "b")])  # loads floor T; no heartbeat before B loses it
        b.offsets_committed({0: 3})
        await b.publish_watermarks()
        await b.forget_partitions({0})
        a.arrivals.assigned({0})
        await _persist(a, [write(3, T + 12 * MICROS, "a")])
        await a.publish_watermarks()
        _from_key, floor_key = arrival_keys(TOPIC)
        return await stack.rollups.watermarks(floor_key), await stack.rollups.watermarks(TOPIC)

    floors, marks = run(tmp_path, scenario)
    assert floors == {0: T} and marks == {0: T - MICROS // 2}


# ArrivalFloors alone


def test_seeds_go_before_the_first_record_at_or_past_their_offset_of_each_partition() -> None:
    floors = ArrivalFloors()
    floors._seeds = {0: (5, T), 1: (2, T + MICROS)}
    records = [write(3, T, "a"), write(5, T, "b"), write(6, T, "c"), write(1, T, "d", 1), write(2, T, "e", 1),
               write(9, T, "f", 2)]
    out, seeded = floors.with_seeds(records)
    assert seeded == {0, 1}
    shape = [(r.partition, r.offset, is_heartbeat(r.headers), r.timestamp) for r in out]
    assert shape == [(0, 3, False, T // 1000), (0, 4, True, T // 1000), (0, 5, False, T // 1000),
                     (0, 6, False, T // 1000), (1, 1, False, T // 1000), (1, 1, True, (T + MICROS) // 1000),
                     (1, 2, False, T // 1000), (2, 9, False, T // 1000)]
    floors.stored([(0, T), (1, T + MICROS)], seeded)
    assert floors.with_seeds(records) == (records, set())  # applied once


def test_a_seed_waits_for_its_offset_and_is_dropped_with_its_partition() -> None:
    floors = ArrivalFloors()
    floors._seeds = {0: (10, T)}
    records = [write(3, T, "a"), write(4, T, "b")]
    assert floors.with_seeds(records) == (records, set())
    floors.revoked({0})
    assert floors._seeds == {}
    assert floors.with_seeds([write(10, T, "c")])[1] == set()


def test_committed_publishes_a_pair_only_when_the_floor_moves() -> None:
    floors = ArrivalFloors()
    assert floors.committed({0: 5}) == {}  # no heartbeat yet: nothing for the watermark
    floors.stored([(0, T)], ())
    assert floors.committed({0: 7}) == {0: T}
    assert floors.committed({0: 9}) == {0: T}
    assert floors.publishable([0, 1]) == ({}, {})  # not claimed (`load` claims): nothing to publish under
    floors.claims[0] = 1
    assert floors.publishable([0, 1]) == ({0: 7}, {0: T})  # the offset it was first committed at
    floors.stored([(0, T + MICROS), (0, T - MICROS)], ())
    floors.committed({0: 12})
    assert floors.publishable([0]) == ({0: 12}, {0: T + MICROS})


def test_load_takes_the_published_pairs_of_newly_assigned_partitions(tmp_path: Path) -> None:
    async def scenario(stack: Stack) -> tuple[dict[int, Any], dict[int, Any]]:
        from_key, floor_key = arrival_keys(TOPIC)
        await stack.rollups.set_watermarks(from_key, {0: 7, 1: 3})
        await stack.rollups.set_watermarks(floor_key, {0: T, 1: T})
        floors = ArrivalFloors()
        floors.assigned({0})
        floors.floor[0] = T + MICROS  # already past it
        await floors.load(stack.rollups, TOPIC)
        first = dict(floors._seeds)
        floors.assigned({1, 2})
        await floors.load(stack.rollups, TOPIC)
        return first, dict(floors._seeds)

    first, second = run(tmp_path, scenario)
    assert first == {}
    assert second == {1: (3, T)}


def test_a_handover_asks_for_heartbeats_past_what_the_previous_owner_persisted(tmp_path: Path) -> None:
    """The previous owner persisted and committed a write, then lost the partition (or crashed) before its tick
    published when that write reached Kafka: without the ask, no worker needed heartbeats for it, the watermark
    stood below it and it waited for some later write to be rolled up."""
    async def scenario(stack: Stack) -> tuple[bool, bool]:
        a = stack.worker()
        await _persist(a, [heartbeat(0, T), write(1, T + MICROS, "w")])
        a.offsets_committed({0: 2})
        await a.forget_partitions({0})  # no tick ran: the write's time was never published
        b = stack.worker()
        assigned_at = time.time_ns() // 1000
        b.partitions_assigned({0}, True)
        owned, marks, _ = await b.publish_watermarks()
        covering = await b.covering()
        return (covering is not None and heartbeats_needed(marks, owned, covering),
                covering is not None and covering > assigned_at)  # past anything persisted before it

    assert run(tmp_path, scenario) == (True, True)
