"""The persist path, shared by the worker's persist agent and `counter replay`.

For a prepared batch, in this order: write the events (idempotent), raise `last_write_ts`, dead-letter what
could not be accepted, signal each touched counter for rollup. Only after it returns may the caller commit
the batch's offsets: a crash anywhere before replays the batch, which the event identity makes harmless.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from agents.persist import PreparedBatch
from schemas.dead_letter import DeadLetter
from sinks import EventRow, EventStore, RollupStore

Key = tuple[str, str]
EventWriter = Callable[[Sequence[EventRow]], Awaitable[int]]
DeadLetterSender = Callable[[list[DeadLetter]], Awaitable[None]]
SignalSender = Callable[[list[Key]], Awaitable[None]]


async def persist_batch(batch: PreparedBatch, *, events: EventStore, rollups: RollupStore,
                        dead_letters: DeadLetterSender | None, signals: SignalSender | None,
                        write: EventWriter | None = None) -> int:
    """Make a prepared batch durable; returns how many events were new.

    `write` replaces `events.write_events` (a replay uses it to learn which counters got new events);
    `dead_letters` None drops the batch's dead letters (the caller reports them instead), `signals` None
    sends no rollup signal.
    """
    new = 0
    if batch.rows:
        new = await (write or events.write_events)(batch.rows)
        await rollups.bump_last_write([(ns, c, ts) for (ns, c), ts in batch.last_write.items()])
    if batch.dead and dead_letters is not None:
        await dead_letters(batch.dead)
    if batch.last_write and signals is not None:
        await signals(list(batch.last_write))
    return new
