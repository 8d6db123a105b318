"""Time-windowed counts end to end: real broker, real worker (killed mid-stream), SQLite, the HTTP API.

Events stream across a minute boundary (15 to 68 s), with event times set by their tokens inside the accept
window, retries of the same token and a clear; the worker is killed with SIGKILL while rolling up and replaced.
Every minute, hour and day bucket (GetCountSeries) and every window query (GetCount with a window) must equal
an oracle computed here from the events the broker acknowledged.
"""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import threading
import time
from collections import defaultdict
from datetime import UTC, datetime

import httpx
import pytest

from producers import CounterProducer
from schemas import MICROS, Mutation, MutationOp
from tests.helpers import wait_for
from tests.pipeline_harness import Event, PipelineEnv, oracle

pytestmark = pytest.mark.integration

NAMESPACES = ("my_dataset", "my_dataset_accurate")
MINUTE = 60 * MICROS


def iso(us: int) -> str:
    return datetime.fromtimestamp(us / MICROS, UTC).isoformat().replace("+00:00", "Z")


def bucket_oracle(events: list[Event], width: int) -> dict[str, dict[int, int]]:
    """Per counter, bucket start -> masked sum: distinct events, adds after the counter's latest clear (an add at
    the very time of the clear is erased by it), and a bucket that ended at or before the clear reads 0."""
    distinct: dict[tuple[str, int, str], Event] = {}
    for e in events:
        distinct.setdefault((e.counter, e.event_time, e.token), e)
    clears: dict[str, int] = {}
    for e in distinct.values():
        if e.clear:
            clears[e.counter] = max(clears.get(e.counter, -1), e.event_time)
    out: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for e in distinct.values():
        if not e.clear and e.event_time > clears.get(e.counter, -1):
            out[e.counter][e.event_time - e.event_time % width] += e.delta
    return out


def window_oracle(events: list[Event], counter: str, start: int, end: int) -> int:
    minutes = bucket_oracle(events, MINUTE)[counter]
    return sum(v for s, v in minutes.items() if start <= s < end)


def stream(env: PipelineEnv, events: list[Event], seconds: float, done: threading.Event) -> None:
    """Acknowledged single-mutation records with event times up to 2 s in the past, retries of a fifth of them
    (same token and time), and one clear per counter about a third of the way in."""
    rng = random.Random(41)
    counters = [f"w{i}" for i in range(4)]
    cleared: set[str] = set()
    started = time.monotonic()
    with CounterProducer(env.bootstrap, topic=env.mutations_topic) as producer:
        n = 0
        while time.monotonic() - started < seconds:
            for ns in NAMESPACES:
                counter = rng.choice(counters)
                t = time.time_ns() // 1000 - rng.randrange(0, 2 * MICROS)
                clear = counter not in cleared and time.monotonic() - started > seconds / 3 and rng.random() < 0.1
                if clear:
                    cleared.add(counter)
                e = Event(counter, t, f"{ns}-{n}", 0 if clear else rng.randint(-3, 9), clear)
                op = MutationOp.CLEAR if clear else MutationOp.ADD
                m = Mutation(ns, counter, e.delta, t, e.token, "", op)
                producer.send(m)
                if rng.random() < 0.2:
                    producer.send(m)  # a retry: counted once
                events.append(dataclasses.replace(e, counter=f"{ns}/{counter}"))
                n += 1
            producer.flush()
            time.sleep(0.02)
    done.set()


def by_namespace(events: list[Event], ns: str) -> list[Event]:
    prefix = f"{ns}/"
    return [dataclasses.replace(e, counter=e.counter[len(prefix):]) for e in events if e.counter.startswith(prefix)]


