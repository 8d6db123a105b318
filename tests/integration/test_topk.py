"""GetTopK end to end: real broker, real worker, SQLite, memcached and the HTTP API.

A few hundred counters get a Zipf-skewed load, most of it as Avro records from CounterProducer (single and
client-side batched, with countries and devices on some writes), the rest over HTTP (AddCount, BatchAddCount),
with retries of the same tokens, negative deltas and a clear of one of the top counters midway. Once the pipeline
has converged, GetTopK equals an oracle computed here from the writes the broker acknowledged, for several
windows (the last hour, a range ending midway, 30 days), filters and k; its validation errors name the field and
its API keys are the namespace's read scope.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from datetime import datetime
from itertools import combinations as choose
from pathlib import Path

import httpx
import pytest

from producers import CounterProducer
from schemas import MICROS, combination
from tests.helpers import iso, now_us, refused, wait_for
from tests.pipeline_harness import FAST_DEFAULTS, PipelineEnv, worker_and_api

pytestmark = pytest.mark.integration

NS = "plays"
NAMESPACES = FAST_DEFAULTS + """\
namespaces:
  plays:
    counter_type: EVENTUAL
    dimensions: { keys: [country, device], max_combinations: 50 }
  secured:
    counter_type: EVENTUAL
    api_keys:
      - { key: "reader-key", scopes: [read] }
      - { key: "writer-key", scopes: [write] }
  flat:
    counter_type: EVENTUAL
    windows: { granularities: [] }
  fast:
    counter_type: BEST_EFFORT
  visitors:
    counter_type: EVENTUAL
    aggregation: UNIQUE
