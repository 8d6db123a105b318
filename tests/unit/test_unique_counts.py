"""Unique counts on real SQLite files: the persist path stores items as event item keys, the rollup keeps the
sketches (agents.sketches) with the buckets, and the reads (query_api.unique) answer estimates within their bounds.

The first test is the issue's: a million distinct items written in shuffled, duplicated batches, rolled up in
several steps as the worker does; the truth lies within the estimate's bounds and the relative error within
3 x 1.04 / sqrt(2^lg_k); re-running steps, replaying every event and recounting from zero change no sketch.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from agents.persist import RawRecord, prepare
from agents.rollup import rollup_counters
from agents.sketches import maintain_sketches
from agents.windows import BucketWork
from control_plane import Namespace, parse_namespaces
from control_plane.admission import extras_refusal
from jobs.recount import recount_counter
from query_api.service import CounterService, Rejected
from query_api.unique import get_unique, get_unique_groups, live_items, sketch_union, unique_series
from schemas import Mutation, MutationOp, combination, decode_mutations, encode_mutation, mutation_from_json
from sinks import (
    EventRow,
    InProcessRollupCache,
    Partitioning,
    SqliteBucketStore,
    SqliteEventStore,
    SqliteRollupStore,
    open_sketch_store,
)
from sinks.sketches import Estimate, estimate
from sinks.windows import CHAIN, Granularity, WindowError

S = 1_000_000
M, H, D = 60 * S, 3600 * S, 86400 * S
MINUTE, HOUR, DAY = Granularity.MINUTE, Granularity.HOUR, Granularity.DAY
DAY0 = 19_700 * D  # a day boundary
_COMMON: dict[str, Any] = {
    "accept_limit": "2s", "max_clock_skew": "500ms",
    "time_partition": {"buckets_per_id": 2, "seconds_per_bucket": 300, "seconds_per_slice": 3600},
    "retention": {"close_after": "1h", "delete_after": "7d"},
}
REGISTRY = parse_namespaces({"namespaces": {
    "u": {**_COMMON, "counter_type": "EVENTUAL", "aggregation": "UNIQUE", "dimensions": {"keys": ["country"]}},
    "ua": {**_COMMON, "counter_type": "ACCURATE", "aggregation": "UNIQUE", "unique": {"lg_k": 14}},
    "s": {**_COMMON, "counter_type": "EVENTUAL"},
}})
U, UA, SUM = REGISTRY["u"], REGISTRY["ua"], REGISTRY["s"]


class Signals:
    def emit(self, namespace: str, counter: str) -> None:
        pass


class Stack:
    """Event, rollup, bucket and sketch stores on SQLite files, a CounterService reading them, and the worker's
    rollup step driven by hand."""

    def __init__(self, directory: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.events = SqliteEventStore(directory / "events.sqlite3",
                                       lambda name: Partitioning.of(REGISTRY[name].time_partition))
        self.rollups = SqliteRollupStore(directory / "rollups.sqlite3")
        self.buckets = SqliteBucketStore(directory / "buckets.sqlite3")
        self.sketches = open_sketch_store(self.buckets)
        self.service = CounterService(REGISTRY, producer=None, signals=Signals(), events=self.events,  # type: ignore[arg-type]
                                      rollups=self.rollups, cache=InProcessRollupCache(), counters=None,  # type: ignore[arg-type]
                                      buckets=self.buckets, sketches=self.sketches)

    def run(self, awaitable):
        return self.loop.run_until_complete(awaitable)

    def close(self) -> None:
        for store in (self.events, self.rollups, self.buckets, self.sketches):
            self.run(store.close())
        self.loop.close()

    def write(self, rows: Sequence[EventRow], batch: int = 50_000) -> int:
        return sum(self.run(self.events.write_events(rows[i:i + batch])) for i in range(0, len(rows), batch))

    def step(self, ns: Namespace, counters: Sequence[str], boundary: int) -> None:
        """The worker's rollup step to ``boundary``: buckets, then sketches, then the rollups."""
        accept, skew = int(ns.accept_limit_s * S), int(ns.max_clock_skew_s * S)
        results = self.run(rollup_counters(ns, list(counters), events=self.events, rollups=self.rollups,
                                           cache=InProcessRollupCache(), watermark_us=boundary + accept + 1,
                                           now_us=boundary + accept + skew + 1, buckets=self.buckets,
                                           sketches=self.sketches))
        assert all(r.rollup_ts == boundary for r in results), results

    def stored(self, ns: str, counter: str) -> dict[tuple[Granularity, int], tuple[bytes, int]]:
        found = self.run(self.sketches.read_sketches_many(ns, [(counter, g, 0, 2**62) for g in CHAIN]))
        return {(g, s): (b, u) for g, rows in zip(CHAIN, found, strict=True) for s, b, u in rows}

    def total(self, ns: Namespace, counter: str, now: int) -> Estimate:
        return self.run(sketch_union(self.sketches, self.buckets, ns, counter, None, now, now_us=now)).union.estimate()

    def window(self, ns: Namespace, counter: str, start: int, end: int, now: int) -> Estimate:
        return self.run(sketch_union(self.sketches, self.buckets, ns, counter, start, end,
                                     now_us=now)).union.estimate()


