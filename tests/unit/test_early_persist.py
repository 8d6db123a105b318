"""query_api.early_persist: which writes the API may store itself, that they are exactly the worker's events, that a
counter's recent writes come along, and that a loop pass's stores and counts share one store call (real SQLite
store)."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Sequence

import pytest

from agents.persist import RawRecord, prepare
from control_plane import default_config_path, load_namespaces
from query_api.early_persist import EarlyPersist, admissible, eligible, event_row
from schemas import Mutation, MutationOp, encode_mutation
from sinks import Partitioning, SqliteEventStore
from sinks.model import Aggregate, EventRow

REGISTRY = load_namespaces(default_config_path())
NS = REGISTRY["my_dataset"]  # accept_limit 5 s, max_clock_skew 1 s
S = 1_000_000
PART = Partitioning(buckets_per_id=4, seconds_per_bucket=10, seconds_per_slice=60)


class CountingStore(SqliteEventStore):
    """The real store, recording each write_and_aggregate call (rows, namespace, windows) and failing on demand."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.calls: list[tuple[int, str, int]] = []
        self.fail = False

    async def write_and_aggregate(self, rows: Sequence[EventRow], namespace: str,
                                  windows: Sequence[tuple[str, int, int]]) -> list[Aggregate]:
        self.calls.append((len(rows), namespace, len(windows)))
        if self.fail:
            raise ConnectionError("store unreachable")
        return await super().write_and_aggregate(rows, namespace, windows)


@pytest.fixture
def events(tmp_path):
    store = CountingStore(tmp_path / "events.sqlite3", lambda ns: PART)
    yield store
    asyncio.run(store.close())


def now_us() -> int:
    return time.time_ns() // 1000


def mutation(counter: str, delta: int, token: str, at: int, op: MutationOp = MutationOp.ADD,
             namespace: str = NS.name) -> Mutation:
    return Mutation(namespace, counter, delta if op is MutationOp.ADD else 0, at, token, "", op)


def acknowledged(ok: bool = True, stamp_us: int | None = None) -> asyncio.Future[int | None]:
    """A record's acknowledgement: None, or the record's timestamp when it disagreed with the API's clock."""
    future: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
    future.set_result(stamp_us) if ok else future.set_exception(ConnectionError("no broker"))
    return future


def test_admissible_keeps_a_margin_of_two_clock_skews_inside_accept_limit() -> None:
    now = 1_700_000_000 * S
    assert admissible(NS, now, now)
    assert admissible(NS, now - 3 * S, now)  # 3 s + 2 x 1 s = accept_limit 5 s
    assert not admissible(NS, now - 3 * S - 1, now)
    assert admissible(NS, now + S, now) and not admissible(NS, now + S + 1, now)  # from the future: max skew


def test_only_namespaces_whose_writes_are_plain_events_are_eligible() -> None:
    assert eligible(REGISTRY["my_dataset"]) and eligible(REGISTRY["my_dataset_accurate"])
    assert not eligible(REGISTRY["plays"])  # dimensions: the worker expands clears to combinations
    assert not eligible(REGISTRY["visitors"])  # UNIQUE: adds carry items


