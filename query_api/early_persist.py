"""Read-your-write without waiting for the worker: AddAndGetCount's own event, stored by the API once the broker
has acknowledged the record holding it.

Why: waiting until the worker has persisted the write costs the persist consumer's fetch, its batch and the
lookup rounds (query_api.arrivals): p50 about 25 ms and p99 70-100 ms at concurrency 32 here, and more as the
local broker slows. The event stored here is the one the worker stores from the record, with the same identity
(counter, event time, token, item key) and delta, and the event store keeps the first write of an identity and
ignores the rest: storing it first changes no count. The worker's copy adds nothing, and its last_write_ts and
rollup signal follow as for any write. The record stays the source of truth (replays and recounts see it), and
the event is stored only once the broker acknowledged it.

No rollup can have passed the event: a rollup stops at a boundary below every event not yet persisted by the
worker (control_plane.admission.rollup_boundary), and this event is one of those until the worker stores it.
What must hold is that the worker admits it too, or the count would include an event the worker dead-letters:
`admissible` asks for the event time to be inside the namespace's accept_limit as of now with a margin of two
max_clock_skew (the record's timestamp and the worker's clock may differ from ours by that much), and `note` keeps
an event dated after the moment it was sent for the worker alone: its record reached Kafka after that moment, by
the broker's clock no earlier than one max_clock_skew before ours, so an event no later than it is never "after the
record reached Kafka" by more than the skew the worker allows. Writes that are not plain adds (dimensions, items)
or not admissible this way wait for the worker as before.

A client's earlier writes of the same counter come along. A ClearCount or an AddCount that this process had
acknowledged before may not be persisted by the worker yet; a count with the new delta but without the clear before
it would surprise the client. So `note` keeps, per counter, the rows of this process's durable writes of the last
`recent_s` (forgotten an eighth of it at a time, so up to 9/8 of it); `rows` gives those acknowledged and not yet
stored by this process, the new one among them, and `store` writes them in one transaction (all idempotent). When
`rows` finds an acknowledged write of the counter that this process may not store (not admissible any more, or dated
after it was sent), storing the others without it would leave it out of the count (`Rows.blocked`): the caller then
waits for the worker to persist its write, as before.

Which writes the worker has is decided by offsets (`WriteProgress`, query_api.persist_progress): once every record of
a generation is settled, the generation keeps the acknowledged ends per partition, and once the persist group's
committed offsets reach them, every write of it is in the store (or dead-lettered by the worker) and `rows` passes it
over. So writes stay remembered for `recent_s` (4 s in the API) though they stay admissible for less: a write the
worker has never blocks. A generation forgotten before the worker had it blocks the early path until the worker
has it; the call then waits for the worker, and for every record this process had acknowledged before it
(`CounterService.wait_worker_has`): with the worker lagging (a restart, a rebalance), an acknowledged ClearCount is in
the count (it answered 101 instead of 1 before). The persist watermark could not decide this: it trails by 1.3-2.9 s
under load (bench/RESULTS.md, eleventh session). Writes through another API process cannot be stored here: where
processes share the pipeline (`CounterService.shared_pipeline`), nothing is counted early, and AddAndGetCount waits
for the worker to reach the topic's end offsets instead (`CounterService.earlier_ends`).

Only namespaces where every durable write is one plain event qualify (`eligible`: no dimensions, whose clears
the worker expands to combinations, and not UNIQUE, whose adds carry items).

The writes of one loop pass share one store call, with their counts: the store writes them in one transaction
and then reads each counter's persisted events after its rollup (`EventStore.write_and_aggregate`), so an
AddAndGetCount costs one trip to the store, not a write and a live read. While one call is in flight the next
ones gather (as in group commit), so a burst costs a few calls, not one each. The rollup may be read before the
store: no rollup passes an event the worker has not persisted, so this event is after whichever rollup was read,
and the events a later rollup absorbed are still in the window read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Mapping
from typing import Any, Protocol

from control_plane import Namespace
from control_plane.admission import admission_error
from producers.group_commit import Acknowledgement
from schemas import MICROS, Mutation, MutationOp
from sinks import EventRow, EventStore
from sinks.model import apply_aggregate

log = logging.getLogger(__name__)


def admissible(ns: Namespace, event_time_us: int, now_us: int | None = None) -> bool:
    """Whether the worker is sure to admit an event of this time from a record acknowledged by now: its own rule
    (control_plane.admission) as if the record reached Kafka two max_clock_skew after now, and no later than one
    skew ahead of now."""
    now_us = time.time_ns() // 1000 if now_us is None else now_us
    skew_us = int(ns.max_clock_skew_s * MICROS)
    return admission_error(event_time_us, now_us + 2 * skew_us, ns) is None and event_time_us <= now_us + skew_us


def furthest(a: Mapping[int, int], b: Mapping[int, int]) -> dict[int, int]:
    """Per partition, the further of two sets of offsets (a partition in one only keeps its offset)."""
    return {p: max(a.get(p, 0), b.get(p, 0)) for p in a.keys() | b.keys()}


def eligible(ns: Namespace) -> bool:
    """Whether every durable write of the namespace is one plain event (what this module may store)."""
    return not ns.dimensions and not ns.counts_unique


def event_row(m: Mutation) -> EventRow:
    """The event the worker stores for a plain mutation (agents.persist.prepare)."""
    clear = m.op is MutationOp.CLEAR
    return (m.namespace, m.counter_name, m.event_time, m.event_id, m.event_item_key, 0 if clear else m.delta,
            clear)  # type: ignore[return-value]  # a durable write from the API has its time and token


_FIELDS = 6  # values kept per write in a generation (see _Generation)
_GENERATIONS = 8  # recent_s is kept in this many generations: a write is forgotten recent_s to 9/8 recent_s after
_WORKERS = object()  # in place of a write's acknowledgement future: the worker's to store, never this process's


_Count = tuple[str, str, int, int, int]  # namespace, counter, rollup count, after_us (its rollup_ts), upto_us


class WriteProgress(Protocol):
    """Where this process's records are, against what the worker has persisted (query_api.persist_progress)."""

    def started(self) -> int:
        """The number of the latest record the group commit started (a write joins the latest one)."""
        ...

    def settled(self) -> int:
        """Every record up to this number is acknowledged or failed."""
        ...

    def acked_ends(self) -> dict[int, int]:
        """Per partition, the offset after the latest record acknowledged."""
        ...

    def covers(self, ends: Mapping[int, int]) -> bool:
        """Whether the worker has persisted every record before these offsets."""
        ...

    def readable(self) -> bool:
        """Whether the worker's offsets are known now (else `rows` passes no generation over, and blocks on a
        forgotten write)."""
        ...


