"""query_api.topk on real SQLite files: the Threshold Algorithm over the rank lists gives exactly the ranking and
counts of an oracle computed here from the events (ties by name), reading a small fraction of the rows a scan of
the namespace's counters would read.

The world: 10,000 counters with a Zipf-skewed load (every counter written at least once), events spread over five
hours with countries (and devices) on some, negative deltas on some, a few top counters cleared halfway; the
buckets and their rank lists are maintained as the worker's rollups maintain them (agents.rollup.rollup_counters
with a bucket store) in several steps. A second, small world with many ties checks every k against the oracle.
"""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any

import pytest

from agents.rollup import rollup_counters
from control_plane import Namespace, parse_namespaces
from query_api.topk import MAX_K, TopK, top_k
from query_api.windows import window_tiling
from schemas import INT64_MAX, combination
from sinks import (
    EventRow,
    InProcessRollupCache,
    Partitioning,
    SqliteBucketStore,
    SqliteEventStore,
    SqliteRollupStore,
)
from sinks.windows import WindowError

S = 1_000_000
M, H, D = 60 * S, 3600 * S, 86400 * S
DAY0 = 19_700 * D  # a UTC midnight
NOW = DAY0 + 14 * H + 10 * M + 3 * S
COUNTRIES = ("BR", "US", "FR", "IN")


def namespace(**extra: Any) -> Namespace:
    fields: dict[str, Any] = {
        "counter_type": "EVENTUAL", "accept_limit": "2s", "max_clock_skew": "250ms",
        "time_partition": {"buckets_per_id": 2, "seconds_per_bucket": 300, "seconds_per_slice": 3600},
        "dimensions": {"keys": ["country", "device"], "max_combinations": 100}, **extra}
    return parse_namespaces({"namespaces": {"ns": fields}})["ns"]


NS = namespace()  # minutes kept 48 h, hours 90 days, days forever


@dataclass
class World:
    """Events (and the oracle's view of them) in SQLite stores under ``directory``, rolled up by hand."""

    directory: Path
    ns: Namespace = NS
    events: dict[str, list[tuple[int, int, bool]]] = field(default_factory=lambda: defaultdict(list))
    rows: list[EventRow] = field(default_factory=list)

    def __post_init__(self) -> None:
        part = Partitioning.of(self.ns.time_partition)
        self.event_store = SqliteEventStore(self.directory / "events.sqlite3", lambda _: part)
        self.rollups = SqliteRollupStore(self.directory / "rollups.sqlite3")
        self.buckets = SqliteBucketStore(self.directory / "buckets.sqlite3")
        self.loop = asyncio.new_event_loop()

    def run(self, awaitable):
        return self.loop.run_until_complete(awaitable)

    def close(self) -> None:
        for store in (self.event_store, self.rollups, self.buckets):
            self.run(store.close())
        self.loop.close()

    def add(self, counter: str, t: int, eid: str, delta: int, dims: dict[str, str] | None = None) -> None:
        """A write as the persist path stores it: the counter and every combination of its dimensions."""
        pairs = sorted((dims or {}).items())
        names = [counter] + [combination(counter, c) for n in range(1, len(pairs) + 1) for c in combinations(pairs, n)]
        for name in names:
            self.rows.append((self.ns.name, name, t, eid, "", delta, False))
            self.events[name].append((t, delta, False))

    def clear(self, counter: str, t: int, eid: str) -> None:
        """A clear of the counter and of every combination of it (the persist path expands it)."""
        for name in [n for n in self.events if n == counter or n.startswith(counter + " ")]:
            self.rows.append((self.ns.name, name, t, eid, "", 0, True))
            self.events[name].append((t, 0, True))

    def roll_up(self, boundaries: Sequence[int]) -> None:
        """Store the events, then roll every counter up to each boundary in turn, buckets first (agents.rollup)."""
        for i in range(0, len(self.rows), 20_000):
            self.run(self.event_store.write_events(self.rows[i:i + 20_000]))
        previous = 0
        for boundary in boundaries:
            touched = sorted(n for n, evs in self.events.items() if any(previous < t <= boundary for t, _d, _c in evs))
            results = self.run(rollup_counters(self.ns, touched, events=self.event_store, rollups=self.rollups,
                                               cache=InProcessRollupCache(), buckets=self.buckets, now_us=NOW,
                                               watermark_us=boundary + int(self.ns.accept_limit_s * S) + 1))
            assert all(r.rollup_ts == boundary for r in results)
            previous = boundary

    # -- the oracle -------------------------------------------------------------------------------------------

    def count(self, name: str, lo: int, hi: int) -> int:
        """Adds in [lo, hi) strictly after the name's latest clear: what the masked buckets of the window sum to."""
        evs = self.events.get(name, [])
        last = max((t for t, _d, c in evs if c), default=None)
        return sum(d for t, d, c in evs if not c and lo <= t < hi and (last is None or t > last))

    def oracle(self, signature: str, lo: int, hi: int, k: int) -> list[tuple[str, int]]:
        counts = []
        for name in self.events:
            base, _, sig = name.partition(" ")
            if sig == signature and (n := self.count(name, lo, hi)) > 0:
                counts.append((base, n))
        return sorted(counts, key=lambda e: (-e[1], e[0]))[:k]

    def scan_rows(self, signature: str, answer: TopK) -> int:
        """Entries of every rank list of the window: what reading all the filter's counters would read."""
        tiling = window_tiling(self.ns, answer.start_us, answer.end_us, NOW)
        pages = [(signature, s.granularity, start, None, 10**9) for s in tiling.segments
                 for start in range(s.start_us, s.end_us, s.granularity.width_us)]
        return sum(len(entries) for entries in self.run(self.buckets.read_ranks_many(self.ns.name, pages)))

    def top(self, k: int, lo: int, hi: int, dims: dict[str, str] | None = None) -> TopK:
        return self.run(top_k(self.buckets, self.ns, k, lo, hi, tuple(sorted((dims or {}).items())), now_us=NOW))