"""
COUNTRIES, DEVICES = ("BR", "US", "FR"), ("tv", "phone")


@dataclass(frozen=True)
class Write:
    counter: str
    dims: tuple[tuple[str, str], ...]
    event_time: int
    token: str
    delta: int
    clear: bool = False


def at(text: str) -> int:
    return round(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * MICROS)


def counts(writes: list[Write], start: int, end: int) -> dict[str, int]:
    """Every counter and combination's count over [start, end): distinct (name, time, token) events, a clear of the
    base counter applying to all its combinations, adds strictly after the latest clear (of any time)."""
    events: dict[tuple[str, int, str], Write] = {}
    for w in writes:
        names = [w.counter]
        if not w.clear:
            names += [combination(w.counter, c) for n in range(1, len(w.dims) + 1) for c in choose(w.dims, n)]
        for name in names:
            events.setdefault((name, w.event_time, w.token), w)
    clears: dict[str, int] = {}
    for w in events.values():
        if w.clear:
            clears[w.counter] = max(clears.get(w.counter, -1), w.event_time)
    out: dict[str, int] = {}
    for (name, t, _), w in events.items():
        if not w.clear and start <= t < end and t > clears.get(w.counter, -1):
            out[name] = out.get(name, 0) + w.delta
    return out


def oracle(writes: list[Write], start: int, end: int, dims: dict[str, str], k: int) -> list[dict[str, object]]:
    signature = " ".join(f"{key}={value}" for key, value in sorted(dims.items()))
    ranked = []
    for name, n in counts(writes, start, end).items():
        base, _, sig = name.partition(" ")
        if sig == signature and n > 0:
            ranked.append((base, n))
    ranked.sort(key=lambda e: (-e[1], e[0]))
    return [{"counter_name": c, "count": n} for c, n in ranked[:k]]


def test_top_k_end_to_end(kafka_bootstrap: str, memcached_address: str, tmp_path: Path) -> None:
    with worker_and_api(kafka_bootstrap, memcached_address, tmp_path, NAMESPACES) as (env, client):
        _run(env, client)


def _load(env: PipelineEnv, client: httpx.Client) -> tuple[list[Write], int, int]:
    """The writes (as acknowledged), the time before the first and the time halfway."""
    rng = random.Random(15)
    names = [f"title_{i}" for i in range(300)]
    popular = names[:]
    rng.shuffle(popular)
    weights = [1 / (r + 1) ** 1.1 for r in range(len(popular))]
    writes: list[Write] = []
    pending: list[Write] = []
    first = now_us()

    def draw(i: int) -> Write:
        roll = rng.random()
        dims: dict[str, str] = {}
        if roll < 0.6:
            dims["country"] = rng.choices(COUNTRIES, (3, 2, 1))[0]
            if roll < 0.3:
                dims["device"] = rng.choice(DEVICES)
        delta = rng.randint(1, 4) if rng.random() > 0.06 else -rng.randint(1, 4)
        counter = names[i] if i < len(names) else rng.choices(popular, weights)[0]  # everyone once, then Zipf
        return Write(counter, tuple(sorted(dims.items())), now_us(), f"w{i}", delta)

    def http(batch: list[Write]) -> None:
        body = {"requests": [{"namespace": NS, "counter_name": w.counter, "delta": w.delta, "dimensions": dict(w.dims),
                              "idempotency_token": {"token": w.token, "generation_time": iso(w.event_time)}}
                             for w in batch]}
        for _attempt in range(2):  # and a retry of the same batch: counted once
            r = client.post("/v1/BatchAddCount", json=body)
            assert r.status_code == 200, r.text

    middle = 0
    with CounterProducer(env.bootstrap, topic=env.mutations_topic) as single, \
            CounterProducer(env.bootstrap, topic=env.mutations_topic, batch_size=100) as batched:
        for i in range(3000):
            w = draw(i)
            writes.append(w)
            if i % 5 == 4:  # a fifth over HTTP, fifty at a time
                pending.append(w)
                if len(pending) == 50:
                    http(pending)
                    pending.clear()
                continue
            (batched if i % 3 else single).add(NS, w.counter, w.delta, token=w.token, generation_time=w.event_time,
                                              dimensions=dict(w.dims))
            if i % 11 == 0:  # a retry: the same token and time
                batched.add(NS, w.counter, w.delta, token=w.token, generation_time=w.event_time,
                            dimensions=dict(w.dims))
            if i == 1500:  # halfway: one of the top counters is cleared
                time.sleep(0.05)
                middle = now_us()
                time.sleep(0.05)
                t = now_us()
                r = client.post("/v1/ClearCount", json={"namespace": NS, "counter_name": popular[2],
                                                        "idempotency_token": {"token": "clear-1",
                                                                              "generation_time": iso(t)}})
                assert r.status_code == 200, r.text
                writes.append(Write(popular[2], (), t, "clear-1", 0, clear=True))
        if pending:
            http(pending)
        single.flush()
        batched.flush()
    r = client.post("/v1/AddCount", json={"namespace": NS, "counter_name": popular[1], "delta": 40,
                                          "dimensions": {"country": "BR", "device": "tv"}})
    assert r.status_code == 200, r.text
    # a write without a token: the service's token, and its arrival time (before the answer), as event time
    writes.append(Write(popular[1], (("country", "BR"), ("device", "tv")), now_us() - 1, r.json()["idempotency_token"],
                        40))
    return writes, first, middle


def _run(env: PipelineEnv, client: httpx.Client) -> None:
    writes, first, middle = _load(env, client)
    clear = next(w for w in writes if w.clear)
    cleared_name = clear.counter
    every_name = set(counts(writes, 0, 2**62)) | {w.counter for w in writes}
    expected_totals = {name: counts(writes, 0, 2**62).get(name, 0) for name in every_name}
    wait_for(lambda: env.converged(NS, expected_totals), 90, interval=0.5,
             message=lambda: f"converged: {list(env.mismatches(NS, expected_totals).items())[:5]}")

    def top(k: int, window: dict[str, object], dims: dict[str, str] | None = None) -> dict:
        body: dict[str, object] = {"namespace": NS, "k": k, "window": window}
        if dims:
            body["dimensions"] = dims
        r = client.post("/v1/GetTopK", json=body)
        assert r.status_code == 200, r.text
        return r.json()

    queries = [(10, {"last": "1h"}, {}), (100, {"last": "1h"}, {}), (10, {"last": "1h"}, {"country": "BR"}),
               (5, {"last": "30d"}, {"country": "BR", "device": "tv"}), (1, {"last": "30d"}, {"device": "phone"}),
               (25, {"start": iso(first - 5 * MICROS), "end": iso(middle)}, {}),
               (10, {"start": first // MICROS - 5, "end": iso(middle)}, {"country": "US"})]
    for k, window, dims in queries:
        def matches(k=k, window=window, dims=dims) -> bool:
            answer = top(k, window, dims)
            start, end = at(answer["window"]["start"]), at(answer["window"]["end"])
            return answer["items"] == oracle(writes, start, end, dims, k)
        wait_for(matches, 30, interval=0.5, message=lambda k=k, window=window, dims=dims: (
            f"GetTopK {k} {window} {dims}: {top(k, window, dims)['items'][:5]} == "
            f"{oracle(writes, *(at(x) for x in top(k, window, dims)['window'].values()), dims, k)[:5]}"))
        answer = top(k, window, dims)
        assert answer["k"] == k and answer["dimensions"] == dims and answer["counter_type"] == "EVENTUAL"
        assert answer["items"] and answer["as_of"] is not None and at(answer["as_of"]) <= now_us()
        assert 0 < answer["rows_read"] < 3000 and answer["candidates"] >= len(answer["items"])
    # the cleared counter counts only its writes after the clear, though it was among the top before it
    everything = top(100, {"last": "1h"})["items"]
    mine = [w for w in writes if w.counter == cleared_name and not w.clear]
    before = sum(w.delta for w in mine if w.event_time <= clear.event_time)
    after = sum(w.delta for w in mine if w.event_time > clear.event_time)
    assert before > everything[10]["count"]
    assert next((e["count"] for e in everything if e["counter_name"] == cleared_name), 0) == max(after, 0)
    assert [e["count"] for e in everything] == sorted((e["count"] for e in everything), reverse=True)
    assert len({e["count"] for e in everything}) < len(everything)  # ties, ordered by name
    _refusals(client)


def _refusals(client: httpx.Client) -> None:
    base = {"namespace": NS, "k": 10, "window": {"last": "1h"}}
    assert refused(client.post("/v1/GetTopK", json={**base, "k": 0})) == [["body", "k"]]
    assert refused(client.post("/v1/GetTopK", json={**base, "k": 101})) == [["body", "k"]]
    assert refused(client.post("/v1/GetTopK", json={**base, "k": "10"})) == [["body", "k"]]
    assert refused(client.post("/v1/GetTopK", json={"namespace": NS, "k": 3})) == [["body", "window"]]
    assert refused(client.post("/v1/GetTopK", json={**base, "window": {"last": "0s"}})) == [["body", "window", "last"]]
    assert refused(client.post("/v1/GetTopK", json={**base, "window": {"last": "3000d"}})) == [["body", "window"]]
    assert refused(client.post("/v1/GetTopK", json={**base, "dimensions": {"os": "linux"}})) == [
        ["body", "dimensions", "os"]]
    assert refused(client.post("/v1/GetTopK", json={**base, "extra": 1})) == [["body", "extra"]]
    assert refused(client.post("/v1/GetTopK", json={**base, "namespace": "flat"})) == [["body", "window"]]
    assert refused(client.post("/v1/GetTopK", json={**base, "namespace": "fast"})) == [["body", "window"]]
    assert refused(client.post("/v1/GetTopK", json={**base, "namespace": "visitors"})) == [["body", "namespace"]]
    assert client.post("/v1/GetTopK", json={**base, "namespace": "nope"}).status_code == 404
    secured = {**base, "namespace": "secured"}
    assert client.post("/v1/GetTopK", json=secured).status_code == 401
    assert client.post("/v1/GetTopK", json=secured, headers={"X-API-Key": "writer-key"}).status_code == 403
    r = client.post("/v1/GetTopK", json=secured, headers={"X-API-Key": "reader-key"})
    assert r.status_code == 200 and r.json()["items"] == [], r.text
