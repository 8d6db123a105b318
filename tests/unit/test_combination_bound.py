"""CounterService.check_bound: the API refuses a new full combination once the counter has max_combinations, counting
the new ones it admitted that the registry does not show yet. It counted only the registry, read every 5 s, so a
burst of new combinations was answered 200 and the persist path dead-lettered those past the bound: never counted
(a review, with max_combinations 2: four writes answered 200, a total of 2)."""

from __future__ import annotations

import asyncio

import pytest

from control_plane import parse_namespaces
from query_api import combination_bound as bound_module
from query_api.combination_bound import OverBound
from query_api.service import CounterService, Rejected
from schemas import MutationOp, combination

REGISTRY = parse_namespaces({"namespaces": {"capped": {
    "counter_type": "EVENTUAL", "dimensions": {"keys": ["country"], "max_combinations": 2}}}})
NS = REGISTRY["capped"]


class Registry:
    """The rollup store's combination registry, as check_bound reads it; `reads` counts the reads."""

    def __init__(self, *full: str) -> None:
        self.full = list(full)
        self.reads = 0

    async def combinations(self, namespace: str, counter: str, *, prefix: str = "", after: str | None = None,
                           limit: int = 1000, full_only: bool = False) -> list[str]:
        self.reads += 1
        return [c for c in sorted(self.full) if c.startswith(f"{counter} ") and (after is None or c > after)][:limit]


def service(registry: Registry) -> CounterService:
    return CounterService(REGISTRY, producer=None, signals=None, events=None, rollups=registry,  # type: ignore[arg-type]
                          cache=None, counters=None)  # type: ignore[arg-type]


def dims(country: str) -> tuple[tuple[str, str], ...]:
    return (("country", country),)


def test_new_combinations_admitted_here_count_toward_the_bound_before_the_registry_shows_them() -> None:
    registry = Registry()
    svc = service(registry)

    async def scenario() -> None:
        await svc.check_bound(NS, "v", dims("AA"))
        await svc.check_bound(NS, "v", dims("BB"))
        for country in ("CC", "DD"):
            with pytest.raises(Rejected, match="already has 2 dimension combinations") as refused:
                await svc.check_bound(NS, "v", dims(country))
            assert refused.value.field == "dimensions"
        await svc.check_bound(NS, "v", dims("AA"))  # a retry of one admitted, or another write of it: admitted
        await svc.check_bound(NS, "w", dims("CC"))  # another counter has its own bound
        assert registry.reads == 2  # one read per counter within BOUND_REFRESH_S
    asyncio.run(scenario())


