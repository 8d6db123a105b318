"""AddAndGetCount's count includes the client's earlier acknowledged writes, and never an event the worker refuses,
in the cases where the API may not store them itself (query_api.early_persist): the real CounterService,
EarlyPersist and SQLite stores; the producer is a fake that acknowledges at once and keeps the mutations, and the
worker is `agents.persist.prepare` run on them as records that reached Kafka at a chosen time."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from agents.persist import PreparedBatch, RawRecord, prepare
from control_plane import default_config_path, load_namespaces
from query_api.early_persist import EarlyPersist
from query_api.service import CounterService, NotCountedYet
from schemas import Mutation, MutationOp, encode_mutation
from sinks import Partitioning, SqliteEventStore
from sinks.memory.rollup_cache import InProcessRollupCache
from sinks.sqlite.rollups import SqliteRollupStore

REGISTRY = load_namespaces(default_config_path())
NS = REGISTRY["my_dataset_accurate"]  # accept_limit 5 s, max_clock_skew 1 s
S = 1_000_000
PART = Partitioning(buckets_per_id=4, seconds_per_bucket=10, seconds_per_slice=60)


class KeepingProducer:
    """Acknowledges every record at once and keeps its mutations for the worker (in `sent`: the topic, shared by
    the producers of API processes that share the pipeline)."""

    def __init__(self, sent: list[Mutation] | None = None) -> None:
        self.sent: list[Mutation] = [] if sent is None else sent

    def send(self, mutations: list[Mutation], *, read_your_write: bool = False) -> asyncio.Future[None]:
        self.sent.extend(mutations)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future


class WorkerOffsets:
    """`early_persist.WriteProgress` over `KeepingProducer`: each send is one record of partition 0, acknowledged
    at once; the worker has persisted the records before `persisted` (moved by `Stack.worker`)."""

    def __init__(self, producer: KeepingProducer) -> None:
        self.producer = producer
        self.persisted = 0
        self.ends_fail: Exception | None = None  # what reading the topic's end offsets raises
        self.waited: list[dict[int, int]] = []  # the ends a call waited for
        self.fresh = True  # readable(): offsets read lately (False: just started, or idle for a while)
        self.failing = False

    def started(self) -> int:
        return len(self.producer.sent)

    def settled(self) -> int:
        return len(self.producer.sent)

    def acked_ends(self) -> dict[int, int]:
        return {0: len(self.producer.sent)}

    def covers(self, ends: dict[int, int]) -> bool:
        return self.persisted >= ends.get(0, 0)

    def readable(self) -> bool:
        return self.fresh

    async def topic_ends(self) -> dict[int, int]:
        if self.ends_fail is not None:
            raise self.ends_fail
        return {0: len(self.producer.sent)}  # the topic: every process's records

    async def wait_covers(self, ends: dict[int, int], timeout_s: float) -> bool:
        self.waited.append(dict(ends))
        self.fresh = True  # a wait makes the poll read at once
        deadline = time.monotonic() + timeout_s
        while not self.covers(ends):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.001)
        return True


def age(early: EarlyPersist, seconds: float) -> None:
    """As if `seconds` had passed for the writes noted so far (their generations end that much earlier)."""
    for generation in early._generations:
        generation.ends -= seconds


class NoSignals:
    def emit(self, *_args: object) -> None:
        pass


def now_us() -> int:
    return time.time_ns() // 1000


async def until(condition: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.001)


class Stack:
    def __init__(self, tmp: Path, recent_s: float = 2.0, timeout_s: float = 5.0, offsets: bool = False,
                 shared: bool = False) -> None:
        self.events = SqliteEventStore(tmp / "events.sqlite3", lambda _ns: PART)
        self.rollups = SqliteRollupStore(tmp / "rollups.sqlite3")
        self.recent_s, self.timeout_s, self.shared = recent_s, timeout_s, shared
        self.producer = KeepingProducer()
        self.progress = WorkerOffsets(self.producer) if offsets else None
        self.svc = self.api(self.producer, self.progress)

    def api(self, producer: KeepingProducer, progress: WorkerOffsets | None) -> CounterService:
        svc = CounterService(REGISTRY, producer=producer, signals=NoSignals(),  # type: ignore[arg-type]
                             events=self.events, rollups=self.rollups, cache=InProcessRollupCache(),
                             counters=None, read_your_write_timeout_s=self.timeout_s,  # type: ignore[arg-type]
                             progress=progress, shared_pipeline=self.shared)  # type: ignore[arg-type]
        svc.early = EarlyPersist(self.events, recent_s=self.recent_s, progress=progress)  # type: ignore[arg-type]
        return svc

    def peer(self) -> CounterService:
        """Another API process of the same pipeline: its records go to the same topic, and the worker's progress
        is the same."""
        return self.api(KeepingProducer(self.producer.sent), self.progress)

    async def worker(self, reached_kafka_us: int) -> PreparedBatch:
        """The persist path on every record sent so far, each having reached Kafka at `reached_kafka_us`."""
        records = [RawRecord("counter-mutations", 0, i, reached_kafka_us // 1000, None, encode_mutation(m))
                   for i, m in enumerate(self.producer.sent)]
        out = prepare(records, REGISTRY)
        await self.events.write_events(out.rows)
        if self.progress is not None:
            self.progress.persisted = len(records)
        return out

    async def add_and_get_with_worker(self, delta: int, token: str, generation_time: int | None = None,
                                      reached_kafka_us: int | None = None) -> tuple[int, PreparedBatch]:
        """AddAndGetCount while the worker persists what was sent (it may be waited for)."""
        before = len(self.producer.sent)
        answer: Awaitable = asyncio.ensure_future(self.svc.add_and_get(
            NS, "c", delta, token, now_us() if generation_time is None else generation_time))
        await until(lambda: len(self.producer.sent) > before, "the AddAndGetCount's record to be sent")
        persisted = await self.worker(now_us() if reached_kafka_us is None else reached_kafka_us)
        return (await answer).count, persisted

    async def close(self) -> None:
        await self.events.close()
        await self.rollups.close()


def run(tmp: Path, scenario, **kwargs: float | bool) -> None:
    async def main() -> None:
        stack = Stack(tmp, **kwargs)
        try:
            await stack.svc.inherit_earlier_writes()  # as the API's lifespan does at start
            await scenario(stack)
        finally:
            await stack.close()
    asyncio.run(main())


def test_an_earlier_write_this_process_may_not_store_is_waited_for_not_left_out(tmp_path: Path) -> None:
    """An AddCount dated 4 s back is accepted (accept_limit 5 s) but is past the API's own margin by the time of the
    AddAndGetCount: the count comes from the worker, with it, instead of from the API without it (was 1)."""
    async def scenario(stack: Stack) -> None:
        await stack.svc.write(NS, "c", 10, MutationOp.ADD, "w0", now_us() - 4 * S)
        count, persisted = await stack.add_and_get_with_worker(1, "w1")
        assert len(persisted.rows) == 2 and not persisted.dead
        assert count == 11
    run(tmp_path, scenario)


def test_an_earlier_clear_is_stored_with_the_write_before_the_worker_has_it(tmp_path: Path) -> None:
    """An acknowledged ClearCount the worker has not persisted yet comes along with the AddAndGetCount after it: the
    count is the new delta alone, not the events before the clear plus it (the worker does not run at all)."""
    async def scenario(stack: Stack) -> None:
        await stack.events.write_events([(NS.name, "c", now_us() - 2 * S, "old", "", 100, False)])
        await stack.svc.write(NS, "c", 0, MutationOp.CLEAR, "clear", now_us())
        assert (await stack.svc.add_and_get(NS, "c", 1, "w1", now_us())).count == 1
    run(tmp_path, scenario)


@pytest.mark.parametrize(("ahead_s", "refused"), [(0.5, False), (1.0, True)])
def test_an_event_dated_after_it_was_sent_is_the_workers_alone(tmp_path: Path, ahead_s: float, refused: bool) -> None:
    """A generation_time ahead of the API's clock (within max_clock_skew 1 s, so accepted) reaches a broker whose
    clock is 0.3 s behind: the worker refuses it 1 s ahead and admits it 0.5 s ahead. The API must not store it
    itself (it stored and counted the refused one before): the count is the worker's, or NotCountedYet."""
    async def scenario(stack: Stack) -> None:
        sent = now_us()
        event_time = sent + int(ahead_s * S)
        answer = asyncio.ensure_future(stack.svc.add_and_get(NS, "c", 1, "f1", event_time))
        await until(lambda: any(stack.svc.arrivals._waiting.values()), "the call to wait for the worker")
        assert await stack.events.contains(NS.name, [("c", event_time, "f1", "")]) == [False]
        persisted = await stack.worker(sent - 300_000 + 5_000)
        assert bool(persisted.dead) is refused
        if refused:
            with pytest.raises(NotCountedYet, match=r"^the write is durable \(token 'f1'\) but was not counted"):
                await answer  # as the wait said it (a review saw it nested in "the store could not be read")
            assert await stack.events.contains(NS.name, [("c", event_time, "f1", "")]) == [False]
        else:
            assert (await answer).count == 1
    run(tmp_path, scenario, timeout_s=0.5)


