"""GET /v1/pipeline's rollup figures from a real SQLite rollup store (no broker): pending counters per namespace,
where their oldest work starts, and what reading them costs the store."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterator
from typing import Any, TypeVar

import pytest

from control_plane import NamespaceRegistry, parse_namespaces
from query_api.pipeline_health import PipelineHealth, Snapshot, render
from schemas import MICROS, Mutation
from sinks import SqliteRollupStore
from streams.settings import Settings

T = TypeVar("T")

NAMESPACES = """
namespaces:
  crowd: { counter_type: EVENTUAL }
  few: { counter_type: ACCURATE }
  fast: { counter_type: BEST_EFFORT }
"""
NOW = 1_800_000_000 * MICROS
SETTINGS = Settings(kafka_bootstrap="127.0.0.1:9", mutations_topic="m", rollups_topic="r", dlq_topic="d")


def run(awaitable: Awaitable[T]) -> T:
    async def wait() -> T:
        return await awaitable
    return asyncio.run(wait())


@pytest.fixture
def registry() -> NamespaceRegistry:
    return parse_namespaces(NAMESPACES)


@pytest.fixture
def rollups(tmp_path) -> Iterator[SqliteRollupStore]:
    store = SqliteRollupStore(tmp_path / "rollups.sqlite3")
    yield store
    run(store.close())


def health_of(registry: NamespaceRegistry, rollups: SqliteRollupStore, **kw: Any) -> PipelineHealth:
    return PipelineHealth(SETTINGS, registry, rollups, **kw)


def rollup_rows(health: PipelineHealth) -> dict[str, dict[str, Any]]:
    """The rollups part of the body, per namespace, as of NOW."""
    store = run(health._store_figures())
    body = render(Snapshot(NOW, store, None, {}, {}, None, {}), health.registry, SETTINGS, lambda name: True)
    assert body["pending_truncated"] == any(r["pending_truncated"] for r in body["rollups"])
    return {r.pop("namespace"): r for r in body["rollups"]}


def at(us: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(us // MICROS))


def converge(rollups: SqliteRollupStore, ns: str, counters: list[str], t: int) -> None:
    run(rollups.bump_last_write([(ns, c, t) for c in counters]))
    run(rollups.write_rollups(ns, [(c, 1, t) for c in counters]))


def test_a_counter_never_rolled_up_lags_from_its_last_write(registry, rollups):
    """One pending counter never rolled up (rollup_ts 0) made its namespace's rolled_up_to and lag null, hiding
    the work waiting; it counts from its last write instead. Retention's bound still waits for it."""
    converge(rollups, "few", ["done"], NOW - 50 * MICROS)
    run(rollups.bump_last_write([("few", "new", NOW - 30 * MICROS)]))
    rows = rollup_rows(health_of(registry, rollups))
    assert rows["few"] == {"pending_counters": 1, "pending_truncated": False, "rolled_up_to": at(NOW - 30 * MICROS),
                           "lag_s": 30.0}
    assert rows["crowd"] == {"pending_counters": 0, "pending_truncated": False, "rolled_up_to": None, "lag_s": 0.0}
    assert "fast" not in rows  # BEST_EFFORT: never rolled up
    assert run(rollups.min_rollup_ts("few")) == 0
    run(rollups.bump_last_write([("few", "done", NOW - 10 * MICROS)]))  # pending again (since 10 s), rolled up 50 s ago
    assert rollup_rows(health_of(registry, rollups))["few"] == {
        "pending_counters": 2, "pending_truncated": False, "rolled_up_to": at(NOW - 30 * MICROS), "lag_s": 30.0}