def test_the_row_is_the_event_the_worker_stores_from_the_record() -> None:
    at = now_us()
    ms = [mutation("c", 7, "t-add", at), mutation("c", 0, "t-clear", at + 1, MutationOp.CLEAR),
          Mutation(NS.name, "c", -3, at + 2, "t-key", "k")]
    records = [RawRecord("counter-mutations", 0, i, at // 1000 + 5, None, encode_mutation(m))
               for i, m in enumerate(ms)]
    assert [event_row(m) for m in ms] == prepare(records, REGISTRY).rows

    async def noted() -> list:  # and what `rows` gives of the noted writes is exactly those rows
        early = EarlyPersist(None)  # type: ignore[arg-type]  # rows() never touches the store
        for m in ms:
            early.note(m, acknowledged())
        return early.rows(NS, "c")
    assert asyncio.run(noted()) == prepare(records, REGISTRY).rows


def test_rows_are_the_counters_acknowledged_admissible_writes_of_the_last_recent_s(events) -> None:
    async def scenario() -> None:
        early = EarlyPersist(events, recent_s=0.2)
        at = now_us()
        early.note(mutation("c", 1, "old", at - 4 * S), acknowledged())  # beyond the admission margin
        early.note(mutation("c", 2, "failed", at), acknowledged(ok=False))
        in_flight: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        early.note(mutation("c", 3, "in-flight", at), in_flight)
        early.note(mutation("c", 0, "clear", at, MutationOp.CLEAR), acknowledged())
        early.note(mutation("other", 5, "other", at), acknowledged())
        assert [r[3] for r in early.rows(NS, "c")] == ["clear"]
        in_flight.set_result(None)
        assert [r[3] for r in early.rows(NS, "c")] == ["in-flight", "clear"]
        await asyncio.sleep(0.15)
        early.note(mutation("c", 4, "later", now_us()), acknowledged())  # within recent_s: nothing forgotten
        assert [r[3] for r in early.rows(NS, "c")] == ["in-flight", "clear", "later"]
        await asyncio.sleep(0.1)
        early.note(mutation("c", 4, "last", now_us()), acknowledged())  # the first writes are 0.25 s old now
        assert [r[3] for r in early.rows(NS, "c")] == ["later", "last"]
        await asyncio.sleep(0.25)
        early.note(mutation("new", 1, "new", now_us()), acknowledged())  # noting forgets what is older
        assert early.rows(NS, "c") == [] and early.rows(NS, "other") == []
        assert [r[3] for r in early.rows(NS, "new")] == ["new"]
    asyncio.run(scenario())


def test_noting_keeps_no_objects_the_collector_tracks(events) -> None:
    """A sliding window of tracked objects (new ones kept, old ones freed) keeps the collector's allocation count
    flat while its young generation grows, until one collection scans them all: a stall of every request in flight.
    Whatever note keeps per write must be plain values: 20,000 writes may leave only a handful of tracked objects."""
    async def scenario() -> None:
        early = EarlyPersist(events, recent_s=60)
        at = now_us()
        writes = [mutation(f"c{i % 100}", 1, f"t{i}", at + i) for i in range(20_000)]
        records = [acknowledged() for _ in range(200)]
        gc.collect()
        before = len(gc.get_objects())
        for i, m in enumerate(writes):
            early.note(m, records[i // 100])
        del m
        gc.collect()
        assert len(gc.get_objects()) - before < 500  # 100 per-counter deques and their dict; was 20,000+
        assert [r[3] for r in early.rows(NS, "c7")] == [f"t{i}" for i in range(7, 20_000, 100)]
    asyncio.run(scenario())


def test_one_store_call_per_pass_and_the_next_ones_gather_while_it_runs(events) -> None:
    async def scenario() -> None:
        early = EarlyPersist(events)
        at = now_us()

        def store(m: Mutation, rollup: int = 100) -> asyncio.Future[int]:
            return early.store_and_count([event_row(m)], m.namespace, m.counter_name, rollup, at - 1, at + 10)

        first = [store(mutation(f"c{i}", i + 1, f"t{i}", at)) for i in range(5)]
        assert await asyncio.gather(*first) == [101, 102, 103, 104, 105]  # the rollup plus the stored event
        assert events.calls == [(5, NS.name, 5)]
        second = [store(mutation("c0", 1, f"u{i}", at + i)) for i in range(3)]
        second.append(store(mutation("c0", 1, "u0", at)))  # the same event again
        # each count includes every row of the call (t0 of the first pass, u0-u2 once: idempotent)
        assert await asyncio.gather(*second) == [104] * 4
        assert events.calls == [(5, NS.name, 5), (4, NS.name, 4)]
    asyncio.run(scenario())


def test_writes_this_process_stored_are_not_stored_again(events) -> None:
    """An AddAndGetCount brings the counter's recent writes along, but not those an earlier one already stored;
    a failed store leaves them to come along again."""
    async def scenario() -> None:
        early = EarlyPersist(events, recent_s=0.2)
        at = now_us()
        for i in range(3):
            early.note(mutation("c", 1, f"t{i}", at + i), acknowledged())
        rows = early.rows(NS, "c")
        assert [r[3] for r in rows] == ["t0", "t1", "t2"]
        events.fail = True
        with pytest.raises(ConnectionError):
            await early.store_and_count(rows, NS.name, "c", 0, at - 1, at + 10)
        assert [r[3] for r in early.rows(NS, "c")] == ["t0", "t1", "t2"]  # not stored: they come along again
        events.fail = False
        assert await early.store_and_count(rows, NS.name, "c", 0, at - 1, at + 10) == 3
        early.note(mutation("c", 1, "t3", at + 3), acknowledged())
        assert [r[3] for r in early.rows(NS, "c")] == ["t3"]
        assert await early.store_and_count(early.rows(NS, "c"), NS.name, "c", 0, at - 1, at + 10) == 4  # all four
        assert early.rows(NS, "c") == []
        await asyncio.sleep(0.25)
        early.note(mutation("d", 1, "u", now_us()), acknowledged())  # noting forgets what is older, stored ones too
        assert [g.writes.keys() for g in early._generations] == [{"my_dataset:d"}]
    asyncio.run(scenario())


def test_a_stored_event_hides_only_itself_not_another_with_its_token(events) -> None:
    """Stored events are remembered by counter and token with their time: a second event of the counter under the
    same token and another time is still brought along, and a stored one is not (counts stay exact either way, the
    store being idempotent; leaving one out would not be)."""
    async def scenario() -> None:
        early = EarlyPersist(events)
        at = now_us()
        early.note(mutation("c", 1, "same", at), acknowledged())
        first = early.rows(NS, "c")
        assert await early.store_and_count(first, NS.name, "c", 0, at - 1, at + 10) == 1
        early.note(mutation("c", 1, "same", at + 5), acknowledged())
        early.note(mutation("other", 1, "same", at), acknowledged())  # the token of another counter: not stored
        assert [(r[2], r[3]) for r in early.rows(NS, "c")] == [(at + 5, "same")]
        assert [(r[1], r[2]) for r in early.rows(NS, "other")] == [("other", at)]
    asyncio.run(scenario())


def test_writes_acknowledged_out_of_order_each_come_along_once(events) -> None:
    """rows() skips the prefix of a counter's writes it found stored; a write acknowledged after a later one was
    stored is still brought along, once."""
    async def scenario() -> None:
        early = EarlyPersist(events)
        at = now_us()
        late: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        early.note(mutation("c", 1, "a", at), late)  # its record not acknowledged yet
        early.note(mutation("c", 1, "b", at + 1), acknowledged())
        rows = early.rows(NS, "c")
        assert [r[3] for r in rows] == ["b"]
        await early.store_and_count(rows, NS.name, "c", 0, at - 1, at + 10)
        assert early.rows(NS, "c") == []
        late.set_result(None)
        rows = early.rows(NS, "c")
        assert [r[3] for r in rows] == ["a"]
        await early.store_and_count(rows, NS.name, "c", 0, at - 1, at + 10)
        early.note(mutation("c", 1, "d", at + 2), acknowledged())
        assert [r[3] for r in early.rows(NS, "c")] == ["d"]
        assert [r[3] for r in early.rows(NS, "c")] == ["d"], "a second look finds the same"
    asyncio.run(scenario())


def test_the_first_namespaces_call_stores_every_row_and_a_clear_replaces_the_rollup(events) -> None:
    other = REGISTRY["my_dataset_accurate"].name

    async def scenario() -> None:
        early = EarlyPersist(events)
        at = now_us()
        rows = [event_row(mutation("c", 5, "a", at)), event_row(mutation("c", 0, "k", at + 1, MutationOp.CLEAR)),
                event_row(mutation("c", 2, "b", at + 2))]
        counts = [early.store_and_count(rows, NS.name, "c", 100, at - 1, at + 10),
                  early.store_and_count([event_row(mutation("d", 3, "x", at, namespace=other))], other, "d", 7,
                                        at - 1, at + 10)]
        assert await asyncio.gather(*counts) == [2, 10]  # after the clear only the add after it; 7 + 3
        assert events.calls == [(4, NS.name, 1), (0, other, 1)]
    asyncio.run(scenario())


def test_a_store_error_reaches_every_waiter_of_the_call_and_the_next_one_works(events) -> None:
    async def scenario() -> None:
        early = EarlyPersist(events)
        at = now_us()
        events.fail = True
        failed = await asyncio.gather(*(early.store_and_count([event_row(mutation("c", 1, f"t{i}", at))], NS.name,
                                                              "c", 0, at - 1, at) for i in range(3)),
                                      return_exceptions=True)
        assert all(isinstance(f, ConnectionError) for f in failed)
        events.fail = False
        assert await early.store_and_count([event_row(mutation("c", 1, "t0", at))], NS.name, "c", 0, at - 1, at) == 1
        assert [c[0] for c in events.calls] == [3, 1] and (await events.aggregate(NS.name, "c", at - 1, at)).delta == 1
    asyncio.run(scenario())


class Unreadable:
    """A WriteProgress whose offsets cannot be read (the broker away, no right to describe the persist group)."""

    def started(self) -> int:
        return 1

    def settled(self) -> int:
        return 1

    def acked_ends(self) -> dict[int, int]:
        return {0: 1}

    def readable(self) -> bool:
        return False

    def covers(self, ends: dict[int, int]) -> bool:
        raise AssertionError("covers asked though the offsets are not readable")


def test_without_readable_offsets_a_forgotten_write_blocks_and_nothing_else_does(events) -> None:
    """Offsets not read lately (an idle process's poll sleeps, or the broker refuses them): no generation is passed
    over, and only a write forgotten meanwhile blocks the early path, since the worker may not have it: the call
    then waits for the worker (an AddAndGetCount answered 1 for a count of 501 when this did not block)."""
    async def scenario() -> None:
        early = EarlyPersist(events, recent_s=0.2, progress=Unreadable())
        early.note(mutation("c", 1, "old", now_us()), acknowledged())
        rows = early.rows(NS, "c")
        assert not rows.blocked and [r[3] for r in rows] == ["old"]  # nothing forgotten: no need of offsets
        for generation in early._generations:  # as if 0.3 s had passed
            generation.ends -= 0.3
        early.note(mutation("c", 2, "new", now_us()), acknowledged())  # forgets "old"
        assert early.rows(NS, "c").blocked
    asyncio.run(scenario())


def test_a_write_its_records_timestamp_refuses_is_never_stored_here_and_blocks_nothing(events) -> None:
    """An acknowledgement that settles with its record's timestamp (the broker's clock disagreed with the API's,
    producers.group_commit) is judged by it: the worker dead-letters a write dated 2 s after it, so storing it here
    would count a write its client was answered 503 for; one the worker admits is stored as any."""
    async def scenario() -> None:
        early = EarlyPersist(events, recent_s=10.0)
        at = now_us()
        early.note(mutation("c", 1, "ahead-of-broker", at), acknowledged(stamp_us=at - 2 * S))
        early.note(mutation("c", 2, "admitted", at), acknowledged(stamp_us=at - S // 2))
        early.note(mutation("c", 4, "agreed", at), acknowledged())
        rows = early.rows(NS, "c")
        assert [r[3] for r in rows] == ["admitted", "agreed"] and not rows.blocked
    asyncio.run(scenario())