def test_a_combination_admitted_here_and_then_registered_is_counted_once(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = Registry(combination("v", dims("AA")))
    svc = service(registry)
    clock = [1000.0]
    monkeypatch.setattr(bound_module.time, "monotonic", lambda: clock[0])

    async def scenario() -> None:
        await svc.check_bound(NS, "v", dims("BB"))  # one registered, one admitted here: the bound
        with pytest.raises(Rejected):
            await svc.check_bound(NS, "v", dims("CC"))
        registry.full.append(combination("v", dims("BB")))  # the worker persisted it
        clock[0] += bound_module.BOUND_REFRESH_S
        with pytest.raises(Rejected, match="already has 2 "):  # BB is not counted twice, nor dropped
            await svc.check_bound(NS, "v", dims("CC"))
        await svc.check_bound(NS, "x", dims("X1"))
        await svc.check_bound(NS, "x", dims("X2"))  # writes the worker never stores (they failed, say)
        clock[0] += bound_module.SENT_COMBINATIONS_S - 1
        with pytest.raises(Rejected):
            await svc.check_bound(NS, "x", dims("X3"))
        clock[0] += 1
        await svc.check_bound(NS, "x", dims("X3"))  # their places are given up after SENT_COMBINATIONS_S
    asyncio.run(scenario())


def test_combinations_admitted_here_are_not_forgotten_when_many_counters_pass_through() -> None:
    """The scale review: once the API had read 100,000 counters' registries, it cleared them together with the new
    combinations it had admitted; with the worker lagging, two writes past a counter's bound were then answered 200
    and dead-lettered. Now the reads are evicted one by one, and an admitted combination is kept for
    SENT_COMBINATIONS_S whatever passes through."""
    registry = Registry()  # the worker lags: nothing is registered
    svc = service(registry)

    async def scenario() -> None:
        await svc.check_bound(NS, "v", dims("AA"))
        await svc.check_bound(NS, "v", dims("BB"))
        for i in range(bound_module.MAX_KNOWN_COUNTERS + 10):  # other counters, each with a new combination
            await svc.check_bound(NS, f"c{i}", dims("XX"))
        known, _, sent = svc.bound.sizes()
        assert known == bound_module.MAX_KNOWN_COUNTERS and sent == bound_module.MAX_KNOWN_COUNTERS + 11
        for country in ("CC", "DD"):
            with pytest.raises(Rejected, match="already has 2 dimension combinations"):
                await svc.check_bound(NS, "v", dims(country))
    asyncio.run(scenario())


def test_registry_reads_are_bounded_by_the_names_they_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    """A counter may hold up to a million combinations (the scale review projected 10.8 GiB for 100,000 counters of
    1,000): the reads kept are evicted, least recently used first, once their names pass MAX_KNOWN_NAMES; an
    evicted counter is read again at its next new combination, and its admitted ones still count."""
    monkeypatch.setattr(bound_module, "MAX_KNOWN_NAMES", 5)
    big = parse_namespaces({"namespaces": {"wide": {"counter_type": "EVENTUAL", "dimensions": {
        "keys": ["country"], "max_combinations": 10}}}})["wide"]
    registry = Registry(*(combination("a", dims(f"A{i}")) for i in range(4)),
                        *(combination("b", dims(f"B{i}")) for i in range(3)))
    svc = service(registry)

    async def scenario() -> None:
        await svc.check_bound(big, "a", dims("A0"))  # 4 names held
        await svc.check_bound(big, "a", dims("A0"))  # known: no read
        assert registry.reads == 1 and svc.bound.sizes()[:2] == (1, 4)
        await svc.check_bound(big, "b", dims("B9"))  # 3 more: "a" is evicted
        assert svc.bound.sizes()[:2] == (1, 3)
        await svc.check_bound(big, "a", dims("A1"))  # read again
        assert registry.reads == 3 and svc.bound.sizes()[:2] == (1, 4)
    asyncio.run(scenario())


def test_a_write_refused_for_its_token_or_time_takes_no_slot() -> None:
    """The bound was checked before the token and time: three writes of new combinations refused for a stale
    generation_time (422, nothing sent) held the counter's three slots for SENT_COMBINATIONS_S, and its first valid
    new combination was refused as past the bound (a review)."""
    svc = service(Registry())
    stale = "2000-01-02T00:00:00Z"

    async def scenario() -> None:
        for country in ("AA", "BB", "CC"):
            with pytest.raises(Rejected) as refused:
                await svc.write_bounded(NS, "v", 1, MutationOp.ADD, f"t-{country}", stale,
                                        dimensions={"country": country})
            assert refused.value.field == "idempotency_token.generation_time", refused.value
        await svc.check_bound(NS, "v", dims("DD"))  # both slots are still free
        await svc.check_bound(NS, "v", dims("EE"))
    asyncio.run(scenario())


def test_a_batch_is_admitted_whole_or_not_at_all() -> None:
    """A batch refused for one entry sends nothing, so none of its entries may take a slot: its earlier entries'
    new combinations held theirs, and blocked the counter's next ones (a review)."""
    svc = service(Registry())

    async def scenario() -> None:
        with pytest.raises(OverBound, match="already has 2 dimension combinations") as refused:
            await svc.check_bounds([(NS, "v", dims("AA")), (NS, "w", ()), (NS, "v", dims("AA")),
                                    (NS, "v", dims("BB")), (NS, "v", dims("CC"))])
        assert refused.value.index == 4  # the entry past the bound, counted among all the batch's writes
        await svc.check_bounds([(NS, "v", dims("DD")), (NS, "v", dims("EE"))])  # nothing was taken
        with pytest.raises(OverBound):  # and what the batch admitted counts
            await svc.check_bounds([(NS, "v", dims("FF"))])
    asyncio.run(scenario())
