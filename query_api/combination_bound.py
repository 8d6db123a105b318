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
from collections.abc import Awaitable, Callable, Sequence

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
    """The write's combination would be one past its counter's max_combinations (the reason names both); `index`:
    the write's place among those `CombinationBound.admit_all` was given."""

    def __init__(self, reason: str, index: int = 0) -> None:
        super().__init__(reason)
        self.index = index


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
        """Admit a write of full combination `full`, or raise OverBound."""
        await self.admit_all([(ns, counter, full)])

    async def admit_all(self, writes: Sequence[tuple[Namespace, str, str]]) -> None:
        """Admit writes of (namespace, counter, full combination) all together, or raise OverBound for the first past
        its counter's bound and admit none (a batch refused for any entry sends nothing, so it must take no slot).
        Call it once a write is otherwise valid, right before it is sent: an admission holds its slot for
        SENT_COMBINATIONS_S, so one refused afterwards would keep the counter's new combinations out that long (a
        review: three refused writes of stale times blocked a counter with max_combinations 3 for ten minutes).

        The registry reads come first; from the count to the admissions there is no await, so a write of the same
        loop pass cannot slip in between."""
        now = time.monotonic()
        fulls: dict[Key, set[str]] = {}
        for ns, counter, full in writes:
            fulls.setdefault((ns.name, counter), set()).add(full)
        known_of: dict[Key, frozenset[str]] = {}
        for key, wanted in fulls.items():
            read_at, known = self._known.get(key, (-1e18, frozenset()))
            if now - read_at >= BOUND_REFRESH_S and not wanted <= known:
                known = frozenset(await self._read(*key))
                self._remember(key, now, known)
            elif key in self._known:
                self._known.move_to_end(key)
            known_of[key] = known
        adding: dict[Key, dict[str, None]] = {}  # per counter, the new names of these writes, in order
        for index, (ns, counter, full) in enumerate(writes):
            key = (ns.name, counter)
            known = known_of[key]
            if full in known:
                continue
            sent = self._sent.get(key, {})
            for name in [name for name, at in sent.items() if name in known or now - at >= SENT_COMBINATIONS_S]:
                del sent[name]  # registered since, or long enough ago to have been (or to have failed)
            new = adding.setdefault(key, {})
            if full in sent or full in new:  # a retry, or another write, of a new combination already admitted
                new[full] = None
                continue
            bound = ns.dimensions.max_combinations
            held = len(known) + len(sent) + len(new)
            if held >= bound:
                raise OverBound(bound_reason(ns.name, counter, held, bound, full), index)
            new[full] = None
        for key, names in adding.items():
            admitted = self._sent.get(key)
            if admitted is None:
                if len(self._sent) >= self._sent_sweep_at:
                    self._forget_old_sent(now)
                admitted = self._sent[key] = {}
            for name in names:
                admitted[name] = now

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