def test_a_clear_the_worker_has_not_persisted_is_counted_after_this_process_forgot_it(tmp_path: Path) -> None:
    """The worker lags past the time this process remembers its writes (recent_s; a restart, a rebalance): an
    acknowledged ClearCount is forgotten here and not in the store yet. The AddAndGetCount after it must not count
    the 100 events before the clear (it answered 101): it waits for the worker to have every earlier record of
    this process, by the offsets the worker has committed, then counts 1."""
    async def scenario(stack: Stack) -> None:
        await stack.events.write_events([(NS.name, "c", now_us() - 1 * S, "old", "", 100, False)])
        await stack.svc.write(NS, "c", 0, MutationOp.CLEAR, "clear", now_us())
        age(stack.svc.early, 0.2)  # past recent_s (0.1 s): the next write forgets the clear
        answer = asyncio.ensure_future(stack.svc.add_and_get(NS, "c", 1, "w1", now_us()))
        await until(lambda: answer.done() or any(stack.svc.arrivals._waiting.values()),
                    "an answer, or the call to wait for the worker")
        assert not answer.done(), f"answered {answer.result().count} without the worker"
        await stack.worker(now_us())
        assert (await answer).count == 1
    run(tmp_path, scenario, recent_s=0.1, offsets=True)


def test_writes_the_worker_has_persisted_are_passed_over_even_when_no_longer_admissible(tmp_path: Path) -> None:
    """A write dated 4 s back blocks the early path while the worker may not have it (the first test above);
    once the worker's offsets cover its record, it is in the store and the early path counts it from there
    (before, the call waited for a worker that does not run here: NotCountedYet)."""
    async def scenario(stack: Stack) -> None:
        await stack.svc.write(NS, "c", 10, MutationOp.ADD, "w0", now_us() - 4 * S)
        age(stack.svc.early, 0.3)  # a generation is 0.25 s (recent_s 2 s): the next write ends w0's
        await stack.svc.write(NS, "c", 1, MutationOp.ADD, "w1", now_us())
        await stack.worker(now_us())  # the worker persists both, and its offsets move past them
        age(stack.svc.early, 0.3)
        await stack.svc.write(NS, "other", 1, MutationOp.ADD, "x", now_us())  # turns the generations
        rows = stack.svc.early.rows(NS, "c")
        assert not rows.blocked and "w0" not in [r[3] for r in rows]  # w1 may come again: it is admissible
        assert (await stack.svc.add_and_get(NS, "c", 1, "w2", now_us())).count == 12
    run(tmp_path, scenario, offsets=True, timeout_s=0.5)


