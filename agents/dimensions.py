"""Dimensions on the persist path: a write with dimensions becomes events of its counter and of every combination.

`prepare` (agents.persist) decodes and admits a write with dimensions as a `DimensionedWrite` instead of a row, and
notes every clear of a namespace that declares dimensions. Before the batch's events are written,
`Combinations.apply` (called by `persist_batch`, so the worker and `counter replay` behave alike):

1. Enforces `max_combinations`: the distinct FULL combinations (all of a write's dimensions) of a base counter are
   known per process, filled from the registry (RollupStore.combinations(full_only=True)) on first sight and re-read
   at most every `refresh_s` when a new one appears. A write introducing one more than the bound is dead-lettered
   with the reason; so are its events in every combination and in the base counter (a write is all or none).
   Several workers each admit against what they know, so racing workers may overshoot the bound by the few new
   combinations they admitted within one refresh period.
2. Expands the admitted writes: one event for the base counter and one for each non-empty subset of the
   dimensions (2^n - 1 combination counters), all with the write's token, time, item key and delta, so each is
   idempotent in its own counter.
3. Registers the combinations this process has not registered yet (RollupStore.register_combinations), the full
   ones as full, so group_by can list them and clears can reach them.
4. Clears: a clear of the base counter must clear every combination. Those registered before the clear get it
   from step 5. A combination this process has not seen yet (new, or seen first since a restart) gets a copy of
   the base counter's latest clear (read from the event store, with its identity) if that clear could precede
   one of its events: at or after the earliest event time of its writes in this batch or the earliest time
   admission still accepts for their records (accept_limit before they reached Kafka), so a write generated
   before a clear but persisted after it is erased in the combination as in the base counter. Registering
   before this read, and writing a clear before listing the registry (step 5), means that of two racing
   workers at least one sees the other. Not covered: a write for a never-seen combination in a record that
   reached Kafka before the clear's batch was persisted but is persisted after the combination's first batch
   (another, lagging partition) with an event time before the clear.
5. After the batch's rows are written, expands each clear of a counter with dimensions into clear events of every
   registered combination (one paged registry read per cleared counter per batch).

All of it is idempotent, so a batch retried after a failure (or replayed) persists the same events.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from control_plane.admission import bound_reason
from schemas import MAX_EVENT_TIME, subset_combinations
from schemas.dead_letter import DeadLetter
from sinks import EventRow, EventStore, RollupStore
from sinks.combinations import all_combinations

Key = tuple[str, str]
EventWriter = Callable[[Sequence[EventRow]], Awaitable[int]]


@dataclass(frozen=True, slots=True)
class DimensionedWrite:
    """An admitted ADD with dimensions, not yet expanded: the base counter, its combination counters (the full
    one last), the event's identity and delta, the namespace's bound, and the dead letter to send (reason
    filled in) if the bound refuses it."""

    namespace: str
    counter: str
    combinations: tuple[str, ...]
    event_time: int
    event_id: str
    item_key: str
    delta: int
    max_combinations: int
    dead: DeadLetter
    admissible_from: int  # the earliest event time admission accepts for its record (arrival - accept_limit)

    @property
    def full(self) -> str:
        return self.combinations[-1]

    def rows(self) -> list[EventRow]:
        ns, t, eid, key, delta = self.namespace, self.event_time, self.event_id, self.item_key, self.delta
        return [(ns, name, t, eid, key, delta, False) for name in (self.counter, *self.combinations)]


def dimensioned_write(namespace: str, counter: str, dimensions: tuple[tuple[str, str], ...], event_time: int,
                      event_id: str, item_key: str, delta: int, max_combinations: int, dead: DeadLetter,
                      admissible_from: int) -> DimensionedWrite:
    return DimensionedWrite(namespace, counter, subset_combinations(counter, dimensions), event_time, event_id,
                            item_key, delta, max_combinations, dead, admissible_from)


# A clear of a counter in a namespace that declares dimensions: (namespace, counter, event_time, event_id, item key)
Clear = tuple[str, str, int, str, str]


@dataclass(slots=True)
class _Counter:
    full: set[str]  # full combinations known registered (from the registry, plus those admitted here)
    loaded_at: float
    seen: set[str] = field(default_factory=set)  # registered, and clears propagated, by this process


class Combinations:
    """Per-process knowledge of each base counter's combinations (see the module doc), for at most `max_counters`
    counters (least recently used ones are forgotten and re-read when seen again)."""

    def __init__(self, *, refresh_s: float = 5.0, max_counters: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.refresh_s = refresh_s
        self.max_counters = max_counters
        self.clock = clock
        self._counters: OrderedDict[Key, _Counter] = OrderedDict()

    async def _counter(self, rollups: RollupStore, key: Key, *, fresh: bool = False) -> _Counter:
        state = self._counters.get(key)
        now = self.clock()
        if state is not None and not (fresh and now - state.loaded_at >= self.refresh_s):
            self._counters.move_to_end(key)
            return state
        full = set(await all_combinations(rollups, key[0], key[1], full_only=True))
        if state is None:
            state = self._counters[key] = _Counter(full, now)
            while len(self._counters) > self.max_counters:
                self._counters.popitem(last=False)
        else:
            state.full |= full
            state.loaded_at = now
        return state

    async def apply(self, writes: Sequence[DimensionedWrite], clears: Sequence[Clear], *, events: EventStore,
                    rollups: RollupStore) -> tuple[list[EventRow], list[DeadLetter], list[Key], list[Clear]]:
        """Steps 1-4 of the module doc for a batch: the rows to write with the batch, the writes refused by
        the bound (as dead letters), the (namespace, counter) pairs whose combinations were registered (mark them
        seen with `settle` once the batch is stored), and the clears for `expand_clears` after the write."""
        rows: list[EventRow] = []
        dead: list[DeadLetter] = []
        new: dict[Key, dict[str, int]] = {}  # combinations not seen by this process -> earliest time that matters
        full_new: dict[Key, set[str]] = {}
        refreshed: set[Key] = set()
        for w in writes:
            key = (w.namespace, w.counter)
            state = await self._counter(rollups, key)
            if w.full not in state.full:
                if key not in refreshed:  # a new combination: count those other workers registered meanwhile
                    refreshed.add(key)
                    state = await self._counter(rollups, key, fresh=True)
                if w.full not in state.full:
                    if len(state.full) >= w.max_combinations:
                        dead.append(_refused(w, len(state.full)))
                        continue
                    state.full.add(w.full)
                    full_new.setdefault(key, set()).add(w.full)
            rows.extend(w.rows())
            since = min(w.event_time, w.admissible_from)
            earliest = new.setdefault(key, {})
            for name in w.combinations:
                if name not in state.seen and since < earliest.get(name, MAX_EVENT_TIME + 1):
                    earliest[name] = since
        new = {k: v for k, v in new.items() if v}
        try:
            await self._register(rollups, new, full_new)
        except BaseException:  # not registered: a retry must find them new again, or they are never registered full
            for key, names in full_new.items():
                if (known := self._counters.get(key)) is not None:
                    known.full -= names
            raise
        rows.extend(await _propagate_clears(events, new))
        return rows, dead, list(new), list(clears)

    def settle(self, writes: Sequence[DimensionedWrite], keys: Sequence[Key]) -> None:
        """The batch is stored: its new combinations are registered and carry their base counter's clears."""
        wanted = set(keys)
        for w in writes:
            key = (w.namespace, w.counter)
            state = self._counters.get(key)
            if key in wanted and state is not None:
                state.seen.update(w.combinations)

    @staticmethod
    async def _register(rollups: RollupStore, new: dict[Key, dict[str, int]],
                        full_new: dict[Key, set[str]]) -> None:
        by_ns: dict[str, list[tuple[str, str]]] = {}
        full_by_ns: dict[str, list[tuple[str, str]]] = {}
        for (ns, counter), names in new.items():
            by_ns.setdefault(ns, []).extend((counter, n) for n in names)
        for (ns, counter), full in full_new.items():
            full_by_ns.setdefault(ns, []).extend((counter, n) for n in sorted(full))
        for ns, items in full_by_ns.items():
            await rollups.register_combinations(ns, items, full=True)
        for ns, items in by_ns.items():
            await rollups.register_combinations(ns, items)


