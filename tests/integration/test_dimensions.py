"""Dimensions end to end: real broker, real worker, SQLite, memcached and the HTTP API.

Writes with dimensions arrive over HTTP (AddCount, AddAndGetCount, BatchAddCount), as Kafka JSON records from an
outside client and as Avro v2 records from CounterProducer (single and client-side batched, mixed with plain
writes), with retries of the same token before and after a ClearCount. Every filter subset, group_by at each
level, BatchGetCount and a window are checked against an oracle computed here. Refusals: an undeclared key, an
item, a clear with dimensions (422 naming the field), the same over Kafka (DLQ with the reason), and a write past
max_combinations (DLQ, then a 422 once the registry holds the bound).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from itertools import combinations as choose
from pathlib import Path

import httpx
import pytest
from confluent_kafka import Producer

from producers import CounterProducer
from schemas import combination, decode_mutations
from tests.helpers import iso, now_us, read_all, refused, wait_for
from tests.pipeline_harness import FAST_DEFAULTS, PipelineEnv, worker_and_api

pytestmark = pytest.mark.integration

NS = "plays"
NAMESPACES = FAST_DEFAULTS + """\
namespaces:
  plays:
    counter_type: EVENTUAL
    dimensions: { keys: [country, device], max_combinations: 8 }
  plain:
    counter_type: EVENTUAL
  fast:
    counter_type: BEST_EFFORT
