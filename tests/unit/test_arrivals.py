"""query_api.arrivals.Arrivals: AddAndGetCount's read-your-write waits, answered together, on a fake EventStore."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any
from unittest import mock

import query_api.arrivals as arrivals_module
from query_api.arrivals import Arrivals

A = ("c", 1_700_000_000_000_000, "token-a", "")
B = ("c", 1_700_000_000_000_001, "token-b", "")
C = ("d", 1_700_000_000_000_000, "token-a", "item")

Identity = tuple[str, int, str, str]


class Rounds:
    """Stands in for the asyncio module inside query_api.arrivals and counts its pauses: one per round."""

    def __init__(self) -> None:
        self.count = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    async def sleep(self, delay: float) -> None:
        self.count += 1
        await asyncio.sleep(delay)


class FakeEvents:
    """EventStore.contains over a set of (namespace, identity); records every call with its round."""

    def __init__(self, rounds: Rounds) -> None:
        self.rounds = rounds
        self.stored: set[tuple[str, Identity]] = set()
        self.calls: list[tuple[int, str, list[Identity]]] = []
        self.failures = 0  # how many of the next calls raise
        self.gate: asyncio.Event | None = None  # when set: calls wait for it (a store that does not answer)

    async def contains(self, namespace: str, keys: Sequence[Identity]) -> list[bool]:
        self.calls.append((self.rounds.count, namespace, list(keys)))
        if self.gate is not None:
            await self.gate.wait()
        if self.failures:
            self.failures -= 1
            raise ConnectionError("store hiccup")
        return [(namespace, k) in self.stored for k in keys]


async def until(condition: Callable[[], object], timeout: float = 5.0, what: str = "") -> None:
    """Wait on the loop for condition() with a deadline."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")
        await asyncio.sleep(0.001)


def run(scenario: Callable[[Arrivals, FakeEvents], Any], **options: float) -> None:
    rounds = Rounds()
    events = FakeEvents(rounds)

    async def main() -> None:
        arrivals = Arrivals(events, **options)  # type: ignore[arg-type]
        await asyncio.wait_for(scenario(arrivals, events), 30)

    with mock.patch.object(arrivals_module, "asyncio", rounds):
        asyncio.run(main())


def test_waiters_resolve_as_soon_as_the_store_has_their_event() -> None:
    async def scenario(arrivals: Arrivals, events: FakeEvents) -> None:
        a1, a2, b = arrivals.wait("ns1", A), arrivals.wait("ns1", A), arrivals.wait("ns1", B)
        other = arrivals.wait("ns2", A)  # the same identity in another namespace
        c = arrivals.wait("ns2", C)
        await until(lambda: len(events.calls) >= 6, what="three rounds")
        assert not any(f.done() for f in (a1, a2, b, other, c))

        resolved_at: list[int] = []
        a1.add_done_callback(lambda _: resolved_at.append(len(events.calls)))
        added_at = len(events.calls)
        events.stored.add(("ns1", A))
        await until(a1.done, what="the first waiter")
        await asyncio.sleep(0)  # its done callbacks run on the loop's next pass: until() may see it done before
        assert a1.result() is True and a2.done() and a2.result() is True
        # The first ns1 lookup after the event was stored answered it.
        assert [ns for _, ns, _ in events.calls[added_at:resolved_at[0]]].count("ns1") == 1
        assert not any(f.done() for f in (b, other, c))

        events.stored.update({("ns2", A), ("ns1", B), ("ns2", C)})
        assert await asyncio.gather(b, other, c) == [True, True, True]

    run(scenario, interval_s=0.001, timeout_s=10.0)


def test_one_lookup_per_namespace_per_round_with_each_identity_once() -> None:
    async def scenario(arrivals: Arrivals, events: FakeEvents) -> None:
        waits = [arrivals.wait("ns1", A), arrivals.wait("ns1", A), arrivals.wait("ns1", B), arrivals.wait("ns2", C),
                 arrivals.wait("ns3", A)]
        await until(lambda: len(events.calls) >= 30, what="ten rounds")
        events.stored.update({("ns1", A), ("ns1", B), ("ns2", C), ("ns3", A)})
        assert await asyncio.gather(*waits) == [True] * 5
        per_round: dict[int, list[str]] = {}
        for round_, ns, keys in events.calls:
            per_round.setdefault(round_, []).append(ns)
            assert len(keys) == len(set(keys)), "an identity looked up twice in one call"
            assert set(keys) == {"ns1": {A, B}, "ns2": {C}, "ns3": {A}}[ns]
        for round_, namespaces in per_round.items():
            assert sorted(namespaces) == ["ns1", "ns2", "ns3"], (round_, namespaces)

    run(scenario, interval_s=0.001, timeout_s=10.0)