BOUNDARIES = (NOW - 4 * H + 17 * S, NOW - 2 * H - 5 * M, NOW - 37 * M, NOW - 10 * S)  # the rollup steps


def zipf_world(directory: Path) -> World:
    rng = random.Random(15)
    w = World(directory)
    names = [f"title_{i}" for i in range(10_000)]
    ranked = names[:]
    rng.shuffle(ranked)  # popularity is unrelated to name order
    weights = [1 / (r + 1) ** 1.1 for r in range(len(ranked))]
    first, last = NOW - 5 * H, NOW - 30 * S

    def dims() -> dict[str, str]:
        roll = rng.random()
        if roll < 0.45:
            return {}
        country = rng.choices(COUNTRIES, (3, 4, 2, 1))[0]
        return {"country": country} if roll < 0.8 else {"country": country, "device": rng.choice(("tv", "phone"))}

    n = 0
    for name in names:  # every counter is written at least once
        w.add(name, rng.randrange(first, last), f"e{n}", rng.randint(1, 3), dims())
        n += 1
    for name in rng.choices(ranked, weights, k=60_000):
        delta = rng.randint(1, 3) if rng.random() > 0.05 else -rng.randint(1, 3)
        w.add(name, rng.randrange(first, last), f"e{n}", delta, dims())
        n += 1
    for name in ranked[30:50]:  # a large negative delta in one minute: negative buckets high in the lists' tails
        w.add(name, rng.randrange(first, last), f"e{n}", -400, {"country": "BR"})
        n += 1
    for i, name in enumerate(ranked[:12:3]):  # four of the top counters cleared halfway
        w.clear(name, NOW - 2 * H - 30 * M + i * 7 * M + 11 * S, f"clear-{i}")
    w.roll_up(BOUNDARIES)
    return w


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    w = zipf_world(tmp_path_factory.mktemp("topk"))
    yield w
    w.close()


WINDOWS = {
    "a minute": (NOW - 3 * H - 23 * M - 3 * S, NOW - 3 * H - 22 * M - 3 * S),
    "an hour": (DAY0 + 11 * H, DAY0 + 12 * H),
    "hours and minutes": (NOW - 4 * H - 17 * M - 5 * S, NOW - H - 43 * M + 2 * S),
    "the last hour": (NOW - H, NOW),
    "30 days": (NOW - 30 * D, NOW),
}