"""
COUNTRIES, DEVICES = ("US", "FR", "é"), ("tv", "phone")


@dataclass(frozen=True)
class Write:
    counter: str
    dims: tuple[tuple[str, str], ...]
    event_time: int
    token: str
    delta: int
    clear: bool = False


def oracle(writes: list[Write]) -> dict[str, int]:
    """Every combination counter's exact count: distinct (counter name, time, token) events, a clear of the base
    counter applying to all its combinations, adds strictly after the latest clear."""
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
    counts: dict[str, int] = {name: 0 for name, _, _ in events}  # a combination all cleared away reads 0
    for (name, t, _), w in events.items():
        if not w.clear and t > clears.get(w.counter, -1):
            counts[name] += w.delta
    return counts


def _dims(d: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(d.items()))


def test_dimensions_end_to_end(kafka_bootstrap: str, memcached_address: str, tmp_path: Path) -> None:
    with worker_and_api(kafka_bootstrap, memcached_address, tmp_path, NAMESPACES) as (env, client):
        _run(env, client)


def _run(env: PipelineEnv, client: httpx.Client) -> None:
    writes: list[Write] = []
    n = 0

    def http_add(counter: str, delta: int, dims: dict[str, str], *, token: str | None = None,
                 t: int | None = None, path: str = "/v1/AddCount") -> Write:
        nonlocal n
        n += 1
        w = Write(counter, _dims(dims), t or now_us(), token or f"http-{n}", delta)
        body = {"namespace": NS, "counter_name": counter, "delta": delta, "dimensions": dims,
                "idempotency_token": {"token": w.token, "generation_time": iso(w.event_time)}}
        r = client.post(path, json=body)
        assert r.status_code == 200, r.text
        writes.append(w)
        return w

    # -- HTTP: AddCount, a retry, AddAndGetCount, BatchAddCount
    first = http_add("v", 3, {"country": "US", "device": "tv"})
    http_add("v", 3, {"country": "US", "device": "tv"}, token=first.token, t=first.event_time)  # a retry
    http_add("v", 5, {"country": "FR", "device": "phone"}, path="/v1/AddAndGetCount")
    http_add("v", 2, {"country": "US"})
    http_add("v", 7, {})
    batch = [Write("v", _dims({"device": "phone", "country": "US"}), now_us(), "batch-1", 11),
             Write("w", _dims({"country": "é"}), now_us(), "batch-2", 13)]
    r = client.post("/v1/BatchAddCount", json={"requests": [
        {"namespace": NS, "counter_name": b.counter, "delta": b.delta, "dimensions": dict(b.dims),
         "idempotency_token": {"token": b.token, "generation_time": iso(b.event_time)}} for b in batch]})
    assert r.status_code == 200, r.text
    writes += batch

    # -- Kafka JSON from an outside client, Avro v2 from CounterProducer (single and batched, mixed with plain)
    plain = Producer({"bootstrap.servers": env.bootstrap, "acks": "all"})
    json_writes = [Write("v", _dims({"country": c, "device": d}), now_us() + i, f"json-{i}", i + 1)
                   for i, (c, d) in enumerate([("FR", "tv"), ("US", "tv"), ("FR", "phone")])]
    for w in json_writes:
        body = {"namespace": NS, "counter_name": w.counter, "delta": w.delta, "dimensions": dict(w.dims),
                "idempotency_token": {"token": w.token, "generation_time": w.event_time}}
        plain.produce(env.mutations_topic, json.dumps(body).encode(), key=f"{NS}:{w.counter}".encode())
    assert plain.flush(20) == 0
    writes += json_writes
    with CounterProducer(env.bootstrap, topic=env.mutations_topic) as single, \
            CounterProducer(env.bootstrap, topic=env.mutations_topic, batch_size=50) as batched:
        for i in range(40):
            dims = {"country": COUNTRIES[i % 2], "device": DEVICES[i % 2]} if i % 4 else {"device": DEVICES[i % 2]}
            w = Write("v", _dims(dims), now_us() + i, f"avro-{i}", i % 5 - 1)
            (batched if i % 3 else single).add(NS, "v", w.delta, token=w.token, generation_time=w.event_time,
                                              dimensions=dims)
            if i % 7 == 0:  # a plain write in the same batches
                p = Write("v", (), now_us() + i, f"plain-{i}", 1)
                batched.add(NS, "v", 1, token=p.token, generation_time=p.event_time)
                writes.append(p)
            writes.append(w)
        single.flush()
        batched.flush()

    # -- a clear of v (every combination), then retries of tokens from before it and new writes after it
    time.sleep(0.05)
    clear_time = now_us()
    r = client.post("/v1/ClearCount", json={"namespace": NS, "counter_name": "v",
                                            "idempotency_token": {"token": "clr", "generation_time": iso(clear_time)}})
    assert r.status_code == 200, r.text
    writes.append(Write("v", (), clear_time, "clr", 0, clear=True))
    http_add("v", 3, {"country": "US", "device": "tv"}, token=first.token, t=first.event_time)  # erased by the clear
    time.sleep(0.01)
    http_add("v", 17, {"country": "US", "device": "tv"})
    http_add("v", 19, {"country": "FR", "device": "tv"})
    http_add("v", 23, {"device": "phone"})

    # -- refusals over HTTP name the field
    base = {"namespace": NS, "counter_name": "v", "delta": 1}
    assert refused(client.post("/v1/AddCount", json={**base, "dimensions": {"os": "linux"}})) == [
        ["body", "dimensions", "os"]]
    assert refused(client.post("/v1/AddCount", json={**base, "dimensions": {"country": "U S"}})) == [
        ["body", "dimensions", "country"]]
    assert refused(client.post("/v1/AddCount", json={**base, "item": "user-1"})) == [["body", "item"]]
    assert refused(client.post("/v1/AddCount", json={**base, "namespace": "plain", "dimensions": {"country": "US"}})
                ) == [["body", "dimensions", "country"]]
    assert refused(client.post("/v1/AddCount", json={**base, "namespace": "fast", "dimensions": {"country": "US"}})
                ) == [["body", "dimensions"]]
    assert refused(client.post("/v1/ClearCount", json={"namespace": NS, "counter_name": "v",
                                                    "dimensions": {"country": "US"}})) == [["body", "dimensions"]]
    assert refused(client.post("/v1/BatchAddCount", json={"requests": [base, {**base, "dimensions": {"os": "x"}}]})
                ) == [["body", "requests", 1, "dimensions", "os"]]
    assert refused(client.post("/v1/GetCount", json={"namespace": NS, "counter_name": "v",
                                                  "dimensions": {"os": "x"}})) == [["body", "dimensions", "os"]]
    assert refused(client.post("/v1/GetCount", json={"namespace": NS, "counter_name": "v", "group_by": "os"})
                ) == [["body", "group_by"]]
    assert refused(client.post("/v1/GetCount", json={"namespace": NS, "counter_name": "v", "group_by": "country",
                                                  "dimensions": {"country": "US"}})) == [["body", "group_by"]]

    # -- refusals over Kafka: dead-lettered with the reason
    bad_json = json.dumps({"namespace": NS, "counter_name": "v", "delta": 1, "dimensions": {"os": "linux"}}).encode()
    plain.produce(env.mutations_topic, bad_json, key=b"plays:v")
    assert plain.flush(20) == 0

    # -- max_combinations (8 full combinations per counter; v has 7): "capped" gets 8, then a 9th is refused
    for i in range(8):
        http_add("capped", 1, {"country": f"c{i}"})
    # refused at once, before the registry shows the eight: the API counts the new combinations it admitted (a
    # review: the 9th and 10th were answered 200 within the registry's 5 s and dead-lettered, never counted)
    early = client.post("/v1/AddCount", json={"namespace": NS, "counter_name": "capped", "delta": 1,
                                              "dimensions": {"country": "c9"}})
    assert early.status_code == 422 and "already has 8 dimension combinations" in early.text, early.text
    wait_for(lambda: client.post("/v1/GetCount", json={"namespace": NS, "counter_name": "capped"}).json()["count"]
             == 8, 30, interval=0.2, message="the eight combinations of capped persisted")
    ninth = json.dumps({"namespace": NS, "counter_name": "capped", "delta": 1, "dimensions": {"country": "c8"},
                          "idempotency_token": {"token": "ninth", "generation_time": now_us()}}).encode()
    plain.produce(env.mutations_topic, ninth, key=b"plays:capped")
    assert plain.flush(20) == 0

    def dead_letters() -> dict[bytes, str] | None:
        records = read_all(env.bootstrap, env.dlq_topic)
        found = {r.value: dict(r.headers)["dlq.reason"].decode() for r in records}
        return found if len(found) >= 2 else None

    dead = wait_for(dead_letters, 60, interval=0.5, message="dead letters")
    assert dead[bad_json].startswith("field 'dimensions.os': dimension 'os' is not declared by namespace 'plays'")
    assert dead[ninth] == ("field 'dimensions': counter 'capped' of namespace 'plays' already has 8 dimension "
                           "combinations (max_combinations 8); 'capped country=c8' would be one more")
    assert [m.counter_name for m in decode_mutations(ninth)] == ["capped"]
    assert len(dead) == 2  # nothing else was refused: v's seven full combinations are within the bound
    # the registry now holds the bound: the API refuses a new combination (a known one still passes)
    r = wait_for(lambda: (x := client.post("/v1/AddCount", json={
        "namespace": NS, "counter_name": "capped", "delta": 1, "dimensions": {"country": "c9"}})).status_code == 422
        and x, 15, interval=0.5, message="the API refusing a 9th combination")
    assert refused(r) == [["body", "dimensions"]] and "max_combinations 8" in r.json()["detail"][0]["msg"]
    http_add("capped", 1, {"country": "c0"})

    # -- everything converges to the oracle: every filter subset, group_by, BatchGetCount, a window
    expected = oracle(writes)
    counters = {"v": ("v", {}), "w": ("w", {}), "capped": ("capped", {})}
    for name in expected:
        base_name, pairs = name.split(" ")[0], dict(p.split("=") for p in name.split(" ")[1:])
        counters[name] = (base_name, pairs)

    def mismatches() -> dict[str, tuple[int, int]]:
        out = {}
        for name, (counter, dims) in counters.items():
            r = client.post("/v1/GetCount", json={"namespace": NS, "counter_name": counter, "dimensions": dims})
            got = r.json()["count"]
            if got != expected.get(name, 0):
                out[name] = (expected.get(name, 0), got)
        return out

    wait_for(lambda: not mismatches() and env.converged(NS, dict(expected)), 60, interval=0.5,
             message=lambda: f"every combination converged: {mismatches()}")
    assert expected["v"] != expected["v country=US"] and expected["v device=tv"] > 0  # the oracle is not trivial

    got = client.post("/v1/GetCount", json={"namespace": NS, "counter_name": "v",
                                            "dimensions": {"country": "US", "device": "tv"}}).json()
    assert got["counter_name"] == "v" and got["dimensions"] == {"country": "US", "device": "tv"}

    def groups(dims: dict[str, str], key: str, window: dict[str, str] | None = None) -> dict[str, object]:
        body: dict[str, object] = {"namespace": NS, "counter_name": "v", "dimensions": dims, "group_by": key}
        if window:
            body["window"] = window
        r = client.post("/v1/GetCount", json=body)
        assert r.status_code == 200, r.text
        return r.json()

    for dims, key in (({}, "country"), ({}, "device"), ({"country": "US"}, "device"), ({"device": "tv"}, "country"),
                      ({"country": "é"}, "device")):
        values = COUNTRIES if key == "country" else DEVICES
        want = [{"value": v, "count": expected[combination("v", {**dims, key: v})]} for v in sorted(values)
                if combination("v", {**dims, key: v}) in expected]
        for window in (None, {"last": "1h"}):
            answer = groups(dims, key, window)
            assert answer["groups"] == want, (dims, key, window)
            assert answer["count"] == expected.get(combination("v", dims), 0)
            assert answer["group_by"] == key and answer["dimensions"] == dims
            assert (answer["as_of"] is not None) == (combination("v", dims) in expected)  # never written: no as_of
            assert (answer["window"] is not None) == (window is not None)

    windowed = client.post("/v1/GetCount", json={"namespace": NS, "counter_name": "v", "dimensions": {"device": "tv"},
                                                 "window": {"last": "1h"}}).json()
    assert windowed["count"] == expected["v device=tv"] and windowed["dimensions"] == {"device": "tv"}
    assert "window" in windowed

    r = client.post("/v1/BatchGetCount", json={"requests": [
        {"namespace": NS, "counter_name": "v"}, {"namespace": NS, "counter_name": "v", "dimensions": {"country": "FR"}},
        {"namespace": NS, "counter_name": "w", "dimensions": {"country": "é"}}]})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["count"] for x in results] == [expected["v"], expected["v country=FR"], expected["w country=é"]]
    assert "dimensions" not in results[0] and results[1]["dimensions"] == {"country": "FR"}
    assert refused(client.post("/v1/BatchGetCount", json={"requests": [
        {"namespace": NS, "counter_name": "v", "group_by": "device"}]})) == [["body", "requests", 0, "group_by"]]
