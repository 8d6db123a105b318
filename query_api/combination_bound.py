"""The API's check of a namespace's `max_combinations` before it acknowledges a write with dimensions.

The persist path enforces the bound: a write past it is dead-lettered, never counted. So the API refuses (a 422) a
new full combination of a counter that has `max_combinations` already: those the registry holds (read at most every
BOUND_REFRESH_S per counter) and the new ones this process admitted that the registry does not show yet (kept for
SENT_COMBINATIONS_S, while the worker may lag). Writes through other API processes or straight to Kafka are not seen
here, so those can still race.

Both memories are bounded, and the bound never forgets an admitted combination younger than SENT_COMBINATIONS_S: a
review at 100,000 counters with dimensions saw both cleared at once, after which two writes past a counter's bound
were answered 200 and dead-lettered. The registry reads are evicted least recently used, by counters and by the
names they hold (one counter may hold up to a million); the admitted ones only once old enough.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from control_plane import Namespace
from control_plane.admission import bound_reason

__all__ = ["BOUND_REFRESH_S", "MAX_KNOWN_COUNTERS", "MAX_KNOWN_NAMES", "SENT_COMBINATIONS_S", "CombinationBound",
           "OverBound"]

BOUND_REFRESH_S = 5.0  # how long the API trusts what it read of a counter's full combinations
SENT_COMBINATIONS_S = 600.0  # how long a new combination this process sent counts toward the bound unregistered
MAX_KNOWN_COUNTERS = 100_000  # counters whose registry read is kept
MAX_KNOWN_NAMES = 1_000_000  # combination names those reads hold together (about 100 bytes each)

Key = tuple[str, str]  # (namespace, counter)


class OverBound(ValueError):
    """The write's combination would be one past its counter's max_combinations (the reason names both)."""


class CombinationBound:
    """Per counter, the full combinations the registry held when last read, and the new ones admitted here since.
    `read(namespace, counter)` reads the registry's full combinations of a counter."""

    def __init__(self, read: Callable[[str, str], Awaitable[list[str]]]) -> None:
        self._read = read
        self._known: OrderedDict[Key, tuple[float, frozenset[str]]] = OrderedDict()  # registry reads, and when
        self._known_names = 0  # names held in _known
        self._sent: dict[Key, dict[str, float]] = {}  # new ones admitted here since, and when
        self._sent_sweep_at = MAX_KNOWN_COUNTERS  # counters in _sent from which its old names are looked for

    async def admit(self, ns: Namespace, counter: str, full: str) -> None:
        """Admit a write of full combination `full`, or raise OverBound. Between the count and the admission there is
        no await: a write of the same loop pass cannot slip in between."""
        key = (ns.name, counter)
        now = time.monotonic()
        read_at, known = self._known.get(key, (-1e18, frozenset()))
        if full in known:
            self._known.move_to_end(key)
            return
        if now - read_at >= BOUND_REFRESH_S:
            known = frozenset(await self._read(ns.name, counter))
            self._remember(key, now, known)
            if full in known:
                return
        sent = self._sent.get(key)
        if sent is None:
            if len(self._sent) >= self._sent_sweep_at:
                self._forget_old_sent(now)
            sent = self._sent[key] = {}
        elif full in sent:  # a retry, or another write, of a new combination already admitted here
            sent[full] = now
            return
        for name in [name for name, at in sent.items() if name in known or now - at >= SENT_COMBINATIONS_S]:
            del sent[name]  # registered since, or long enough ago to have been (or to have failed)
        bound = ns.dimensions.max_combinations
        if len(known) + len(sent) >= bound:
            raise OverBound(bound_reason(ns.name, counter, len(known) + len(sent), bound, full))
        sent[full] = now

    def _remember(self, key: Key, now: float, known: frozenset[str]) -> None:
        previous = self._known.pop(key, None)
        if previous is not None:
            self._known_names -= len(previous[1])
        self._known[key] = (now, known)
        self._known_names += len(known)
        while len(self._known) > 1 and (len(self._known) > MAX_KNOWN_COUNTERS or self._known_names > MAX_KNOWN_NAMES):
            _, (_, evicted) = self._known.popitem(last=False)  # read again at its next new combination
            self._known_names -= len(evicted)

    def _forget_old_sent(self, now: float) -> None:
        """Drop the admitted names old enough to be registered or to have failed, and the counters left with none;
        the next sweep waits until the counters kept have doubled (a sweep costs them all)."""
        for key in list(self._sent):
            sent = self._sent[key]
            for name in [name for name, at in sent.items() if now - at >= SENT_COMBINATIONS_S]:
                del sent[name]
            if not sent:
                del self._sent[key]
        self._sent_sweep_at = max(MAX_KNOWN_COUNTERS, 2 * len(self._sent))

    def sizes(self) -> tuple[int, int, int]:
        """(counters read, names they hold, counters with admitted names): for tests and a look from outside."""
        return len(self._known), self._known_names, len(self._sent)