@pytest.mark.parametrize("window", sorted(WINDOWS))
@pytest.mark.parametrize("filter_", [{}, {"country": "BR"}], ids=["all", "BR"])
def test_top_10_equals_the_oracle_and_reads_a_few_rows(world: World, window: str, filter_: dict[str, str]) -> None:
    lo, hi = WINDOWS[window]
    answer = world.top(10, lo, hi, filter_)
    signature = " ".join(f"{k}={v}" for k, v in sorted(filter_.items()))
    expected = world.oracle(signature, answer.start_us, answer.end_us, 10)
    assert list(answer.items) == expected
    assert len(expected) == 10 and expected[0][1] >= 2 * expected[-1][1]  # a skewed load, not a trivial one
    assert answer.start_us <= lo and hi <= answer.end_us and answer.end_us - answer.start_us < hi - lo + H  # aligned
    # upto: the latest boundary among the buckets read (none when rank lists read to their end said everything)
    assert answer.upto_us in (0, *BOUNDARIES) and answer.upto_us <= BOUNDARIES[-1]
    scan = world.scan_rows(signature, answer)
    print(f"{window:>18} {signature or '(all)':>11}: {answer.rows_read:>5} rows ({answer.rank_rows} ranked, "
          f"{answer.bucket_rows} of {answer.candidates} candidates' buckets, {answer.rounds} rounds, "
          f"{answer.lists} lists); reading the filter's counters reads {scan}")
    if window == "hours and minutes":  # 36 minutes of edges that no hour covers: thin lists, read deep
        assert answer.rows_read < 0.5 * scan
    else:  # one or a few buckets: under 5% of the 10,000 counters
        assert answer.rows_read < 500


def test_cleared_and_negative_counters_rank_by_what_the_window_reads(world: World) -> None:
    """Buckets closed before a clear arrived (the hour 9:00, rolled up at 10:10) keep their old values, high in
    the lists: the answer verifies the cleared counters and leaves them out, as GetCount of the window reads 0."""
    lo, hi = NOW - 5 * H, NOW - 3 * H
    answer = world.top(MAX_K, lo, hi)
    assert list(answer.items) == world.oracle("", answer.start_us, answer.end_us, MAX_K)
    cleared = {name for name, evs in world.events.items() if " " not in name and any(c for _t, _d, c in evs)}
    assert len(cleared) == 4 and not cleared & {name for name, _ in answer.items}
    [head] = world.run(world.buckets.read_ranks_many(NS.name, [("", "hour", DAY0 + 9 * H, None, 5)]))
    assert any(name in cleared and value > answer.items[9][1] for name, value in head)  # masked, yet high in the list
    br = world.top(MAX_K, NOW - 5 * H, NOW, {"country": "BR"})
    assert list(br.items) == world.oracle("country=BR", br.start_us, br.end_us, MAX_K)


@pytest.mark.parametrize("k", [1, 2, 3, 50, MAX_K])
def test_every_k_and_a_two_key_filter(world: World, k: int) -> None:
    for lo, hi, dims in ((*WINDOWS["hours and minutes"], {}), (*WINDOWS["the last hour"], {"country": "US"}),
                         (*WINDOWS["30 days"], {"country": "FR", "device": "tv"})):
        answer = world.top(k, lo, hi, dims)
        signature = " ".join(f"{key}={v}" for key, v in sorted(dims.items()))
        assert list(answer.items) == world.oracle(signature, answer.start_us, answer.end_us, k), (k, dims)


def test_windows_with_nothing_and_filters_nobody_wrote(world: World) -> None:
    empty = world.top(10, NOW - 20 * D, NOW - 19 * D)
    assert empty.items == () and empty.upto_us == 0 and empty.rows_read == 0
    assert world.top(10, NOW - H, NOW, {"country": "XX"}).items == ()
    assert world.top(10, NOW - H, NOW, {"device": "radio"}).items == ()


def test_refusals(world: World, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="k must be"):
        world.top(0, NOW - H, NOW)
    with pytest.raises(ValueError, match="k must be"):
        world.top(MAX_K + 1, NOW - H, NOW)
    with pytest.raises(WindowError) as exc:
        world.top(10, NOW, NOW - H)
    assert exc.value.field == "window"
    with pytest.raises(WindowError) as exc:
        world.run(top_k(world.buckets, namespace(windows={"granularities": []}), 10, NOW - H, NOW, now_us=NOW))
    assert exc.value.field == "window" and "no time windows" in exc.value.reason
    with pytest.raises(WindowError) as exc:
        world.top(10, NOW - 5 * 365 * D, NOW)
    assert exc.value.field == "window" and "shorter window" in exc.value.reason