def test_a_counter_idle_for_a_day_lags_from_its_new_write_not_from_its_old_rollup(registry, rollups):
    """A counter rolled up a day ago and written once now showed a day of lag until its next rollup (a false alarm
    on every first write after a quiet spell): its pending work starts at that write. A counter written without
    pause never converges, so its work starts where its last rollup stopped; one stuck behind writes that keep
    coming lags from when it turned pending, however many came after."""
    day = 86_400 * MICROS
    converge(rollups, "few", ["idle"], NOW - day)
    run(rollups.bump_last_write([("few", "idle", NOW - 2 * MICROS)]))
    assert rollup_rows(health_of(registry, rollups))["few"]["lag_s"] == 2.0
    run(rollups.bump_last_write([("few", "idle", NOW - 1 * MICROS)]))  # more writes keep where the work began
    run(rollups.write_rollups("few", [("idle", 2, NOW - 1 * MICROS)]))  # converged
    converge(rollups, "crowd", ["hot", "stuck"], NOW - 60 * MICROS)
    run(rollups.bump_last_write([("crowd", "hot", NOW - 40 * MICROS), ("crowd", "stuck", NOW - 45 * MICROS)]))
    run(rollups.write_rollups("crowd", [("hot", 5, NOW - 20 * MICROS)]))  # rolled up to 20 s ago, written since
    run(rollups.bump_last_write([("crowd", "hot", NOW - 5 * MICROS), ("crowd", "stuck", NOW - 5 * MICROS)]))
    rows = rollup_rows(health_of(registry, rollups))
    assert rows["few"]["pending_counters"] == 0
    assert rows["crowd"]["pending_counters"] == 2 and rows["crowd"]["lag_s"] == 45.0  # "stuck", not "hot" (20 s)


def test_a_pending_row_from_before_pending_since_lags_from_its_rollup(registry, rollups, tmp_path):
    """A rollups file written by a version without the column: its pending rows read 0 there and count from their
    rollup_ts, as before; the column is added when the file is opened."""
    converge(rollups, "few", ["old"], NOW - 50 * MICROS)
    run(rollups.bump_last_write([("few", "old", NOW - 10 * MICROS)]))

    async def as_before() -> None:  # what an older version's bump left: no pending_since
        await rollups._db.run(lambda conn: rollups._db.write(
            conn, lambda c: c.execute("UPDATE rollups SET pending_since = 0")))
    run(as_before())
    assert rollup_rows(health_of(registry, rollups))["few"]["lag_s"] == 50.0


def test_pending_counts_are_per_namespace_and_stable_beyond_the_limit(registry, rollups):
    """Above the limit the view counted a slice of the sweep's rotating query: a namespace sorting late read 0,
    counts changed from one snapshot to the next, and each snapshot moved the store's sweep cursor."""
    crowd, few = [f"c{i:02d}" for i in range(30)], [f"c{i}" for i in range(3)]
    converge(rollups, "crowd", crowd, NOW - 20 * MICROS)
    converge(rollups, "few", few, NOW - 5 * MICROS)
    run(rollups.bump_last_write([("crowd", c, NOW - 7 * MICROS) for c in crowd]
                                + [("few", c, NOW - 3 * MICROS) for c in few]))  # pending since then
    health = health_of(registry, rollups, pending_limit=20)
    first = run(rollups.stale(limit=10))
    for _ in range(3):
        rows = rollup_rows(health)
        assert rows["crowd"] == {"pending_counters": 20, "pending_truncated": True,
                                 "rolled_up_to": at(NOW - 7 * MICROS), "lag_s": 7.0}
        assert rows["few"] == {"pending_counters": 3, "pending_truncated": False,
                               "rolled_up_to": at(NOW - 3 * MICROS), "lag_s": 3.0}
    assert not set(first) & set(run(rollups.stale(limit=10)))  # the sweep goes on where it was


def vm_steps(rollups: SqliteRollupStore, work: Awaitable[object]) -> int:
    """SQLite VM instructions (in tens) `work` costs the store's connection: a measure of rows read that does not
    depend on the machine's speed."""
    steps = 0

    def tick() -> int:
        nonlocal steps
        steps += 1
        return 0
    rollups._db.run_sync(lambda conn: conn.set_progress_handler(tick, 10))
    try:
        run(work)
    finally:
        rollups._db.run_sync(lambda conn: conn.set_progress_handler(None, 10))
    return steps


