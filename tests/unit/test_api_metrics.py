"""The API's request tallies land in Prometheus exactly as direct observations would."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from query_api import metrics


def _samples(name: str, registry: CollectorRegistry) -> dict[str, float]:
    out = {}
    for family in registry.collect():
        for s in family.samples:
            if s.name.startswith(name) and not s.name.endswith("_created"):
                out[s.name + str(sorted(s.labels.items()))] = s.value
    return out


@given(st.lists(st.floats(min_value=0, max_value=10, allow_nan=False), max_size=50)
       .map(lambda xs: xs + list(metrics.BUCKETS[:-1])))  # bounds themselves: `le` is inclusive
def test_recorded_latencies_equal_observed_ones(latencies: list[float]) -> None:
    reference = CollectorRegistry()
    direct = Histogram("counter_api_request_seconds", "", ["endpoint"], registry=reference, buckets=metrics.BUCKETS)
    endpoint = "/v1/test-latency"
    before = _samples("counter_api_request_seconds", metrics.REGISTRY)
    for seconds in latencies:
        metrics.record(endpoint, 200, seconds)
        direct.labels(endpoint).observe(seconds)
    metrics.collect()
    after = _samples("counter_api_request_seconds", metrics.REGISTRY)
    expected = _samples("counter_api_request_seconds", reference)
    for key, value in expected.items():
        assert after[key] - before.get(key, 0.0) == pytest.approx(value, abs=1e-6), key


def test_requests_and_cache_lookups_are_counted_at_collect() -> None:
    metrics.collect()
    metrics.record("/v1/test-count", 200, 0.001)
    metrics.record("/v1/test-count", 200, 0.001)
    metrics.record("/v1/test-count", 404, 0.001)
    metrics.count_cache(hit=True)
    metrics.count_cache(hit=True)
    metrics.count_cache(hit=False)
    hits, misses = metrics.CACHE_HITS._value.get(), metrics.CACHE_MISSES._value.get()
    metrics.collect()
    text = generate_latest(metrics.REGISTRY).decode()
    assert 'counter_api_requests_total{endpoint="/v1/test-count",status="200"} 2.0' in text
    assert 'counter_api_requests_total{endpoint="/v1/test-count",status="404"} 1.0' in text
    assert (metrics.CACHE_HITS._value.get(), metrics.CACHE_MISSES._value.get()) == (hits + 2, misses + 1)
    assert metrics.CACHE_HIT_RATIO._value.get() == (hits + 2) / (hits + misses + 3)
    metrics.collect()  # nothing new: nothing counted twice
    assert 'counter_api_requests_total{endpoint="/v1/test-count",status="200"} 2.0' in \
        generate_latest(metrics.REGISTRY).decode()
