"""Prometheus metrics of the API: requests and latency per endpoint, cache hit ratio.

Requests are tallied in plain dicts by `record` and `count_cache` and moved into the Prometheus metrics by
`collect`, which the /metrics route calls before each scrape. Why: prometheus_client takes a lock for every
increment, and a request made three of them (count, latency sum, latency bucket): 7% of a fast AddCount.
Everything here runs on the API's event loop, so the tallies need no lock.
"""

from __future__ import annotations

from bisect import bisect_left

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry()
REQUESTS = Counter("counter_api_requests_total", "HTTP requests", ["endpoint", "status"], registry=REGISTRY)
BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, float("inf"))
LATENCY = Histogram("counter_api_request_seconds", "HTTP request latency", ["endpoint"], registry=REGISTRY,
                    buckets=BUCKETS)
CACHE = Counter("counter_api_cache_total", "Rollup cache lookups", ["result"], registry=REGISTRY)
CACHE_HITS, CACHE_MISSES = CACHE.labels("hit"), CACHE.labels("miss")
CACHE_HIT_RATIO = Gauge("counter_api_cache_hit_ratio", "Rollup cache hits / lookups since start",
                        registry=REGISTRY)

_requests: dict[tuple[str, int], int] = {}
_latency: dict[str, list[float]] = {}  # endpoint -> observations per bucket, then their sum
_cache = [0, 0]  # misses, hits


def record(endpoint: str, status: int, seconds: float) -> None:
    """One request answered with `status` after `seconds`."""
    key = (endpoint, status)
    _requests[key] = _requests.get(key, 0) + 1
    tally = _latency.get(endpoint)
    if tally is None:
        tally = _latency[endpoint] = [0] * (len(BUCKETS) + 1)
    tally[bisect_left(BUCKETS, seconds)] += 1  # the first bucket whose bound is >= seconds, as observe()
    tally[-1] += seconds


def count_cache(hit: bool) -> None:
    _cache[hit] += 1


def collect() -> None:
    """Move the tallies into the Prometheus metrics: call before reading REGISTRY."""
    for (endpoint, status), n in _requests.items():
        REQUESTS.labels(endpoint, str(status)).inc(n)
    _requests.clear()
    for endpoint, tally in _latency.items():
        histogram = LATENCY.labels(endpoint)
        for i, n in enumerate(tally[:-1]):
            if n:
                histogram._buckets[i].inc(n)  # prometheus_client has no public call to add n observations
        histogram._sum.inc(tally[-1])
    _latency.clear()
    misses, hits = _cache
    _cache[:] = [0, 0]
    CACHE_MISSES.inc(misses)
    CACHE_HITS.inc(hits)
    total_hits, total_misses = CACHE_HITS._value.get(), CACHE_MISSES._value.get()
    CACHE_HIT_RATIO.set(total_hits / (total_hits + total_misses) if total_hits + total_misses else 0.0)