def test_rollup_figures_cost_the_pending_counters_not_the_namespace(registry, rollups):
    """Each snapshot (every couple of seconds) scanned every namespace whole (min_rollup_ts); the figures now read
    the pending counters only, so 20,000 more converged counters cost (almost) nothing more."""
    converge(rollups, "crowd", [f"c{i:05d}" for i in range(100)], NOW - 60 * MICROS)
    run(rollups.bump_last_write([("crowd", "late", NOW - 2 * MICROS), ("few", "new", NOW - MICROS)]))
    health = health_of(registry, rollups)
    small = vm_steps(rollups, health._store_figures())
    converge(rollups, "crowd", [f"d{i:05d}" for i in range(20_000)], NOW - 60 * MICROS)
    converge(rollups, "few", [f"d{i:05d}" for i in range(20_000)], NOW - 60 * MICROS)
    large = vm_steps(rollups, health._store_figures())
    assert large <= small + 20, (small, large)  # a deeper b-tree costs a few more steps per seek, not per row
    assert rollup_rows(health)["crowd"]["pending_counters"] == 1


def test_the_local_brokers_long_partitions_are_a_warning_and_other_brokers_are_not_judged(registry):
    """The local broker (Tansu) lists every batch of a partition at each fetch and stalls from 22,000-26,000 batches in
    one (bench/RESULTS.md): the view warns from LONG_PARTITION on, naming the partition; Apache Kafka's partitions of
    that length are nothing to warn of."""
    from infra.broker import LONG_PARTITION, TANSU_CLUSTER_ID
    from query_api.broker_offsets import TopicOffsets
    from query_api.pipeline_health import BrokerFigures

    def warnings(cluster_id: str | None, ends: dict[int, int]) -> list[str]:
        mutations = TopicOffsets("m", dict.fromkeys(ends, 0), ends, {})
        broker = BrokerFigures(mutations, None, None, {}, [], {}, cluster_id)
        return render(Snapshot(NOW, None, broker, {}, {}, None, {}), registry, SETTINGS, lambda name: True)["warnings"]

    assert warnings(TANSU_CLUSTER_ID, {0: 10, 1: LONG_PARTITION - 1}) == []
    [warning] = warnings(TANSU_CLUSTER_ID, {0: 10, 1: LONG_PARTITION + 5, 2: 7})
    assert warning.startswith(f"m partition 1 holds {LONG_PARTITION + 5:,} records") and "Restart" in warning
    assert warnings("kafka-prod-cluster", {0: 10 * LONG_PARTITION}) == []


def test_persisting_that_stands_still_while_records_wait_is_a_warning(registry):
    """A worker down or hung, or its store failing (a full disk, a lock held by another process), left `errors` empty:
    the API's own reads still worked (a review). A partition that persisted nothing for STALLED_AFTER_S while records
    wait on it is a warning naming it; a shorter spell, records persisted, or none waiting is not. Per partition, from
    the first snapshot that saw it: the persisted total kept moving while one worker of several hung, and the rate
    window's samples capped a stall at 58 s (reviews)."""
    from query_api.broker_offsets import TopicOffsets
    from query_api.pipeline_health import STALLED_AFTER_S, BrokerFigures, Stalled

    stalled = Stalled()

    def warnings(at: float, committed: int, other: int = 700) -> list[str]:
        mutations = TopicOffsets("m", {0: 0, 1: 0}, {0: 500, 1: 700 + at}, {0: committed, 1: other})
        broker = BrokerFigures(mutations, None, None, {}, [], {}, "kafka-prod-cluster")
        snapshot = Snapshot(NOW, None, broker, {}, {}, 60.0, {}, stalled.observe(at, mutations))
        return render(snapshot, registry, SETTINGS, lambda name: True)["warnings"]

    assert warnings(0.0, committed=100) == []  # first seen: the clock starts
    assert warnings(STALLED_AFTER_S - 1, committed=100, other=710) == []  # too short to tell
    for t in range(30, 121, 2):  # partition 1 keeps persisting (another worker), partition 0 does not
        found = warnings(float(t), committed=100, other=700 + t)
    [warning] = found
    assert warning.startswith("the workers persisted no record of m partition(s) 0 in the last 120 s while 400 wait "
                              "there"), warning  # past the 60 s rate window, though the total moved
    assert warnings(122.0, committed=101, other=822) == []  # it moved: the clock starts again
    assert warnings(122.0 + STALLED_AFTER_S + 5, committed=500, other=822 + 35) == []  # idle: nothing waits
    assert stalled.observe(200.0, None) is None  # the broker did not answer: not measured
    # an idle hour with no snapshot, then a write not yet persisted: waiting since it was first seen, not an hour (a
    # review of the persisted total's clock, which read "in the last 3600 s while 1 wait")
    assert warnings(4000.0, committed=499, other=700 + 4000) == []


