"""Prometheus metrics of the API: requests and latency per endpoint, cache hit ratio."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry()
REQUESTS = Counter("counter_api_requests_total", "HTTP requests", ["endpoint", "status"], registry=REGISTRY)
LATENCY = Histogram("counter_api_request_seconds", "HTTP request latency", ["endpoint"], registry=REGISTRY,
                    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
CACHE = Counter("counter_api_cache_total", "Rollup cache lookups", ["result"], registry=REGISTRY)
CACHE_HITS, CACHE_MISSES = CACHE.labels("hit"), CACHE.labels("miss")
CACHE_HIT_RATIO = Gauge("counter_api_cache_hit_ratio", "Rollup cache hits / lookups since start",
                        registry=REGISTRY)


def refresh_hit_ratio() -> None:
    hits = CACHE_HITS._value.get()
    misses = CACHE_MISSES._value.get()
    CACHE_HIT_RATIO.set(hits / (hits + misses) if hits + misses else 0.0)