def _refused(w: DimensionedWrite, known: int) -> DeadLetter:
    reason = f"field 'dimensions': {bound_reason(w.namespace, w.counter, known, w.max_combinations, w.full)}"
    return DeadLetter(w.dead.key, w.dead.value, reason, w.dead.topic, w.dead.partition, w.dead.offset,
                      w.dead.timestamp_us)


async def _propagate_clears(events: EventStore, new: dict[Key, dict[str, int]]) -> list[EventRow]:
    """Step 4: copies of each base counter's latest clear at or after the earliest time that matters for its new
    combinations (see the module doc), for those combinations (identity included: the same event the clear's
    expansion would have written)."""
    rows: list[EventRow] = []
    for (ns, counter), names in new.items():
        since = min(names.values())
        agg = await events.aggregate(ns, counter, since - 1, MAX_EVENT_TIME)
        if not agg.cleared or agg.last_clear_us is None:
            continue
        at = agg.last_clear_us
        clears = [r for r in await events.scan(ns, counter, at - 1, at) if r[6]]
        for name, earliest in names.items():
            if earliest <= at:
                rows.extend((ns, name, t, eid, key, 0, True) for _ns, _c, t, eid, key, _d, _clear in clears)
    return rows


async def expand_clears(clears: Sequence[Clear], rollups: RollupStore) -> list[EventRow]:
    """Step 5: each clear of a base counter as a clear of every registered combination of it (one paged registry
    read per counter), with the clear's identity."""
    names: dict[Key, set[str]] = {}
    rows: list[EventRow] = []
    for ns, counter, t, eid, key in clears:
        if (ns, counter) not in names:
            names[(ns, counter)] = set(await all_combinations(rollups, ns, counter))
        rows.extend((ns, name, t, eid, key, 0, True) for name in sorted(names[(ns, counter)]))
    return rows