def test_a_shared_pipeline_counts_a_write_another_api_process_acknowledged(tmp_path: Path) -> None:
    """Two API processes share the pipeline: an AddCount acknowledged by one, which the worker has not persisted,
    is in the count of an AddAndGetCount through the other. That process cannot store the first write itself, so it
    waits for the worker to have every record up to the topic's end (it answered 1 from its own write alone)."""
    async def scenario(stack: Stack) -> None:
        await stack.peer().write(NS, "c", 10, MutationOp.ADD, "by-a", now_us())
        answer = asyncio.ensure_future(stack.svc.add_and_get(NS, "c", 1, "by-b", now_us()))
        await until(lambda: answer.done() or any(stack.svc.arrivals._waiting.values()),
                    "an answer, or the call to wait for the worker")
        assert not answer.done(), f"answered {answer.result().count} without the worker"
        assert stack.producer.sent[-1].event_id == "by-b"
        await stack.worker(now_us())
        assert (await answer).count == 11
    run(tmp_path, scenario, offsets=True, shared=True)


def test_a_shared_pipeline_whose_topic_ends_cannot_be_read_answers_not_counted_yet(tmp_path: Path) -> None:
    """Without the topic's end offsets, a count could miss another process's write: NotCountedYet (504, with the
    token to retry with), never a count from this process's writes alone."""
    async def scenario(stack: Stack) -> None:
        assert stack.progress is not None
        stack.progress.ends_fail = ConnectionError("broker away")
        with pytest.raises(NotCountedYet, match=r"end offsets could not be read .*broker away"):
            await stack.svc.add_and_get(NS, "c", 1, "by-b", now_us())
    run(tmp_path, scenario, offsets=True, shared=True)