def test_buckets_and_windows_equal_the_oracle_across_a_minute_and_a_worker_kill(pipeline: PipelineEnv) -> None:
    worker = pipeline.start_worker()
    api = pipeline.start_api()
    events: list[Event] = []
    done = threading.Event()
    seconds = max(15.0, 60 - time.time() % 60 + 8)  # on until 8 s past the next minute boundary
    thread = threading.Thread(target=stream, args=(pipeline, events, seconds, done), daemon=True)
    thread.start()
    wait_for(lambda: len(events) > 400, 30, message="stream under way")
    os.kill(worker.proc.pid, signal.SIGKILL)  # mid-stream: persist and rollup batches in flight
    worker.proc.wait(10)
    pipeline.start_worker()
    thread.join(90)
    assert done.is_set()
    for ns in NAMESPACES:
        expected = oracle(by_namespace(events, ns))
        wait_for(lambda ns=ns, expected=expected: pipeline.converged(ns, expected), 90,
                 message=lambda ns=ns, expected=expected: f"{ns} converged: {pipeline.mismatches(ns, expected)}")

    first = min(e.event_time for e in events)
    last = max(e.event_time for e in events)
    lo, hi = first - first % MINUTE, last - last % MINUTE + MINUTE
    assert hi - lo >= 2 * MINUTE, "the stream should span a minute boundary"
    with httpx.Client(base_url=f"http://127.0.0.1:{api.port}", timeout=30) as client:
        for ns in NAMESPACES:
            mine = by_namespace(events, ns)
            totals = oracle(mine)
            for width, granularity in ((MINUTE, "minute"), (60 * MINUTE, "hour"), (1440 * MINUTE, "day")):
                truth = bucket_oracle(mine, width)
                start, end = lo - lo % width, hi - hi % width + (width if hi % width else 0)
                for counter in totals:
                    r = client.post("/v1/GetCountSeries", json={"namespace": ns, "counter_name": counter,
                                                                "granularity": granularity, "start": iso(start),
                                                                "end": iso(end)})
                    assert r.status_code == 200, r.text
                    body = r.json()
                    got = {int(datetime.fromisoformat(b["start"]).timestamp() * MICROS): b["count"]
                           for b in body["buckets"]}
                    want = {s: truth[counter].get(s, 0) for s in range(start, end, width)}
                    assert got == want, (ns, counter, granularity)
                    assert body["as_of"] is not None
                    assert sum(got.values()) == totals[counter]  # buckets since the clear sum to the total
            for counter in totals:
                for start, end in ((lo, hi), (lo, lo + MINUTE), (lo + MINUTE, hi)):
                    r = client.post("/v1/GetCount", json={"namespace": ns, "counter_name": counter,
                                                          "window": {"start": iso(start), "end": iso(end)}})
                    assert r.status_code == 200, r.text
                    body = r.json()
                    assert body["count"] == window_oracle(mine, counter, start, end), (ns, counter, start, end)
                    assert body["window"] == {"start": iso(start), "end": iso(end)}  # minute-aligned: as asked
                    assert body["as_of"] is not None
                r = client.post("/v1/GetCount", json={"namespace": ns, "counter_name": counter,
                                                      "window": {"last": "1h"}})
                assert r.status_code == 200 and r.json()["count"] == totals[counter], r.text


def test_window_requests_are_validated_naming_the_field(pipeline: PipelineEnv) -> None:
    api = pipeline.start_api()
    with httpx.Client(base_url=f"http://127.0.0.1:{api.port}", timeout=30) as client:
        def loc(body: dict, path: str = "/v1/GetCount") -> list:
            r = client.post(path, json=body)
            assert r.status_code == 422, r.text
            return r.json()["detail"][0]["loc"]

        base = {"namespace": "my_dataset", "counter_name": "c"}
        assert loc({**base, "window": {"last": "soon"}})[-1] == "last"
        assert loc({**base, "window": {"last": "1h", "start": "2026-01-01T00:00:00Z"}})[-2:] == ["window", "last"]
        assert "window" in loc({**base, "window": {"start": "2026-01-02T00:00:00Z", "end": "2026-01-01T00:00:00Z"}})
        assert loc({**base, "window": {"bogus": 1}})[-1] == "bogus"
        for last in (True, -5, 0, 1e300):  # a boolean is no duration; a number of seconds must be a usable one
            assert loc({**base, "window": {"last": last}})[-1] == "last", last
        # seconds as a JSON number, as the duration errors suggest, count what the same string counts
        counted = [client.post("/v1/GetCount", json={**base, "window": {"last": last}}) for last in (3600, "3600")]
        assert [r.status_code for r in counted] == [200, 200], [r.text for r in counted]
        assert counted[0].json()["count"] == counted[1].json()["count"]
        series = {**base, "granularity": "minute", "start": iso(time.time_ns() // 1000 - 2 * 86400 * MICROS + MINUTE)}
        assert loc(series, "/v1/GetCountSeries")[-1] == "end"  # more than 1,440 minutes in one call
        assert loc({**series, "granularity": "week"}, "/v1/GetCountSeries")[-1] == "granularity"
        r = client.post("/v1/GetCount", json={"namespace": "my_dataset_best_effort", "counter_name": "c",
                                              "window": {"last": "1h"}})
        assert r.status_code == 422 and "window" in r.json()["detail"][0]["loc"], r.text