# -- many ties, every k --------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_ties_and_small_counts_for_every_k(tmp_path: Path, seed: int) -> None:
    """Few events over 300 counters: counts of 1-3 tie by the dozen, so the answer's tail is decided by name.
    Every k from 1 to 40 over several windows equals the oracle."""
    rng = random.Random(seed)
    w = World(tmp_path)
    names = [f"c{rng.randrange(10**6)}" for _ in range(300)]
    for i in range(900):
        delta = rng.choice((1, 1, 1, 2, -1, 0))
        dims = {"country": rng.choice(COUNTRIES[:2])} if rng.random() < 0.5 else {}
        w.add(rng.choice(names), rng.randrange(NOW - 3 * H, NOW - 20 * S), f"e{i}", delta, dims)
    for i, name in enumerate(rng.sample(names, 5)):
        w.clear(name, rng.randrange(NOW - 3 * H, NOW - 20 * S), f"clr{i}")
    w.roll_up([NOW - 2 * H, NOW - 10 * S])
    try:
        for lo, hi in ((NOW - 2 * H - 30 * M, NOW - 2 * H - 29 * M), (NOW - 3 * H, NOW), (NOW - 150 * M, NOW - 61 * M)):
            for signature, dims in (("", {}), ("country=BR", {"country": "BR"})):
                for k in range(1, 41):
                    answer = w.top(k, lo, hi, dims)
                    assert list(answer.items) == w.oracle(signature, answer.start_us, answer.end_us, k), (lo, hi, k)
    finally:
        w.close()


def test_a_tie_with_the_threshold_reads_on_until_no_unseen_name_can_win_it(tmp_path: Path) -> None:
    """k = 1 over two minutes. After the first pages (8 entries each) "z" counts 2, the threshold is 1 + 1 and no
    name read so far reaches "z": an unseen counter holding 1 in both minutes would tie "z" and win by its name.
    One does: "d"."""
    w = World(tmp_path)
    m1 = NOW // M * M - 30 * M
    m2 = m1 + M
    n = 0

    def add(counter: str, t: int, delta: int) -> None:
        nonlocal n
        n += 1
        w.add(counter, t + n, f"e{n}", delta)
    add("z", m1, 2)
    for i in range(8):
        add(f"a{i}", m1, 1)
        add(f"b{i}", m2, 1)
    add("d", m1, 1)
    add("d", m2, 1)
    w.roll_up([NOW - 10 * S])
    try:
        answer = w.top(1, m1, m2 + M)
        assert answer.items == (("d", 2),) and answer.rounds >= 2
        assert list(w.top(3, m1, m2 + M).items) == [("d", 2), ("z", 2), ("a0", 1)]
    finally:
        w.close()


@pytest.mark.parametrize("beside", [0, 10])
def test_a_counter_whose_hour_saturated_ranks_by_what_the_window_reads(tmp_path: Path, beside: int) -> None:
    """The window [14:01, 14:09) is the hour 14:00 minus its other minutes. An hour holding 2^63 - 1 + 2^63 - 1 is
    saturated at 2^63 - 1, not their sum: minus the 14:00 minute (2^63 - 1) it read 0, and "a", which GetCount of
    the window reads at 2^63 - 1, was not ranked (a review). With 10 more outside the window the hour is still at the
    bound, and the window still holds 2^63 - 1."""
    top = INT64_MAX
    w = World(tmp_path)
    h14 = DAY0 + 14 * H
    w.add("a", h14 + 30 * S, "e1", top)  # 14:00, outside the window
    w.add("a", h14 + 5 * M, "e2", top)  # 14:05, inside
    if beside:
        w.add("a", h14 + 9 * M + S, "e3", beside)  # 14:09, outside
    w.add("b", h14 + 6 * M, "e4", 5)
    w.roll_up([NOW - 10 * S])
    try:
        lo, hi = h14 + M, h14 + 9 * M
        assert w.oracle("", lo, hi, 10) == [("a", top), ("b", 5)]
        assert list(w.top(10, lo, hi).items) == [("a", top), ("b", 5)]
        assert list(w.top(1, lo, hi).items) == [("a", top)]
    finally:
        w.close()