def test_a_watermark_standing_behind_persisted_records_is_a_warning(registry):
    """A review: a worker joined with another store persisted and committed its partitions into a store no API reads;
    their watermarks here stood still and rollups waited for minutes, with `warnings: []`. A caught-up partition
    whose watermark stands WATERMARK_STALLED_S behind the latest write is now a warning naming it; one still
    persisting (records wait: the stall warning's case) or within the bound is not."""
    from query_api.broker_offsets import TopicOffsets
    from query_api.pipeline_health import WATERMARK_STALLED_S, BrokerFigures, StoreFigures

    def warnings(behind_s: float, committed: int) -> list[str]:
        mutations = TopicOffsets("m", {0: 0, 1: 0}, {0: 500, 1: 700}, {0: 500, 1: committed})
        broker = BrokerFigures(mutations, None, None, {}, [], {}, "kafka-prod-cluster")
        store = StoreFigures({0: NOW - MICROS, 1: NOW - int(behind_s * MICROS)}, NOW, {})
        return render(Snapshot(NOW, store, broker, {}, {}, None, {}), registry, SETTINGS, lambda name: True)["warnings"]

    [warning] = warnings(WATERMARK_STALLED_S + 86, committed=700)
    assert warning.startswith(f"the persist watermark of {SETTINGS.mutations_topic} partition(s) 1 stands 146 s "
                              "behind though their records were persisted"), warning
    assert warnings(WATERMARK_STALLED_S - 5, committed=700) == []
    assert warnings(WATERMARK_STALLED_S + 86, committed=650) == []  # still persisting: not this warning's case


def test_the_route_model_serves_every_figure_render_gives(registry):
    """A review: `warnings` was computed but missing from the route's response model, so FastAPI dropped it and
    neither GET /v1/pipeline nor the health page ever showed one. Every figure must survive the model."""
    from query_api.broker_offsets import TopicOffsets
    from query_api.inspect_models import PipelineHealthResponse
    from query_api.pipeline_health import STALLED_AFTER_S, BrokerFigures

    mutations = TopicOffsets("m", {0: 0}, {0: 500}, {0: 100})
    broker = BrokerFigures(mutations, None, None, {}, [], {}, "kafka-prod-cluster")
    rendered = render(Snapshot(NOW, None, broker, {}, {}, 60.0, {}, {0: STALLED_AFTER_S + 1}), registry, SETTINGS,
                      lambda name: True)
    served = PipelineHealthResponse.model_validate(rendered).model_dump(mode="json")
    assert set(served) == set(rendered) and served["warnings"] == rendered["warnings"] != []


