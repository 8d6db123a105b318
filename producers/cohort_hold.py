"""`CohortHold`: when a group commit holds its gathering record back for the writes an acknowledgement brings.

Why: clients in a closed loop (each connection of a pool sends its next write once the last one is answered) that
one acknowledgement answered send their next writes a fraction of a cycle later. A record produced the moment the
broker is free carries only the writes that came meanwhile; the others wait a whole acknowledgement behind it, and
the clients settle into two cohorts that ride every other record: half the writes per broker request, and each
write waiting about one and a half acknowledgements. Holding the gathering record, while nothing is in flight, until
as many requests have arrived as the last acknowledgement answered joins the cohorts: every cycle's record carries
every client (measured at concurrency 32, bench/RESULTS.md: 16 writes a record became 26-28).

The hold is bounded: never past `factor` times the recent acknowledgement time (beyond that, producing now and
gathering behind the record in flight does as well), nor past `max_s`, and it ends as soon as `gap` times the
acknowledgement time passes without a request, as the event loop's clock tells it. The gap is what tells the clients
apart. Clients in a loop come back in a burst, one request after another as fast as they read their answers. Clients
whose writes do not wait on their answers (requests of their own users, each of which writes) arrive at their own
pace whatever is answered, and holding for them only makes every cycle longer: without the gap rule, Poisson arrivals
at 3,000 and 10,000 writes/s waited 1.6-3.0 ms at the median against 1.2-1.9 ms unheld; with it, as unheld at
10,000/s and 0.1-0.25 ms more at 3,000/s (bench/RESULTS.md). The request that completes the count ends the hold. At
concurrency 1 nothing is held (one request answered, one expected, and it is the one that arrives).

Holds that keep giving up switch holding off. Against a broker that answers in several milliseconds (a cluster
replicating acks=all across hosts), clients whose writes do not wait on their answers keep arriving within the gap,
and every hold ran to its bound before it gave up: a scratch with a proxy delaying the local broker's answers by 3 ms
measured Poisson arrivals at 1,000 and 4,000 writes/s waiting 0.8 ms more at the median (7.6 against 6.8 ms) held
than unheld, while a closed loop at concurrency 32 wrote 66% more held (bench/RESULTS.md). Clients in a loop
complete their holds; other clients let them run out. So the hold keeps a credit: each hold that gives up takes
0.3 of it, each completed one gives 0.3 back (up to 1, where it starts), and with none left nothing is held. Four
holds in a row that give up switch holding off; each acknowledgement then gives a thirty-second back, so that 7-10
records on a hold tries again whether the clients have changed.

The clock is the event loop's, as measured: uvloop's is cached per loop pass at a millisecond's resolution, so there
the gap is in effect "until the loop's clock ticks with no request since", and a wait shorter than a tick is
looked at again on the next pass (`next_look`). A version judging the gap by `time.perf_counter()` at each request
lost the closed-loop gain and held Poisson arrivals longer (bench/RESULTS.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

EWMA_WEIGHT = 0.125  # of the latest acknowledgement time in the running mean, as TCP's smoothed round-trip time
GAP = 0.25  # a hold ends once no request came for this many acknowledgement times (see the module docstring)
CREDIT_LOST = 0.3  # a hold that gave up: four in a row switch holding off
CREDIT_WON = 0.3  # a hold its requests completed: holding stays on while at most half the holds give up
CREDIT_REGAINED = 1 / 32  # per acknowledgement while holding is off: a hold tries again 7-10 records on


class CohortHold:
    """Count the requests expected back since the last acknowledgement, and say whether to hold until a time.

    `acknowledged(requests, took_s, now)` after each acknowledgement, `arrived(now)` for each request that joins the
    gathering record (True when it ends a hold), `holding(now)` before producing, and `next_look()` for when to
    ask again. `now` is one monotonic clock's (the event loop's). On an event loop, `wait`, `came` and `cancel` keep
    the timer of a hold in progress."""

    __slots__ = ("_timer", "ack_s", "credit", "expected", "factor", "gap", "last", "max_s", "until")

    def __init__(self, max_s: float, factor: float = 2.0, gap: float = GAP) -> None:
        if max_s < 0 or factor < 0 or gap < 0:
            raise ValueError(f"max_s, factor and gap must be >= 0 (got {max_s!r}, {factor!r}, {gap!r})")
        self.max_s = max_s
        self.factor = factor
        self.gap = gap
        self.last = 0.0  # when the latest request came (or the acknowledgement, before any)
        self.expected = 0  # requests still expected back from the clients the last acknowledgement answered
        self.until = 0.0  # the hold's bound
        self.ack_s = 0.0  # smoothed acknowledgement time; 0 until the first
        self.credit = 1.0  # holds are tried while it is above 0 (see the module docstring)
        self._timer: asyncio.TimerHandle | None = None  # set while a record is held (`wait`)

    def acknowledged(self, requests: int, took_s: float | None, now: float) -> None:
        """A record holding `requests` was answered, `took_s` after it was produced (None: a failure, whose time says
        nothing of the broker's pace; its clients come back all the same, to retry)."""
        if took_s is not None:
            self.ack_s = took_s if not self.ack_s else self.ack_s + EWMA_WEIGHT * (took_s - self.ack_s)
        if self.credit <= 0:
            self.credit += CREDIT_REGAINED
        if self.max_s and self.ack_s and self.credit > 0:
            self.expected = requests
            self.until = now + min(self.max_s, self.factor * self.ack_s)
            self.last = now
        else:
            self.expected = 0

    def arrived(self, now: float) -> bool:
        """A request joined the gathering record; True when it was the last expected (a hold ends now)."""
        self.last = now
        if self.expected <= 1:
            self.expected = 0
            return True
        self.expected -= 1
        return False

    def holding(self, now: float) -> bool:
        """Whether a record free to go should wait for requests still expected."""
        return self.expected > 0 and now < self.until and now < self.last + self.gap * self.ack_s

    def next_look(self) -> float:
        """When to look again whether a hold is over: its bound, or a gap in the requests coming."""
        return min(self.until, self.last + self.gap * self.ack_s)

    def release(self) -> None:
        """Stop expecting: the hold ran out, or the record went anyway."""
        self.expected = 0

    def wait(self, loop: asyncio.AbstractEventLoop, over: Callable[[], None]) -> bool:
        """Whether a record free to go is held now. If so, `over()` runs once the hold's bound or a gap passes
        before the requests all came (looked at again while they keep coming), unless `came` or `cancel` ends the
        hold first."""
        if not self.holding(loop.time()):
            return False
        if self._timer is None:
            self._timer = loop.call_at(self.next_look(), self._look, loop, over)
        return True

    def _look(self, loop: asyncio.AbstractEventLoop, over: Callable[[], None]) -> None:
        self._timer = None
        if self.holding(loop.time()):  # requests kept coming: look again after the latest one
            self._timer = loop.call_at(self.next_look(), self._look, loop, over)
            return
        self.release()
        self.credit -= CREDIT_LOST
        over()

    def came(self, loop: asyncio.AbstractEventLoop) -> bool:
        """`arrived` on the loop's clock; True when the request ends a hold in progress (its timer is cancelled):
        the record may go at the end of this pass."""
        if not self.arrived(loop.time()) or self._timer is None:
            return False
        self.cancel()
        self.credit = min(1.0, self.credit + CREDIT_WON)
        return True

    def cancel(self) -> bool:
        """The record went anyway (full, or the producer stopping) or failed: no timer runs for it. True when it was
        held."""
        if self._timer is None:
            return False
        self._timer.cancel()
        self._timer = None
        return True