def test_a_lookup_holds_only_what_still_waits() -> None:
    async def scenario(arrivals: Arrivals, events: FakeEvents) -> None:
        a, b = arrivals.wait("ns", A), arrivals.wait("ns", B)
        events.stored.add(("ns", A))
        assert await a is True
        seen = len(events.calls)
        await until(lambda: len(events.calls) >= seen + 2, what="two more rounds")
        assert all(keys == [B] for _, _, keys in events.calls[seen:])
        events.stored.add(("ns", B))
        assert await b is True

    run(scenario, interval_s=0.001, timeout_s=10.0)


def test_waiters_time_out_to_false_after_timeout_s() -> None:
    async def scenario(arrivals: Arrivals, events: FakeEvents) -> None:
        started = time.monotonic()
        futures = [arrivals.wait("ns", A), arrivals.wait("ns", B), arrivals.wait("other", A)]
        assert await asyncio.gather(*futures) == [False, False, False]
        elapsed = time.monotonic() - started
        assert 0.2 <= elapsed < 3.0, elapsed

    run(scenario, interval_s=0.002, timeout_s=0.2)


def test_a_later_waiter_for_the_same_write_gets_its_own_timeout() -> None:
    async def scenario(arrivals: Arrivals, events: FakeEvents) -> None:
        first = arrivals.wait("ns", A)
        await until(lambda: len(events.calls) >= 2)
        await asyncio.sleep(0.15)  # the second request (a retry of the same write) arrives later
        joined = time.monotonic()
        second = arrivals.wait("ns", A)
        assert await first is False
        assert not second.done(), "the retry's wait ended with the first request's deadline"
        assert await second is False
        assert time.monotonic() - joined >= 0.3

    run(scenario, interval_s=0.002, timeout_s=0.3)


def test_a_store_that_does_not_answer_still_times_out() -> None:
    async def scenario(arrivals: Arrivals, events: FakeEvents) -> None:
        events.gate = asyncio.Event()
        started = time.monotonic()
        waiting = arrivals.wait("ns", A)
        assert await asyncio.wait_for(waiting, 5.0) is False
        assert 0.2 <= time.monotonic() - started < 3.0
        events.stored.add(("ns", A))
        events.gate.set()  # the store recovers: the next write is answered
        assert await arrivals.wait("ns", A) is True

    run(scenario, interval_s=0.002, timeout_s=0.2)


def test_a_failing_lookup_is_retried_next_round() -> None:
    async def scenario(arrivals: Arrivals, events: FakeEvents) -> None:
        events.stored.add(("ns", A))
        events.failures = 2
        assert await arrivals.wait("ns", A) is True
        assert len(events.calls) == 3  # two failed rounds, then the answer
        assert [r for r, _, _ in events.calls] == sorted({r for r, _, _ in events.calls})  # one per round

    run(scenario, interval_s=0.001, timeout_s=10.0)


def test_the_task_stops_when_nothing_waits_and_starts_again() -> None:
    async def scenario(arrivals: Arrivals, events: FakeEvents) -> None:
        events.stored.update({("ns", A), ("ns", B)})
        assert await arrivals.wait("ns", A) is True
        task = arrivals._task
        assert task is not None
        await until(task.done, what="the lookup task to end")
        calls = len(events.calls)
        assert calls == 1
        assert await arrivals.wait("ns", B) is True  # a new wait starts a new task
        assert arrivals._task is not task and len(events.calls) == calls + 1
        await until(arrivals._task.done, what="the second task to end")

    run(scenario, interval_s=0.001, timeout_s=10.0)


def test_a_cancelled_waiter_does_not_break_the_others() -> None:
    async def scenario(arrivals: Arrivals, events: FakeEvents) -> None:
        gone, stays = arrivals.wait("ns", A), arrivals.wait("ns", A)
        gone.cancel()  # e.g. the client disconnected
        await until(lambda: len(events.calls) >= 3, what="three rounds")
        assert not stays.done()
        events.stored.add(("ns", A))
        assert await stays is True

    run(scenario, interval_s=0.001, timeout_s=10.0)