def test_a_dead_letter_shows_its_reason_key_and_record_only_to_a_reader_of_every_namespace_it_may_hold():
    """A review read a keyed namespace's counter names and deltas on the health page without a key: an undecodable
    record showed to anyone, a record keyed `my_dataset:x` was judged as my_dataset's, and reasons (which quote
    counter names and dimension values) were never hidden."""
    from query_api.broker_offsets import TopicOffsets
    from query_api.pipeline_health import BrokerFigures
    from schemas import MutationOp, encode_batch
    from schemas.dead_letter import REASON, DeadRecord

    registry = parse_namespaces("""
namespaces:
  open: { counter_type: EVENTUAL }
  secret: { counter_type: EVENTUAL, api_keys: [{ key: r, scopes: [read] }] }
""")
    undecodable = b'{"namespace": "secret", "counter_name": "layoffs", "delta": 300, "delta": 300}'
    mixed = encode_batch([Mutation("open", "a", 1, NOW, "t1", "", MutationOp.ADD),
                          Mutation("secret", "salary", 1, NOW, "t2", "", MutationOp.ADD)])
    letters = [DeadRecord(0, i, NOW, key, value, {REASON: f"why {i}: secret's salary"})
               for i, (key, value) in enumerate([(b"open:x", undecodable), (None, mixed),
                                                  (None, b'{"namespace": "open", "counter_name": "b", "delta": 1}')])]
    dlq = TopicOffsets("d", {0: 0}, {0: 3}, {})
    broker = BrokerFigures(None, None, dlq, {0: 3}, letters, {}, "kafka-prod-cluster")

    def shown(key: str | None) -> list[tuple[str, str | None]]:
        body = render(Snapshot(NOW, None, broker, {}, {}, None, {}), registry, SETTINGS,
                      lambda name: registry[name].allows(key, "read"))
        return [(d["reason"], d["key"]) for d in body["dlq"]["dead_letters"]]

    hidden = "(hidden: the namespace's read key is needed)"
    assert shown(None) == [(hidden, None), (hidden, None), ("why 2: secret's salary", "")]
    assert shown("r") == [("why 0: secret's salary", "open:x"), ("why 1: secret's salary", ""),
                          ("why 2: secret's salary", "")]


def test_the_rollups_of_a_keyed_namespace_show_only_to_its_readers():
    """A review: the health page's "Rollups per namespace" showed a keyed namespace's pending counters and lag to a
    caller without its key."""
    from query_api.pipeline_health import StoreFigures
    from sinks.model import PendingRollups

    registry = parse_namespaces("""
namespaces:
  open: { counter_type: EVENTUAL }
  secret: { counter_type: EVENTUAL, api_keys: [{ key: r, scopes: [read] }] }
""")
    store = StoreFigures({}, None, {"open": PendingRollups(2, NOW - MICROS),
                                    "secret": PendingRollups(7, NOW - 9 * MICROS)})

    def rows(key: str | None) -> dict[str, int]:
        body = render(Snapshot(NOW, store, None, {}, {}, None, {}), registry, SETTINGS,
                      lambda name: registry[name].allows(key, "read"))
        return {r["namespace"]: r["pending_counters"] for r in body["rollups"]}

    assert rows(None) == {"open": 2} and rows("r") == {"open": 2, "secret": 7}