@pytest.fixture
def stack(tmp_path: Path):
    s = Stack(tmp_path)
    yield s
    s.close()


def within(e: Estimate, truth: int, lg_k: int) -> None:
    """The truth lies within the bounds, and the relative error within 3 standard deviations."""
    assert e.lower_bound <= truth <= e.upper_bound, (e, truth)
    assert abs(e.estimate - truth) <= 3 * 1.04 / (2 ** lg_k) ** 0.5 * truth, (e, truth)


def row(ns: str, counter: str, t: int, token: str, item: str) -> EventRow:
    return (ns, counter, t, token, item, 1, False)


def clear_row(ns: str, counter: str, t: int, token: str) -> EventRow:
    return (ns, counter, t, token, "", 0, True)


# -- a million distinct items ---------------------------------------------------------------------------------


def test_a_million_distinct_items_in_shuffled_duplicated_batches(stack: Stack) -> None:
    rng = random.Random(2026)
    start, span, n = DAY0 + H, 3 * H, 1_000_000
    rows = [row("u", "c", start + rng.randrange(span), f"t{i}", f"user-{i}") for i in range(n)]
    rows += rng.sample(rows, 200_000)  # retries: the same event again (same token, time and item)
    rows += [row("u", "c", start + rng.randrange(span), f"again-{j}", f"user-{rng.randrange(n)}")
             for j in range(100_000)]  # the same items again, as other events
    rng.shuffle(rows)
    started = time.monotonic()
    assert stack.write(rows) == n + 100_000
    per_hour: dict[int, set[str]] = {}
    for _ns, _c, t, _tok, item, _d, _clear in rows:
        per_hour.setdefault(t - t % H, set()).add(item)

    steps = [start + 50 * M, start + 100 * M + 7 * S, start + span + 10 * S]  # three rollup steps, mid-minute
    for b in steps:
        stack.step(U, ["c"], b)
    now = steps[-1] + 5 * S
    total = stack.total(U, "c", now)
    within(total, n, U.unique.lg_k)  # type: ignore[union-attr]
    for hour, items in per_hour.items():  # each hour's window, from its hour sketch
        within(stack.window(U, "c", hour, hour + H, now), len(items), U.unique.lg_k)  # type: ignore[union-attr]
    assert len(per_hour) == 3
    before = stack.stored("u", "c")
    assert {g for g, _ in before} == {MINUTE, HOUR, DAY} and len([k for k in before if k[0] is MINUTE]) == 180

    # re-running the last step recomputes the same sketches at the same boundary: refused, nothing moves
    done = stack.run(maintain_sketches(U, [BucketWork("c", steps[1], steps[2])], events=stack.events,
                                       sketches=stack.sketches, buckets=stack.buckets, now_us=now))
    assert sum(done.computed.values()) > 0 and sum(done.written.values()) == 0
    assert stack.stored("u", "c") == before
    # a replay of every event stores nothing new; a recount from zero at a later boundary rewrites every sketch
    # with the same bytes
    assert stack.write(rows[:300_000]) == 0
    redone = stack.run(maintain_sketches(U, [BucketWork("c", 0, steps[2] + 1)], events=stack.events,
                                         sketches=stack.sketches, buckets=stack.buckets, now_us=now))
    assert redone.written == {MINUTE: 180, HOUR: 3, DAY: 1}
    after = stack.stored("u", "c")
    assert {k: b for k, (b, _u) in after.items()} == {k: b for k, (b, _u) in before.items()}
    assert {u for _b, u in after.values()} == {steps[2] + 1}
    assert stack.total(U, "c", now) == total
    assert time.monotonic() - started < 240


