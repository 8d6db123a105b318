"""agents.windows.maintain_buckets on real SQLite stores: buckets equal an oracle computed here from the events,
re-runs change nothing, the buckets since the last clear sum to the total, retention guards old buckets."""

from __future__ import annotations

import asyncio
import random
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.windows import BucketWork, Maintenance, maintain_buckets
from control_plane import Namespace, parse_namespaces
from sinks import EventRow, Partitioning, SqliteBucketStore, SqliteEventStore, apply_aggregate
from sinks.windows import CHAIN, Granularity, masked

S = 1_000_000
M, H, D = 60 * S, 3600 * S, 86400 * S
MINUTE, HOUR, DAY = Granularity.MINUTE, Granularity.HOUR, Granularity.DAY
DAY0 = 19_700 * D  # a UTC midnight
T0 = DAY0 - 2 * H - 7 * S  # events start a little before it: buckets straddle hours and a day
SETTLE = 6 * S  # "now" trails a boundary by accept_limit + skew


def namespace(windows: dict[str, Any] | None = None, delete_after: str = "30d") -> Namespace:
    """Event slices of an hour; buckets kept long enough by default that every bucket of a test is written."""
    fields: dict[str, Any] = {
        "counter_type": "EVENTUAL",
        "time_partition": {"buckets_per_id": 2, "seconds_per_bucket": 300, "seconds_per_slice": 3600},
        "retention": {"close_after": "1h", "delete_after": delete_after},
        "windows": {"retention": {"minute": "30d", "hour": "90d", "day": "forever"}} if windows is None else windows,
    }
    return parse_namespaces({"namespaces": {"ns": fields}})["ns"]


NS = namespace()


class Env:
    """An event store and a bucket store on fresh SQLite files, driven from synchronous tests."""

    def __init__(self, directory: Path, ns: Namespace = NS) -> None:
        self.ns = ns
        self.events = SqliteEventStore(directory / "events.sqlite3", lambda _: Partitioning.of(ns.time_partition))
        self.buckets = SqliteBucketStore(directory / "buckets.sqlite3")
        self.loop = asyncio.new_event_loop()
        self.rollup: dict[str, tuple[int, int]] = {}  # counter -> (count, rollup_ts), as agents.rollup keeps it

    def run(self, awaitable):
        return self.loop.run_until_complete(awaitable)

    def close(self) -> None:
        self.run(self.events.close())
        self.run(self.buckets.close())
        self.loop.close()

    def write(self, rows: Sequence[EventRow]) -> None:
        for i in range(0, len(rows), 97):
            self.run(self.events.write_events(rows[i:i + 97]))

    def step(self, counters: Sequence[str], boundary: int, *, rollup_from: int | None = None,
             now_us: int | None = None, continue_minutes: bool = True) -> Maintenance:
        """One rollup step to ``boundary`` for ``counters``: the aggregate moves the total (as agents.rollup
        does) and the buckets are maintained from the same windows."""
        work = []
        for c in counters:
            count, ts = self.rollup.get(c, (0, 0))
            agg = self.run(self.events.aggregate(self.ns.name, c, ts, boundary))  # empty when boundary <= ts
            work.append(BucketWork(c, ts if rollup_from is None else rollup_from, boundary, agg.last_clear_us))
            if boundary > ts:
                self.rollup[c] = (apply_aggregate(count, agg), boundary)
        return self.run(maintain_buckets(self.ns, work, events=self.events, buckets=self.buckets,
                                         now_us=boundary + SETTLE if now_us is None else now_us,
                                         continue_minutes=continue_minutes))

    def stored(self, counter: str, g: Granularity) -> dict[int, int]:
        [rows] = self.run(self.buckets.read_buckets_many(self.ns.name, [(counter, g, 0, 2**62)]))
        return {start: value for start, value, _upto in rows}

    def snapshot(self, counters: Sequence[str]) -> dict[tuple[str, Granularity], list[tuple[int, int, int]]]:
        ranges = [(c, g, 0, 2**62) for c in counters for g in CHAIN]
        got = self.run(self.buckets.read_buckets_many(self.ns.name, ranges))
        return {(c, g): rows for (c, g, _lo, _hi), rows in zip(ranges, got, strict=True)}

    def read(self, counters: Sequence[str], snapshot: dict | None = None) -> dict[tuple[str, Granularity], dict]:
        """Every bucket as a reader sees it: masked by the counter's latest clear (a stored hour that ended
        before a clear may still hold its old sum, or 0 once recomputed: both read 0)."""
        snapshot = self.snapshot(counters) if snapshot is None else snapshot
        clears = {c: self.clear(c) for c in counters}
        return {(c, g): {s: masked(g, s, v, clears[c]) for s, v, _u in rows} for (c, g), rows in snapshot.items()}

    def clear(self, counter: str) -> int | None:
        return self.run(self.buckets.clears(self.ns.name, [counter])).get(counter)


