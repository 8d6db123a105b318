"""The persist path, shared by the worker's persist agent and `counter replay`.

For a prepared batch, in this order: write the events (idempotent), raise `last_write_ts`, dead-letter what
could not be accepted, signal each touched counter for rollup. Only after it returns may the caller commit
the batch's offsets: a crash anywhere before replays the batch, which the event identity makes harmless.
Writes with dimensions and clears of counters with dimensions go through agents.dimensions first (the
max_combinations bound, the expansion into combination events, the registry, clears reaching combinations).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from agents.dimensions import Combinations, expand_clears
from agents.persist import PreparedBatch, settle_behind
from schemas.dead_letter import DeadLetter
from sinks import EventRow, EventStore, RollupStore

Key = tuple[str, str]
EventWriter = Callable[[Sequence[EventRow]], Awaitable[int]]
DeadLetterSender = Callable[[list[DeadLetter]], Awaitable[None]]
SignalSender = Callable[[list[Key]], Awaitable[None]]


async def persist_batch(batch: PreparedBatch, *, events: EventStore, rollups: RollupStore,
                        dead_letters: DeadLetterSender | None, signals: SignalSender | None,
                        write: EventWriter | None = None, combinations: Combinations | None = None) -> int:
    """Make a prepared batch durable; returns how many events were new.

    `write` replaces `events.write_events` (a replay uses it to learn which counters got new events);
    `dead_letters` None drops the batch's dead letters (the caller reports them instead), `signals` None
    sends no rollup signal. `combinations` is the process's knowledge of dimension combinations (a fresh one,
    which reads the registry, when None). A batch with dimensions gets its expanded events added to `rows`,
    `last_write` and `dead` (so the caller's metrics and signals include them): a batch is persisted once, and a
    retry after a failure prepares its records again (as the worker and the replay do).
    """
    if batch.behind:
        await settle_behind(batch, events)
    write_events = write or events.write_events
    new = 0
    expanded: list[tuple[str, str]] = []
    clears = batch.clears
    if batch.dimensioned or clears:
        combinations = combinations or Combinations()
        rows, refused, expanded, clears = await combinations.apply(batch.dimensioned, clears, events=events,
                                                                    rollups=rollups)
        batch.dead.extend(refused)
        _add_rows(batch, rows)
    if batch.rows:
        new = await write_events(batch.rows)
    if clears:  # after the clear events are stored, so a combination registered meanwhile is seen by one side
        cleared = await expand_clears(clears, rollups)
        if cleared:
            new += await write_events(cleared)
            _add_rows(batch, cleared)
    if combinations is not None and expanded:
        combinations.settle(batch.dimensioned, expanded)
    if batch.last_write:
        await rollups.bump_last_write([(ns, c, ts) for (ns, c), ts in batch.last_write.items()])
    if batch.dead and dead_letters is not None:
        await dead_letters(batch.dead)
    if batch.last_write and signals is not None:
        await signals(list(batch.last_write))
    return new


def _add_rows(batch: PreparedBatch, rows: Sequence[EventRow]) -> None:
    batch.rows.extend(rows)
    last_write = batch.last_write
    for ns, counter, event_time, *_ in rows:
        key = (ns, counter)
        if event_time > last_write.get(key, -1):
            last_write[key] = event_time
