"""What admission keeps a namespace's events after: its rollups' newest rollup_ts, re-read every few seconds.

Under one configuration no admitted event is ever at or before it (a rollup's boundary trails the arrival of every
record not yet persisted by accept_limit), so this refuses nothing and a stale value refuses less. It matters once
the admission window grew (a raised accept_limit): read at start, it covers the rollups made under the shorter limit
before the restart; re-read, those of workers not restarted yet. The worker dead-letters such an event, which no
rollup would count (`agents.persist.prepare(rolled=...)`), and the API refuses it (422).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from control_plane import CounterType, NamespaceRegistry
from sinks.base import RollupStore

__all__ = ["ROLLED_REFRESH_S", "RolledFloors"]

ROLLED_REFRESH_S = 5.0


@dataclass
class RolledFloors:
    """Per namespace, `RollupStore.newest_rollup_ts`, read at most every ROLLED_REFRESH_S."""

    floors: dict[str, int] = field(default_factory=dict)
    read_at: float = -ROLLED_REFRESH_S

    async def refresh(self, rollups: RollupStore, registry: NamespaceRegistry) -> dict[str, int]:
        if time.monotonic() - self.read_at >= ROLLED_REFRESH_S:
            names = [ns.name for ns in registry.values() if ns.counter_type is not CounterType.BEST_EFFORT]
            newest = await asyncio.gather(*(rollups.newest_rollup_ts(name) for name in names))
            self.floors, self.read_at = dict(zip(names, newest, strict=True)), time.monotonic()
        return self.floors