def ev(t: int, eid: str, delta: int = 1, *, counter: str = "c", clear: bool = False) -> EventRow:
    return ("ns", counter, t, eid, "", delta, clear)


def oracle(rows: Sequence[EventRow], counter: str, upto: int) -> tuple[dict[Granularity, dict[int, int]], int | None]:
    """Every bucket of ``counter`` as of ``upto``, from first principles: a minute sums its adds after its
    latest clear; an hour sums its minutes and a day its hours, each as read after the counter's latest clear."""
    distinct: dict[tuple, EventRow] = {}
    for r in rows:
        distinct.setdefault(r[:5], r)
    mine = [r for r in distinct.values() if r[1] == counter and r[2] <= upto]
    last = max((r[2] for r in mine if r[6]), default=None)
    by_minute: dict[int, list[EventRow]] = {}
    for r in mine:
        by_minute.setdefault(r[2] // M * M, []).append(r)
    out: dict[Granularity, dict[int, int]] = {MINUTE: {}, HOUR: {}, DAY: {}}
    for start, evs in by_minute.items():
        clear = max((r[2] for r in evs if r[6]), default=None)
        out[MINUTE][start] = sum(r[5] for r in evs if not r[6] and (clear is None or r[2] > clear))
    for child, parent in ((MINUTE, HOUR), (HOUR, DAY)):
        for start, value in out[child].items():
            key = start // parent.width_us * parent.width_us
            out[parent][key] = out[parent].get(key, 0) + masked(child, start, value, last)
    return out, last


def assert_matches_oracle(env: Env, rows: Sequence[EventRow], counter: str, upto: int,
                          chain: Sequence[Granularity] = CHAIN) -> None:
    expected, last = oracle(rows, counter, upto)
    assert env.clear(counter) == last
    for g in CHAIN:
        got = env.stored(counter, g)
        if g not in chain:
            assert got == {}, g
            continue
        keys = set(got) | set(expected[g])
        read = {k: masked(g, k, got.get(k, 0), last) for k in keys}
        want = {k: masked(g, k, expected[g].get(k, 0), last) for k in keys}
        assert read == want, g


def total_of(rows: Sequence[EventRow], counter: str, upto: int) -> int:
    distinct = {r[:5]: r for r in reversed(rows)}.values()
    mine = [r for r in distinct if r[1] == counter and r[2] <= upto]
    last = max((r[2] for r in mine if r[6]), default=None)
    return sum(r[5] for r in mine if not r[6] and (last is None or r[2] > last))


def assert_buckets_sum_to_total(env: Env, counter: str, chain: Sequence[Granularity] = CHAIN) -> None:
    count, _ts = env.rollup[counter]
    last = env.clear(counter)
    for g in chain:
        assert sum(masked(g, s, v, last) for s, v in env.stored(counter, g).items()) == count, g


def random_events(rng: random.Random, n: int, span: int, counters: str = "ab") -> list[EventRow]:
    rows = []
    for i in range(n):
        t = T0 + rng.choice([rng.randrange(span), rng.randrange(span // M) * M, rng.randrange(1, span // H + 1) * H])
        rows.append(ev(t, f"e{i}", rng.randint(-4, 9), counter=rng.choice(counters), clear=rng.random() < 0.03))
    return rows


# -- the oracle, step by step ------------------------------------------------------------------------


def test_steps_build_every_bucket_like_the_oracle_and_reruns_change_nothing(tmp_path: Path) -> None:
    env = Env(tmp_path)
    rng = random.Random(4)
    span = 30 * H
    rows = random_events(rng, 600, span)
    rows += rows[:80]  # redeliveries: still counted once
    env.write(rows)
    boundaries = sorted({T0 + rng.randrange(span) for _ in range(12)} | {T0 + span + M})
    previous = 0
    for boundary in boundaries:
        result = env.step("ab", boundary)
        assert result.computed[MINUTE] >= 1
        for c in "ab":
            assert_matches_oracle(env, rows, c, boundary)
            assert_buckets_sum_to_total(env, c)
        before = env.snapshot("ab")
        again = env.step("ab", boundary, rollup_from=previous)  # the same step once more: every write refused
        assert sum(again.written.values()) == 0 and env.snapshot("ab") == before
        env.step("ab", boundary, rollup_from=max(0, boundary - 2 * H))  # a replay of a wider window
        assert env.read("ab") == env.read("ab", before)  # buckets restamped, never read differently
        previous = boundary
    # a recount from zero at a later boundary recomputes the same values (stamped with the new boundary)
    before = env.read("ab")
    recount = env.step("ab", boundaries[-1] + H, rollup_from=0)
    assert sum(recount.written.values()) == sum(recount.computed.values()) and env.read("ab") == before
    env.close()


def test_a_clear_masks_what_ended_before_it_and_keeps_what_follows(tmp_path: Path) -> None:
    env = Env(tmp_path)
    rows = [ev(T0 + k * 10 * M, f"e{k}", 1) for k in range(30)]  # one add every 10 minutes, ~5 hours
    env.write(rows)
    env.step("c", T0 + 5 * H)
    assert sum(env.stored("c", HOUR).values()) == 30
    clear_at = T0 + 5 * H + 30 * S
    env.write([ev(clear_at, "k", clear=True), ev(clear_at + 10 * S, "after", 7), ev(clear_at - 10 * S, "before", 100),
               ev(clear_at, "at-the-clear", 1000)])  # an add at the clear's very instant is erased by it
    env.step("c", T0 + 6 * H)
    last = env.clear("c")
    assert last == clear_at
    for g in CHAIN:
        read = {s: masked(g, s, v, last) for s, v in env.stored("c", g).items()}
        assert sum(read.values()) == 7  # the total: only what follows the clear
        assert all(v == 0 for s, v in read.items() if s + g.width_us <= clear_at)  # ended before it: 0
    holding = clear_at // M * M
    assert env.stored("c", MINUTE)[holding] == 7  # the bucket holding the clear counts what follows it
    env.close()


def test_only_the_namespace_granularities_are_kept(tmp_path: Path) -> None:
    rows = [ev(T0 + k * 7 * M, f"e{k}", k) for k in range(50)]
    for chain, windows in (((MINUTE,), {"granularities": ["minute"]}),
                           ((MINUTE, HOUR), {"granularities": ["minute", "hour"]})):
        directory = tmp_path / str(len(chain))
        env = Env(directory, namespace(windows))
        env.write(rows)
        env.step("c", T0 + 7 * H)
        assert_matches_oracle(env, rows, "c", T0 + 7 * H, chain)
        assert_buckets_sum_to_total(env, "c", chain)
        env.close()
    env = Env(tmp_path / "none", namespace({"granularities": []}))
    env.write(rows)
    assert env.step("c", T0 + 7 * H) == Maintenance()
    env.close()


def test_a_batch_costs_a_handful_of_store_calls_whatever_its_size(tmp_path: Path) -> None:
    env = Env(tmp_path)
    counters = [f"c{i}" for i in range(40)]
    env.write([ev(T0 + i * 37 * S, f"e{i}", 1, counter=counters[i % 40], clear=i == 7) for i in range(2000)])
    calls: list[str] = []

    def counting(store):
        class Proxy:
            def __getattr__(self, name):
                attr = getattr(store, name)
                if not name.startswith("_") and callable(attr):
                    calls.append(name)
                return attr
        return Proxy()

    boundary = T0 + 2000 * 37 * S
    work = [BucketWork(c, 0, boundary, None) for c in counters]
    result = env.run(maintain_buckets(NS, work, events=counting(env.events), buckets=counting(env.buckets),
                                      now_us=boundary + SETTLE))
    assert result.computed[DAY] == 40 * 2 and result.clears == 1
    assert sorted(calls) == sorted(["bucket_sums_many", "clears", "read_buckets_many", "read_buckets_many",
                                    "bump_clears", "write_buckets"])
    env.close()


def test_a_recount_leaves_buckets_whose_sources_are_gone_as_they_were(tmp_path: Path) -> None:
    """Events are deleted after delete_after and minutes after their retention: a recount from zero must not
    overwrite an hour it can no longer see whole with a partial sum."""
    env = Env(tmp_path, namespace({"retention": {"minute": "2h", "hour": "2d", "day": "forever"}}, delete_after="3h"))
    rows = [ev(T0 + k * 3 * M, f"e{k}", 1 + k % 5) for k in range(200)]  # 10 hours
    env.write(rows)
    for hour in range(1, 11):
        env.step("c", T0 + hour * H + 30 * S)
    end = T0 + 10 * H + 30 * S
    assert_matches_oracle(env, rows, "c", end)
    hours_before, days_before = env.stored("c", HOUR), env.stored("c", DAY)
    now = T0 + 12 * H + 30 * M  # events before now - 3 h may be gone, minutes before now - 2 h too
    env.run(env.buckets.drop_expired("ns", MINUTE, now - 2 * H))
    env.run(env.events.delete_rolled_up("ns", "c", now - 3 * H, end))
    result = env.step("c", now - SETTLE, rollup_from=0, now_us=now, continue_minutes=False)  # a recount's step
    assert result.skipped == {HOUR: 1}  # the hour holding the events' cutoff: half its minutes are gone
    assert env.stored("c", HOUR) == hours_before and env.stored("c", DAY) == days_before
    # the recomputed minutes are all past their 2 h retention: used for their hours, not written back
    assert result.computed[MINUTE] > 0 and env.stored("c", MINUTE) == {}
    env.close()


def test_a_rollup_later_than_delete_after_still_puts_its_events_in_buckets(tmp_path: Path) -> None:
    """No store deletes an event a rollup has not passed: a worker step nine days late (rollups stalled, events
    kept) starts from rollup_ts like any other, so the hours and days since the last clear sum to the total (the
    minutes that old are past their retention: computed for their hours, not written)."""
    env = Env(tmp_path, namespace({"retention": {"minute": "2d", "hour": "90d", "day": "forever"}}, delete_after="7d"))
    rows = [ev(T0 + k * 7 * M, f"e{k}", 1 + k % 3) for k in range(30)]  # up to DAY0 + 1h16m
    env.write(rows)
    env.step("c", DAY0 - H)  # on time: the events before DAY0 - 1h
    env.write([ev(DAY0 + 9 * D, "late", 4)])
    now = DAY0 + 9 * D + M
    env.step("c", now - SETTLE, now_us=now)  # the next step, nine days late
    total = env.rollup["c"][0]
    assert total == sum(r[5] for r in rows) + 4
    assert sum(env.stored("c", DAY).values()) == total and sum(env.stored("c", HOUR).values()) == total
    env.close()


def test_same_counter_twice_in_a_batch_covers_both_steps(tmp_path: Path) -> None:
    env = Env(tmp_path)
    rows = [ev(T0 + k * M, f"e{k}", 1) for k in range(120)]
    env.write(rows)
    work = [BucketWork("c", 0, T0 + 30 * M), BucketWork("c", T0 + 30 * M, T0 + 90 * M), ("c", 5, 5, None)]
    env.run(maintain_buckets(NS, work, events=env.events, buckets=env.buckets, now_us=T0 + 2 * H))
    assert sum(env.stored("c", MINUTE).values()) == 91 and sum(env.stored("c", HOUR).values()) == 91
    env.close()


# -- the property ----------------------------------------------------------------------------------------


steps = st.lists(st.integers(0, 55 * 60), min_size=1, max_size=8)  # boundaries, in minutes after T0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), boundaries=steps, reruns=st.lists(st.integers(0, 7), max_size=3))
def test_after_any_rollup_steps_the_buckets_since_the_last_clear_sum_to_the_total(seed, boundaries, reruns):
    rng = random.Random(seed)
    rows = random_events(rng, rng.randrange(1, 300), 56 * H)
    with tempfile.TemporaryDirectory() as directory:
        env = Env(Path(directory))
        env.write(rows)
        for i, minutes in enumerate(sorted(boundaries)):
            boundary = T0 + minutes * M + rng.randrange(M)
            env.step("ab", boundary)
            if i in reruns:
                env.step("ab", boundary, rollup_from=rng.choice([0, max(0, boundary - rng.randrange(1, 3 * H))]))
            for c in "ab":
                if c in env.rollup:
                    assert env.rollup[c][0] == total_of(rows, c, env.rollup[c][1])
                    assert_buckets_sum_to_total(env, c)
        for c in env.rollup:
            assert_matches_oracle(env, rows, c, env.rollup[c][1])
        env.close()


def test_the_minute_holding_rollup_ts_continues_from_its_stored_sum(tmp_path: Path) -> None:
    """A step reads the events after rollup_ts only, when the minute holding it was stored up to exactly
    rollup_ts: the same value as a whole-minute sum (a clear among the new events restarts it), read at the cost
    of the new events. Without such a row (here: a step that starts elsewhere) the minute is read whole."""
    env = Env(tmp_path)
    windows: list[tuple[str, int, int]] = []
    read_windows = env.events.bucket_sums_many

    async def spy(namespace, wins, width_us):
        windows.extend(wins)
        return await read_windows(namespace, wins, width_us)

    env.events.bucket_sums_many = spy  # type: ignore[method-assign]
    m = DAY0 + 10 * M
    rows = [ev(m + 1 * S, "a", 1), ev(m + 2 * S, "b", 1), ev(m + 10 * S, "c", 5)]
    env.write(rows)
    env.step(["c"], m + 5 * S)
    assert env.stored("c", MINUTE) == {m: 2}

    rows.append(ev(m + 20 * S, "d", 3))
    env.write(rows[-1:])
    windows.clear()
    env.step(["c"], m + 30 * S)
    assert windows == [("c", m + 5 * S, m + 30 * S)]  # from rollup_ts, not from the minute's start
    assert env.stored("c", MINUTE) == {m: 10}
    assert_matches_oracle(env, rows, "c", m + 30 * S)

    rows += [ev(m + 40 * S, "clear", 0, clear=True), ev(m + 40 * S, "same-time", 7), ev(m + 45 * S, "e", 4)]
    env.write(rows[-3:])
    env.step(["c"], m + 50 * S)
    assert env.stored("c", MINUTE) == {m: 4}  # the clear erased the stored 10 and the add at its very time
    assert_matches_oracle(env, rows, "c", m + 50 * S)

    windows.clear()
    env.step(["c"], m + 55 * S, rollup_from=m + 52 * S)  # the stored sum is up to m + 50 s, not m + 52 s
    assert windows == [("c", m - 1, m + 55 * S)]
    assert env.stored("c", MINUTE) == {m: 4}

    rows.append(ev(m + 57 * S, "f", 2))
    env.write(rows[-1:])
    windows.clear()
    env.step(["c"], m + 59 * S, continue_minutes=False)  # a recount's steps: every minute summed whole
    assert windows == [("c", m - 1, m + 59 * S)]
    assert env.stored("c", MINUTE) == {m: 6}
    env.close()


def test_a_late_step_into_an_hour_past_minute_retention_continues_the_hour(tmp_path: Path) -> None:
    """A worker step whose rollup_ts lies inside an hour whose minutes are past their retention (the rollup days
    late, or an accept_limit reaching past the minutes kept) adds its events to the stored hour and day. They were
    left as stored: a review's hour and day read 1 where the total was 11 (and 0 with a long accept_limit)."""
    env = Env(tmp_path, namespace({"retention": {"minute": "2h", "hour": "90d", "day": "forever"}}))
    env.write([ev(DAY0 + 10 * M, "e1", 1), ev(DAY0 + 40 * M, "e2", 10)])
    env.step("c", DAY0 + 20 * M)  # on time: e1 only; rollup_ts inside 00:00-01:00
    late = env.step("c", DAY0 + 50 * H, now_us=DAY0 + 50 * H + SETTLE)  # 50 h late: e2
    assert late.skipped == {} and env.rollup["c"][0] == 11
    assert env.stored("c", HOUR) == {DAY0: 11} and env.stored("c", DAY) == {DAY0: 11}
    assert env.stored("c", MINUTE) == {DAY0 + 10 * M: 1}  # e2's is past its 2 h retention: computed, not written
    # a clear among the late events restarts the hour after it: what follows it counts
    env.write([ev(DAY0 + 10 * M, "e1", 1, counter="d"), ev(DAY0 + 40 * M, "e2", 10, counter="d"),
               ev(DAY0 + 45 * M, "clear", 0, counter="d", clear=True), ev(DAY0 + 46 * M, "e3", 5, counter="d")])
    env.step("d", DAY0 + 20 * M)
    env.step("d", DAY0 + 50 * H, now_us=DAY0 + 50 * H + SETTLE)
    assert env.rollup["d"][0] == 5 and env.clear("d") == DAY0 + 45 * M
    assert env.stored("d", HOUR) == {DAY0: 5} and env.stored("d", DAY) == {DAY0: 5}
    env.close()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), boundaries=steps, lateness=st.lists(st.sampled_from([0, 3, 50]), max_size=8))
def test_late_steps_keep_hours_and_days_summing_to_the_total(seed, boundaries, lateness):
    """The property above with minutes kept 2 h and steps run on time or hours late (their minutes then past
    retention): the hours and days read as first principles say, and sum to the total."""
    rng = random.Random(seed)
    rows = random_events(rng, rng.randrange(1, 200), 56 * H)
    with tempfile.TemporaryDirectory() as directory:
        env = Env(Path(directory), namespace({"retention": {"minute": "2h", "hour": "90d", "day": "forever"}}))
        env.write(rows)
        now = 0
        for i, minutes in enumerate(sorted(boundaries)):
            boundary = T0 + minutes * M + rng.randrange(M)
            now = max(now, boundary + SETTLE + (lateness[i] if i < len(lateness) else 0) * H)
            env.step("ab", boundary, now_us=now)
            for c in env.rollup:
                assert_buckets_sum_to_total(env, c, (HOUR, DAY))
        for c in env.rollup:
            expected, last = oracle(rows, c, env.rollup[c][1])
            for g in (HOUR, DAY):
                got = env.stored(c, g)
                keys = set(got) | set(expected[g])
                assert {k: masked(g, k, got.get(k, 0), last) for k in keys} == {
                    k: masked(g, k, expected[g].get(k, 0), last) for k in keys}, g
        env.close()