def test_a_partition_without_a_watermark_while_writes_wait_is_a_warning_after_a_while(registry):
    """A partition no worker owns (none runs, partitions added that the group has not handed out) has no watermark,
    so no lag figure, and every rollup waited for it unwarned. Once a write needs watermarks (the store's covering
    mark) and this process has seen a partition without one for WATERMARK_STALLED_S, it is a warning naming it; an
    idle stack, where no write needs one, is not."""
    from query_api.broker_offsets import TopicOffsets
    from query_api.pipeline_health import WATERMARK_STALLED_S, BrokerFigures, StoreFigures, Unmarked

    mutations = TopicOffsets("m", {0: 0, 1: 0, 2: 0}, {0: 500, 1: 700, 2: 0}, {0: 500, 1: 700})
    written = StoreFigures({0: NOW, 1: NOW}, NOW - MICROS, {})
    idle = StoreFigures({}, None, {})
    unmarked = Unmarked()

    def warnings(at: float, store: StoreFigures | None) -> list[str]:
        seen = unmarked.observe(at, store, mutations)
        broker = BrokerFigures(mutations, None, None, {}, [], {}, "kafka-prod-cluster")
        snapshot = Snapshot(NOW, store, broker, {}, {}, None, {}, None, seen)
        return render(snapshot, registry, SETTINGS, lambda name: True)["warnings"]

    assert warnings(0.0, idle) == [] and warnings(WATERMARK_STALLED_S + 10, idle) == []  # nothing waits: no warning
    assert warnings(100.0, written) == []  # just seen
    assert warnings(100.0 + WATERMARK_STALLED_S - 1, written) == []
    assert warnings(100.0 + WATERMARK_STALLED_S - 0.5, None) == []  # the store did not answer: the clock runs on
    [warning] = warnings(100.0 + WATERMARK_STALLED_S + 5, written)
    assert warning.startswith("m partition(s) 2 have had no persist watermark for 65 s while writes wait"), warning
    healed = StoreFigures({0: NOW, 1: NOW, 2: NOW}, NOW - MICROS, {})
    assert warnings(200.0, healed) == [] and unmarked.since == {}
    assert warnings(201.0, written) == []  # missing again: counted from now


def test_a_cache_that_does_not_answer_is_an_error_of_the_page(registry: NamespaceRegistry,
                                                              rollups: SqliteRollupStore) -> None:
    """A review: memcached stopped, /readyz said "cache unreachable" and BEST_EFFORT adds failed, while GET
    /v1/pipeline (and the health page) had no error at all. Each cache is checked as /readyz checks it, briefly."""
    from query_api import pipeline_health

    class Cache:
        def __init__(self, answer: Any) -> None:
            self.answer = answer

        async def healthy(self) -> bool:
            if isinstance(self.answer, Exception):
                raise self.answer
            if self.answer is None:  # hung (SIGSTOP)
                await asyncio.sleep(60)
            return bool(self.answer)

    def errors(**caches: Cache) -> dict[str, str]:
        return run(health_of(registry, rollups, caches=caches)._cache_errors())

    assert errors(cache=Cache(True), best_effort_counters=Cache(True)) == {}
    down = errors(cache=Cache(False), best_effort_counters=Cache(OSError("refused")))
    assert down == {"cache": pipeline_health.CACHE_DOWN["cache"],
                    "best_effort_counters": pipeline_health.CACHE_DOWN["best_effort_counters"]}
    started = time.monotonic()
    assert set(errors(cache=Cache(None), best_effort_counters=Cache(None))) == {"cache", "best_effort_counters"}
    assert time.monotonic() - started < 2 * pipeline_health.CACHE_CHECK_S  # checked side by side, not waited out


def test_metrics_answer_without_the_pipeline_figures_when_these_take_too_long(monkeypatch) -> None:
    """A review: /metrics waited for the pipeline's snapshot, so a broker in trouble (3 s per unanswered partition)
    could take every API metric past Prometheus's scrape timeout. The wait is bounded; the rest is served."""
    import httpx
    from fastapi import FastAPI

    from query_api.routes import ops

    class SlowHealth:
        async def snapshot(self) -> Snapshot:
            await asyncio.sleep(1.0)
            raise RuntimeError("never reached in time")

    app = FastAPI()
    app.include_router(ops.router)
    app.state.health = SlowHealth()
    monkeypatch.setattr(ops, "PIPELINE_WAIT_S", 0.1)
    async def scrape() -> tuple[httpx.Response, float]:
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            started = time.monotonic()
            return await client.get("/metrics"), time.monotonic() - started

    answer, waited = run(scrape())
    assert answer.status_code == 200 and waited < 0.9, waited
    assert "counter_pipeline_errors 1.0" in answer.text and "# TYPE counter_api_requests_total counter" in answer.text