# -- the rollup step: clears, guards, SUM namespaces --------------------------------------------------------------


def test_a_clear_erases_the_items_before_it(stack: Stack) -> None:
    t0 = DAY0 + 2 * H
    clear_at = t0 + 30 * M + 20 * S  # mid-minute
    before = [row("u", "c", t0 + i * 7 * S, f"a{i}", f"old-{i}") for i in range(300)]  # up to t0 + 35 min
    after = [row("u", "c", clear_at + 1 + i * 3 * S, f"b{i}", f"new-{i % 40}") for i in range(200)]
    at_clear = [row("u", "c", clear_at, "same-instant", "erased")]
    stack.write(before + after + at_clear + [clear_row("u", "c", clear_at, "clr")])
    stack.step(U, ["c"], t0 + 20 * M)  # before the clear: the old items count
    assert round(stack.total(U, "c", t0 + 21 * M).estimate) == len({r[4] for r in before if r[2] <= t0 + 20 * M})
    stack.step(U, ["c"], t0 + 2 * H)
    now = t0 + 2 * H + S
    post = {r[4] for r in before + after if r[2] > clear_at}
    assert round(stack.total(U, "c", now).estimate) == len(post)
    # windows: one ended before the clear reads nothing, the minute holding it only what follows it
    assert stack.window(U, "c", t0, t0 + 30 * M, now) == (0.0, 0.0, 0.0)
    minute = clear_at - clear_at % M
    expected = {r[4] for r in before + after if minute <= r[2] < minute + M and r[2] > clear_at}
    assert round(stack.window(U, "c", minute, minute + M, now).estimate) == len(expected) > 0
    assert round(stack.window(U, "c", t0, t0 + H, now).estimate) == len({r[4] for r in before + after
                                                                         if clear_at < r[2] < t0 + H})


def test_sketches_only_for_unique_namespaces_and_behind_the_boundary(stack: Stack) -> None:
    t0 = DAY0 + 3 * H
    stack.write([("s", "c", t0 + i * S, f"s{i}", "", 1, False) for i in range(50)]
                + [row("u", "c", t0 + i * S, f"u{i}", f"x{i}") for i in range(50)])
    stack.step(SUM, ["c"], t0 + 25 * S)
    stack.step(U, ["c"], t0 + 25 * S)
    assert stack.stored("s", "c") == {}
    assert round(stack.total(U, "c", t0 + M).estimate) == 26  # x0..x25; later items wait for the next step
    assert {u for _b, u in stack.stored("u", "c").values()} == {t0 + 25 * S}


def test_parents_whose_children_are_gone_are_left_as_stored(stack: Stack) -> None:
    """A recount long after: minutes past their retention and events past delete_after are not rebuilt from."""
    t0 = DAY0 + 1 * H
    stack.write([row("u", "c", t0 + i * S, f"u{i}", f"x{i}") for i in range(100)])
    stack.step(U, ["c"], t0 + 2 * M)
    kept = stack.stored("u", "c")
    later = t0 + 9 * D  # events older than delete_after (7 days): nothing may be rebuilt from them
    done = stack.run(maintain_sketches(U, [BucketWork("c", 0, t0 + 2 * M + 1)], events=stack.events,
                                       sketches=stack.sketches, buckets=stack.buckets, now_us=later))
    assert sum(done.written.values()) == 0 and stack.stored("u", "c") == kept