@pytest.mark.parametrize("fresh", [True, False])
def test_an_earlier_write_the_worker_lacks_is_waited_for_where_the_api_does_not_store_events(
        tmp_path: Path, fresh: bool) -> None:
    """In a namespace where the API never stores events itself (dimensions: `eligible` is false), an AddAndGetCount
    waits for its own event to be persisted; group commit puts records on any partition, so the worker may have
    it before an earlier AddCount of the same counter. The call also waits for the worker to have every record this
    process had acknowledged before it (it answered 1 as soon as its own event was in the store), also when the
    worker's offsets were not read lately (`fresh` False: a process just started, or idle for a while)."""
    plays = REGISTRY["plays"]

    async def scenario(stack: Stack) -> None:
        assert stack.progress is not None
        stack.progress.fresh = fresh
        await stack.svc.write(plays, "c", 10, MutationOp.ADD, "w0", now_us())
        answer = asyncio.ensure_future(stack.svc.add_and_get(plays, "c", 1, "w1", now_us()))
        await until(lambda: len(stack.producer.sent) == 2, "the AddAndGetCount's record to be sent")
        own = prepare([RawRecord("counter-mutations", 1, 0, now_us() // 1000, None,
                                 encode_mutation(stack.producer.sent[1]))], REGISTRY)
        await stack.events.write_events(own.rows)  # the worker has the AddAndGetCount's record, not the AddCount's
        await until(lambda: answer.done() or bool(stack.progress.waited), "an answer, or the wait for the worker")
        assert not answer.done(), f"answered {answer.result().count} without the earlier write"
        assert stack.progress.waited == [{0: 2}]
        await stack.worker(now_us())
        assert (await answer).count == 11
    run(tmp_path, scenario, offsets=True)


def test_a_store_outage_after_the_acknowledgement_answers_504_with_the_writes_token(tmp_path: Path) -> None:
    """A review: an AddAndGetCount whose write the broker acknowledged (and the worker persisted), and whose count
    read then met the store away, answered 503 without a token, which says a write was not taken: the client's
    retry, a new write, counted it twice. It is a 504 naming the token the API drew now."""
    from query_api.responses import error_response
    from sinks.availability import StoreAway

    async def scenario(stack: Stack) -> None:
        async def away(*_args: object, **_kwargs: object) -> None:
            raise StoreAway("store locked")

        stack.rollups.get = away  # type: ignore[method-assign]  # the count's read, after the write
        answer = asyncio.ensure_future(stack.svc.add_and_get(NS, "c", 7, None, None))  # the API draws the token
        await until(lambda: len(stack.producer.sent) == 1, "the write sent")
        await stack.worker(now_us())
        with pytest.raises(NotCountedYet) as refused:
            await answer
        status, body = error_response(refused.value)
        [sent] = stack.producer.sent
        assert status == 504 and body["idempotency_token"] == {"token": sent.event_id,
                                                               "generation_time": sent.event_time}, body
        assert "store could not be read" in body["detail"]
    run(tmp_path, scenario, offsets=True, timeout_s=2)


def test_forgotten_writes_the_worker_has_do_not_block_the_early_path_for_stale_offsets(tmp_path: Path) -> None:
    """A CI run: the worker frozen after committing every record, an AddAndGetCount answered 504. A generation of
    writes was forgotten just then, and the offsets were not read lately (the poll loaded): `rows` blocked and the
    call waited for the frozen worker. One fresh read shows the worker has them: the call counts early."""
    async def scenario(stack: Stack) -> None:
        assert stack.progress is not None
        await stack.svc.write(NS, "c", 10, MutationOp.ADD, "w0", now_us())
        age(stack.svc.early, 5.0)  # past recent_s (2 s): forgotten at the next generation
        await stack.svc.write(NS, "other", 1, MutationOp.ADD, "x", now_us())  # turns the generations
        await stack.worker(now_us())  # the worker has both, and then freezes (it persists nothing more)
        assert stack.svc.early.forgotten is not None
        stack.progress.fresh = False  # offsets not read lately
        assert (await stack.svc.add_and_get(NS, "c", 1, "w1", now_us())).count == 11  # NotCountedYet before
        assert stack.progress.waited == [{0: 2}]
    run(tmp_path, scenario, offsets=True, timeout_s=0.5)


@pytest.mark.parametrize(("age_s", "advice"), [
    (1.0, r"a retry with the same token and generation_time before \S+, within accept_limit of it, is counted once"),
    (5.5, r"do not retry: the write is counted, and a retry with its token now is refused as older than namespace "
          r"'my_dataset_accurate''s accept_limit=5.0s"),
])
def test_a_504_says_whether_a_retry_is_still_taken(age_s: float, advice: str) -> None:
    """The multi-worker review: with accept_limit no longer than the read-your-write wait, a 504'd AddAndGetCount
    said a retry with its token is counted once, and every such retry was refused as too old (a 422). The 504 now
    tells the two apart by the write's age, and gives the last instant a retry is taken."""
    from query_api.service import Written, not_counted_yet

    event_time = now_us() - int(age_s * S)
    refused = not_counted_yet(Written(NS, "c", "t1", event_time), "it was slow")
    assert refused.identity == ("t1", event_time)
    assert str(refused).startswith("the write is durable (token 't1') but it was slow; GetCount will include it (")
    assert re.search(advice, str(refused)), str(refused)