class Rows(list[EventRow]):
    """`EarlyPersist.rows`: the events to store, and where each is noted (its counter's flat list of writes and
    its offset there), so that `store_and_count` marks them stored in place once they are."""

    __slots__ = ("blocked", "places")

    def __init__(self) -> None:
        super().__init__()
        self.places: list[tuple[list[Any], int]] = []
        self.blocked = False  # an acknowledged write of the counter is not among them: this process may not store it


class _Generation:
    """The writes noted until `ends` (monotonic seconds).

    `writes`: per counter ("namespace:counter"; a namespace has no ':'), one flat list: first the offset where its
    writes not yet found stored begin, then its writes in sending order, _FIELDS values each (event time, token,
    item key, delta, clear flag, the record's acknowledgement future, which becomes None once this process stored
    the event, or `_WORKERS` for an event this process must not store): no object per write, so noting allocates
    nothing the garbage collector counts (see EarlyPersist). `rows` skips the prefix found stored, so an
    AddAndGetCount of a hot counter costs its writes since the last one, not all of the last recent_s, and one dict
    lookup per generation finds everything about a counter (the stored events were kept apart, by token, before:
    3-6 µs a call over 1,000 counters, 17% of the API's event loop under c=32 AddAndGetCount)."""

    __slots__ = ("acked", "ends", "last_record", "worker_has", "writes")

    def __init__(self, ends: float) -> None:
        self.ends = ends
        self.writes: dict[str, list[Any]] = {}
        self.last_record = -1  # the group commit's latest record when the generation ended (-1: not ended)
        self.acked: dict[int, int] | None = None  # the acknowledged ends, once every record up to it settled
        self.worker_has = False  # the worker has persisted every record of it: `rows` passes it over