def test_a_rollup_later_than_delete_after_still_puts_its_items_in_sketches(stack: Stack) -> None:
    """A worker step starts from rollup_ts however late it runs: events it has not rolled up are never deleted."""
    t0 = DAY0 + 1 * H
    stack.write([row("u", "c", t0 + i * S, f"u{i}", f"x{i}") for i in range(40)])
    stack.step(U, ["c"], t0 + 8 * D)  # the first rollup, eight days after the events
    assert round(stack.total(U, "c", t0 + 8 * D + M).estimate) == 40
    assert {g for g, _start in stack.stored("u", "c")} == {HOUR, DAY}  # the minutes are past their retention


def test_a_late_step_into_an_hour_past_minute_retention_adds_its_items_to_the_hour(stack: Stack) -> None:
    """A worker step whose rollup_ts lies inside an hour whose minutes are past their retention: the hour's and the
    day's sketches take its items (they were left as stored, holding only the first step's 20)."""
    t0 = DAY0 + 1 * H + 10 * M  # the hour's earlier minutes are none the step recomputes
    stack.write([row("u", "c", t0 + i * S, f"u{i}", f"x{i}") for i in range(40)])
    stack.step(U, ["c"], t0 + 19 * S + S // 2)  # on time: x0..x19; rollup_ts inside the hour
    stack.step(U, ["c"], t0 + 3 * D)  # three days late (minutes are kept 48 h): x20..x39
    now = t0 + 3 * D + M
    assert round(stack.window(U, "c", t0 - t0 % H, t0 - t0 % H + H, now).estimate) == 40  # the hour
    assert round(stack.window(U, "c", DAY0, DAY0 + D, now).estimate) == 40  # its day
    assert round(stack.total(U, "c", now).estimate) == 40


def test_a_window_reaching_before_2000_is_refused_at_once(stack: Stack) -> None:
    for last in ("1000000d", "99999999999999999999999d"):
        with pytest.raises(WindowError, match="before 2000") as info:
            stack.run(get_unique(stack.service, U, "c", {"last": last}))
        assert info.value.field == "window.last"


def test_a_recount_gets_events_a_replay_restored_into_the_sketches(stack: Stack) -> None:
    """Events restored inside a rolled-up window are never looked at by rollups; `counter recount` (and a replay's
    recount) rebuilds the sketches with the buckets."""
    t0 = DAY0 + 5 * H
    stack.write([row("u", "c", t0 + i * S, f"x{i}", f"x{i}") for i in range(100)])
    stack.step(U, ["c"], t0 + 10 * M)
    stack.write([row("u", "c", t0 + 3 * M + i * S, f"r{i}", f"restored-{i}") for i in range(50)])
    stack.step(U, ["c"], t0 + 11 * M)  # the next rollup step does not look back
    assert round(stack.total(U, "c", t0 + 12 * M).estimate) == 100
    b = t0 + 12 * M
    accept, skew = int(U.accept_limit_s * S), int(U.max_clock_skew_s * S)
    result = stack.run(recount_counter(U, "c", events=stack.events, rollups=stack.rollups, cache=None,
                                       watermark_us=b + accept + 1, now_us=b + accept + skew + 1,
                                       buckets=stack.buckets, sketches=stack.sketches))
    assert result.action == "written" and result.rollup_ts == b
    assert round(stack.total(U, "c", b + M).estimate) == 150
    assert {u for _b, u in stack.stored("u", "c").values()} == {b}


# -- reads --------------------------------------------------------------------------------------------------------


def test_reads_total_window_series_and_accurate_live_items(stack: Stack) -> None:
    now = time.time_ns() // 1000
    t0 = now - now % H - 2 * H  # real times: the service reads the clock
    stack.write([row("ua", "c", t0 + i * 11 * S, f"a{i}", f"user-{i % 150}") for i in range(600)])
    boundary = t0 + 30 * M
    stack.step(UA, ["c"], boundary)
    rolled = {f"user-{i % 150}" for i in range(600) if t0 + i * 11 * S <= boundary}
    eventual = stack.run(get_unique(stack.service, UA, "c", live=False))
    assert eventual.as_of == boundary and eventual.estimate.rounded == len(rolled)
    accurate = stack.run(get_unique(stack.service, UA, "c"))  # ACCURATE: the live items after the boundary too
    assert accurate.estimate.rounded == 150 and accurate.as_of == boundary
    window = stack.run(get_unique(stack.service, UA, "c", {"start": t0 + 10 * M, "end": t0 + 20 * M}))
    assert (window.start_us, window.end_us) == (t0 + 10 * M, t0 + 20 * M)
    assert window.estimate.rounded == len({f"user-{i % 150}" for i in range(600)
                                           if t0 + 10 * M <= t0 + i * 11 * S < t0 + 20 * M})
    # a live clear leaves only the items after it, the sketches' erased
    stack.write([clear_row("ua", "c", t0 + 100 * M, "clr"), row("ua", "c", t0 + 100 * M + 1, "z", "late")])
    items, clear = stack.run(live_items(stack.events, UA, "c", boundary, now))
    assert clear == t0 + 100 * M and "late" in items
    assert stack.run(get_unique(stack.service, UA, "c")).estimate.rounded == len(
        {f"user-{i % 150}" for i in range(600) if t0 + i * 11 * S > t0 + 100 * M} | {"late"})
    series, as_of = stack.run(unique_series(stack.service, UA, "c", "minute", t0, t0 + 30 * M))
    assert as_of == boundary and len(series.buckets) == 30
    assert [count for _s, count in series.buckets] == [
        len({f"user-{i % 150}" for i in range(600) if m <= t0 + i * 11 * S < m + M}) for m in range(t0, t0 + 30 * M, M)]


def test_group_by_reads_each_combination(stack: Stack) -> None:
    now = time.time_ns() // 1000
    t0 = now - now % H - H
    rows: list[EventRow] = []
    truth: dict[str, set[str]] = {}
    for i in range(400):
        country = ("US", "FR", "BR")[i % 3]
        item, t = f"user-{i % 97}", t0 + i * 5 * S
        for name in ("c", combination("c", {"country": country})):  # as the persist path expands a write
            rows.append(row("u", name, t, f"w{i}", item))
            truth.setdefault(name, set()).add(item)
    stack.write(rows)
    stack.run(stack.rollups.register_combinations("u", [("c", combination("c", {"country": c}))
                                                        for c in ("US", "FR", "BR")], full=True))
    stack.step(U, list(truth), t0 + 40 * M)
    grouped = stack.run(get_unique_groups(stack.service, U, "c", (), "country"))
    assert grouped.estimate.rounded == 97
    assert {v: e.rounded for v, e in grouped.groups} == {c: len(truth[f"c country={c}"]) for c in ("BR", "FR", "US")}
    assert grouped.as_of == t0 + 40 * M


# -- the write path: items as event item keys, refusals naming the field ------------------------------------------


def test_the_persist_path_stores_items_as_item_keys_and_dead_letters_the_rest() -> None:
    t = 1_790_000_000 * S  # in the past: prepare refuses records stamped ahead of its clock

    def rec(offset: int, m: Mutation) -> RawRecord:
        return RawRecord("counter-mutations", 0, offset, t // 1000, b"k", encode_mutation(m))

    def add(token: str, item: str = "", delta: int = 1, key: str = "", ns: str = "u") -> Mutation:
        return Mutation(ns, "c", delta, t, token, key, MutationOp.ADD, (), item)

    batch = prepare([rec(0, add("a", "alice")), rec(1, add("a", "bob")),  # two items under one token: two events
                     rec(2, add("b")), rec(3, add("c", "carol", delta=5)), rec(4, add("d", "dave", key="k")),
                     rec(5, Mutation("u", "c", 0, t, "e", "", MutationOp.CLEAR, (), "erin")),
                     rec(6, Mutation("u", "c", 0, t, "f", "", MutationOp.CLEAR)),
                     rec(7, add("g", "gina", ns="s"))], REGISTRY)
    assert batch.rows == [("u", "c", t, "a", "alice", 1, False), ("u", "c", t, "a", "bob", 1, False),
                          ("u", "c", t, "f", "", 0, True)]
    reasons = [d.reason for d in batch.dead]
    assert reasons[0].startswith("field 'item': is required: namespace 'u' counts distinct items")
    assert reasons[1].startswith("field 'delta': must be 1 or absent") and "got 5" in reasons[1]
    assert reasons[2].startswith("field 'event_item_key': in a UNIQUE namespace the item is the event's item key")
    assert reasons[3].startswith("field 'item': a clear erases every item")
    assert reasons[4].startswith("field 'item': namespace 's' is EVENTUAL: only UNIQUE namespaces count items")
    assert decode_mutations(batch.dead[1].value) == [add("c", "carol", delta=5)]
    # with dimensions: every combination's event carries the item
    [write] = prepare([rec(8, add("h", "hal")._replace(dimensions=(("country", "US"),)))], REGISTRY).dimensioned
    assert [r[4:6] for r in write.rows()] == [("hal", 1), ("hal", 1)]


def test_json_records_may_leave_delta_out_when_they_carry_an_item() -> None:
    m = mutation_from_json({"namespace": "u", "counter_name": "c", "item": "alice"})
    assert (m.delta, m.item) == (1, "alice")
    with pytest.raises(ValueError, match="delta"):
        mutation_from_json({"namespace": "u", "counter_name": "c"})


def test_the_api_checks_name_the_field(stack: Stack) -> None:
    service = stack.service
    assert service.delta_of(U, None) == 1 and service.delta_of(U, 1) == 1 and service.delta_of(SUM, 3) == 3
    for ns, delta, field in ((U, 2, "delta"), (U, -1, "delta"), (SUM, None, "delta")):
        with pytest.raises(Rejected) as err:
            service.delta_of(ns, delta)
        assert err.value.field == field
    for args, kw, field in (((U, None, None), {}, "item"), ((U, None, "x"), {"item_key": "k"}, "event_item_key"),
                            ((U, {"device": "tv"}, "x"), {}, "dimensions.device"), ((SUM, None, "x"), {}, "item")):
        with pytest.raises(Rejected) as err:
            service.extras(*args, **kw)
        assert err.value.field == field, err.value
    assert service.extras(U, {"country": "US"}, "x") == ((("country", "US"),), "x")
    assert service.extras(U, None, None, MutationOp.CLEAR) == ((), "")
    assert extras_refusal(UA, (), "x", delta=1) is None
    assert estimate(b"\x02\x01\x07\x0c\x03\x08\x00\x00") == (0.0, 0.0, 0.0)  # an empty compact sketch


def test_counter_produce_takes_an_item_and_then_no_delta() -> None:
    import argparse

    from counter_cli.produce_cmd import _from_args

    def args(**kw: Any) -> argparse.Namespace:
        base = {"namespace": "visitors", "counter_name": "home", "delta": None, "clear": False, "token": None,
                "generation_time": None, "item_key": "", "dimension": ["country=US"], "item": "user-42"}
        return argparse.Namespace(**{**base, **kw})

    m = _from_args(args())
    assert (m.delta, m.item, m.dimensions, m.op) == (1, "user-42", (("country", "US"),), MutationOp.ADD)
    assert _from_args(args(delta=1)).delta == 1
    for bad in (args(item=""), args(clear=True, dimension=[])):
        with pytest.raises(SystemExit):
            _from_args(bad)