class EarlyPersist:
    """`note` each durable write of an eligible namespace when it is sent; `rows` are a counter's recent writes
    that may be stored; `store_and_count(rows, ...)` stores them and answers the counter's count including them
    (group-committed per loop pass), or fails with the store's error (the caller then waits for the worker)."""

    def __init__(self, events: EventStore, *, recent_s: float = 2.0, progress: WriteProgress | None = None) -> None:
        self.events = events
        self.recent_s = recent_s
        self.progress = progress
        self._forgotten: dict[int, int] | None = None  # ends of forgotten writes the worker may not have yet
        # `note` runs on every durable write, so it must cost next to nothing: the last recent_s is kept in
        # generations of recent_s / _GENERATIONS, and forgetting drops a whole generation (no work per write).
        # Per write only plain values go into an existing list, never a new container object: the collector
        # counts allocations of container objects minus deallocations, so a sliding window of containers (new
        # ones kept, old ones freed) never triggers a collection while the young generation grows, until one
        # pass scans 100,000 of them (pauses of 25-70 ms at concurrency 32 here, under a quarter of AddCount's
        # slowest 1%).
        self._span = recent_s / _GENERATIONS
        self._generations: deque[_Generation] = deque([_Generation(time.monotonic() + self._span)])
        self._pending: list[tuple[list[EventRow], _Count, asyncio.Future[int]]] = []
        self._task: asyncio.Task[None] | None = None

    def inherit(self, ends: Mapping[int, int]) -> None:
        """Writes below `ends` were acknowledged to another process (this one's predecessor): `rows` blocks until
        the worker has them, as for this process's own forgotten writes (`CounterService.inherit_earlier_writes`)."""
        self._forgotten = furthest(self._forgotten or {}, ends)

    @property
    def forgotten(self) -> dict[int, int] | None:
        """The ends of forgotten (or inherited) writes the worker may not have yet: `rows` blocks until offsets read
        lately cover them."""
        return self._forgotten

    def note(self, m: Mutation, acknowledged: Acknowledgement) -> None:
        """Remember a durable write being sent (its future: the broker's acknowledgement of its record, shared
        by the writes that record holds)."""
        self.note_event(m.namespace, m.counter_name, event_row(m)[2:], acknowledged)

    def note_event(self, namespace: str, counter: str, event: tuple[int, str, str, int, bool],
                   acknowledged: Acknowledgement) -> None:
        """`note` for a write given as its event's time, token, item key, delta and clear flag (what the worker
        stores; a plain AddCount has no Mutation, query_api.plain_add). An event dated after now (a client's
        generation_time) is noted as the worker's alone: the worker may refuse it (see the module's docstring)."""
        dated_ahead = event[0] > time.time_ns() // 1000
        self.note_keyed(f"{namespace}:{counter}", event, _WORKERS if dated_ahead else acknowledged)

    def note_keyed(self, key: str, event: tuple[int, str, str, int, bool],
                   acknowledged: Acknowledgement | object) -> None:
        """`note_event` for the counter's key, "namespace:counter", and an event timed by this process as it was
        sent (built in C by `_plain_add.add_request`: no clock read here, on the hottest path)."""
        generation = self._generations[-1]
        if time.monotonic() >= generation.ends:
            generation = self._next_generation()
        writes = generation.writes.get(key)
        if writes is None:
            writes = generation.writes[key] = [1]  # nothing found stored yet: the writes begin at 1
        writes += event
        writes.append(acknowledged)

    def _next_generation(self) -> _Generation:
        """Start a generation, forgetting those wholly older than recent_s (a forgotten generation the worker may
        not have persisted yet blocks the early path until it has, see `rows`)."""
        now = time.monotonic()
        generations = self._generations
        progress = self.progress
        if progress is not None:
            generations[-1].last_record = progress.started()
            settled, ends = progress.settled(), None
            for g in generations:
                if g.acked is None and 0 <= g.last_record <= settled:
                    g.acked = ends = ends or progress.acked_ends()
        while generations and generations[0].ends <= now - self.recent_s:
            dropped = generations.popleft()
            if progress is not None and not dropped.worker_has:
                acked = dropped.acked if dropped.acked is not None else progress.acked_ends()
                self._forgotten = furthest(self._forgotten or {}, acked)
        generation = _Generation(now + self._span)
        generations.append(generation)
        return generation

    def rows(self, ns: Namespace, counter: str, now_us: int | None = None) -> Rows:
        """The counter's recent writes that are acknowledged, that the worker is sure to admit and that this process
        has not stored yet; `blocked` when an acknowledged one not stored yet may not be stored here."""
        now_us = time.time_ns() // 1000 if now_us is None else now_us
        key = f"{ns.name}:{counter}"
        out = Rows()
        progress = self.progress if self.progress is not None and self.progress.readable() else None
        if self._forgotten is not None:
            # A forgotten write may be neither here nor in the store yet. Without offsets read lately (an idle
            # process's poll sleeps; a broker that refuses them) that is unknown too: the caller waits for the worker,
            # whose wait reads them (answered 1 for a count of 501 before, the worker down).
            if progress is None or not progress.covers(self._forgotten):
                out.blocked = True
                return out
            self._forgotten = None
        for generation in self._generations:
            if generation.worker_has:
                continue
            if progress is not None and generation.acked is not None and progress.covers(generation.acked):
                generation.worker_has = True  # every write of it is in the store (or dead-lettered by the worker)
                continue
            flat = generation.writes.get(key)
            if flat is None:
                continue
            start = upto = flat[0]
            for i in range(start, len(flat), _FIELDS):
                ack = flat[i + 5]
                if ack is None:  # stored
                    if upto == i:  # still in the prefix of stored writes: later calls start after it
                        upto += _FIELDS
                    continue
                if ack is _WORKERS:
                    out.blocked = True
                    continue
                if not ack.done() or ack.cancelled() or ack.exception() is not None:
                    continue  # not acknowledged (yet): its client has no answer to read it by
                event_time = flat[i]
                if (stamp := ack.result()) is not None and admission_error(event_time, stamp, ns) is not None:
                    continue  # the worker dead-letters it by its record's timestamp (its client had a 503)
                if admissible(ns, event_time, now_us):
                    out.append((ns.name, counter, event_time, flat[i + 1], flat[i + 2], flat[i + 3], flat[i + 4]))
                    out.places.append((flat, i))
                else:
                    out.blocked = True
            if upto != start:
                flat[0] = upto
        return out

    @staticmethod
    def _stored_now(stored: list[list[EventRow]]) -> None:
        """These lists of rows are in the store: later calls of `rows` leave them out (rows that did not come from
        `rows` are not marked; stored again, they change nothing)."""
        for rows in stored:
            for flat, i in getattr(rows, "places", ()):
                flat[i + 5] = None

    def store_and_count(self, rows: list[EventRow], namespace: str, counter: str, count: int, after_us: int,
                        upto_us: int) -> asyncio.Future[int]:
        """Store `rows`, then answer `count` (the counter's rollup as of `after_us`) plus its persisted events of
        (after_us, upto_us], the rows among them; a clear among them replaces the count with the adds after it."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pending.append((rows, (namespace, counter, count, after_us, upto_us), future))
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())
        return future

    async def _run(self) -> None:
        await asyncio.sleep(0)  # the rest of this pass's writes join the first call
        while self._pending:
            batch, self._pending = self._pending, []
            by_namespace: dict[str, list[tuple[_Count, asyncio.Future[int]]]] = {}
            for _, read, future in batch:
                by_namespace.setdefault(read[0], []).append((read, future))
            written = [rows for rows, _, _ in batch]
            rows = [row for rows in written for row in rows]
            for namespace, reads in by_namespace.items():  # the first call stores every row
                try:
                    aggregates = await self.events.write_and_aggregate(
                        rows, namespace, [(counter, after, upto) for (_, counter, _, after, upto), _ in reads])
                except Exception as exc:  # these waiters fall back to waiting for the worker; the rows, if
                    # not stored, go with the next namespace's call
                    log.warning("storing %d read-your-write event(s) early failed: %s", len(rows), exc)
                    for _, f in reads:
                        if not f.done():
                            f.set_exception(exc)
                    continue
                self._stored_now(written)
                rows, written = [], []
                for ((_, counter, count, _, _), future), aggregate in zip(reads, aggregates, strict=True):
                    if not future.done():  # a reader that went away (client disconnect) was cancelled
                        future.set_result(apply_aggregate(count, aggregate, (namespace, counter)))


class Unnoted(EarlyPersist):
    """The EarlyPersist of an API process that shares the pipeline with others: it counts nothing early (what
    another process acknowledged cannot be stored here, `CounterService.shared_pipeline`), so it notes nothing and
    `rows` finds nothing. Noting would cost every durable write about 0.5 µs for a path never taken."""

    def note(self, m: Mutation, acknowledged: Acknowledgement) -> None:
        pass

    def note_event(self, namespace: str, counter: str, event: tuple[int, str, str, int, bool],
                   acknowledged: Acknowledgement) -> None:
        pass

    def note_keyed(self, key: str, event: tuple[int, str, str, int, bool],
                   acknowledged: Acknowledgement | object) -> None:
        pass
