"""Prometheus metrics of the API: requests and latency per endpoint, cache hit ratio, group commit.

Requests are tallied in plain dicts by `record` and `count_cache`; a custom collector registered on REGISTRY
turns the tallies into metric families when the registry is scraped. Why: prometheus_client takes a lock for
every increment, and a request made three of them (count, latency sum, latency bucket): 7% of a fast AddCount.
Everything that writes the tallies runs on the API's event loop, so they need no lock; a scrape only reads them.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from itertools import accumulate

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

REGISTRY = CollectorRegistry()
BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, float("inf"))
_LE = tuple(floatToGoString(b) for b in BUCKETS)  # the `le` label values prometheus_client's Histogram writes

# Cumulative since start; never cleared by a scrape.
_requests: dict[tuple[str, int], int] = {}
_latency: dict[str, list[float]] = {}  # endpoint -> observations per bucket (not cumulative), then their sum
_cache = [0, 0]  # misses, hits
# When each series was first seen: exported as *_created, as Counter and Histogram do.
_requests_created: dict[tuple[str, int], float] = {}
_latency_created: dict[str, float] = {}
_CACHE_CREATED = time.time()
# Group commit (producers.group_commit): what the records carry and how long the broker takes to acknowledge one.
ACK_BUCKETS = (0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, float("inf"))
_ACK_LE = tuple(floatToGoString(b) for b in ACK_BUCKETS)


def _observe(tally: list[float], buckets: tuple[float, ...], seconds: float) -> None:
    """One observation into a histogram tally: the first bucket whose bound is >= seconds (as Histogram.observe),
    then the sum."""
    tally[bisect_left(buckets, seconds)] += 1
    tally[-1] += seconds


def _exported(tally: list[float], le: tuple[str, ...]) -> tuple[list[tuple[str, float]], float]:
    """A histogram tally as HistogramMetricFamily.add_metric takes it: cumulative (le, count) pairs, and the sum."""
    tally = tally[:]  # a scrape from another thread reads one consistent copy
    return list(zip(le, accumulate(float(n) for n in tally[:-1]), strict=True)), tally[-1]


class GroupCommitTally:
    """A `GroupCommitObserver`: records sent, the mutations they held, failures, and the acknowledgement times of
    the records the broker took (a histogram tally as `_latency`'s). Why: writes per record and the broker's
    acknowledgement time say whether durable writes wait on the broker or on the API."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.created = time.time()
        self.records = self.mutations = self.failed = 0
        self.holds = {"complete": 0, "gave_up": 0}  # records held for their clients, by how the hold ended
        self.acks = [0.0] * (len(ACK_BUCKETS) + 1)  # acknowledged records per bucket (not cumulative), then the sum

    def record_sent(self, mutations: int) -> None:
        self.records += 1
        self.mutations += mutations

    def record_done(self, seconds: float, ok: bool) -> None:
        if not ok:
            self.failed += 1
            return
        _observe(self.acks, ACK_BUCKETS, seconds)

    def record_held(self, gave_up: bool) -> None:
        self.holds["gave_up" if gave_up else "complete"] += 1


GROUP_COMMIT = GroupCommitTally()  # the API's GroupCommitProducer reports here (query_api.app)


def record(endpoint: str, status: int, seconds: float) -> None:
    """One request answered with `status` after `seconds`."""
    record_many(endpoint, status, (seconds,))


def record_many(endpoint: str, status: int, durations: Sequence[float]) -> None:
    """Requests answered with `status`, one per duration (seconds): a group commit answers many at once."""
    key = (endpoint, status)
    n = _requests.get(key)
    if n is None:
        n = 0
        _requests_created[key] = time.time()
    _requests[key] = n + len(durations)
    tally = _latency.get(endpoint)
    if tally is None:
        tally = _latency[endpoint] = [0] * (len(BUCKETS) + 1)
        _latency_created[endpoint] = time.time()
    for seconds in durations:
        _observe(tally, BUCKETS, seconds)


def count_cache(hit: bool) -> None:
    _cache[hit] += 1


def requests_by_endpoint() -> dict[str, int]:
    """Requests answered per endpoint since start, all statuses (counter_api_requests_total summed by endpoint):
    the pipeline health page rates them."""
    totals: dict[str, int] = {}
    for (endpoint, _status), n in list(_requests.items()):
        totals[endpoint] = totals.get(endpoint, 0) + n
    return totals


def collect() -> None:
    """Kept for compatibility, does nothing: the registry reads the tallies itself at each scrape."""


def reset() -> None:
    """Forget every tally (for tests)."""
    _requests.clear()
    _latency.clear()
    _requests_created.clear()
    _latency_created.clear()
    _cache[:] = [0, 0]
    GROUP_COMMIT.reset()
    _pipeline.clear()


def _families() -> tuple[CounterMetricFamily, HistogramMetricFamily, CounterMetricFamily, GaugeMetricFamily]:
    return (CounterMetricFamily("counter_api_requests_total", "HTTP requests", labels=("endpoint", "status")),
            HistogramMetricFamily("counter_api_request_seconds", "HTTP request latency", labels=("endpoint",)),
            CounterMetricFamily("counter_api_cache_total", "Rollup cache lookups", labels=("result",)),
            GaugeMetricFamily("counter_api_cache_hit_ratio", "Rollup cache hits / lookups since start"))


GROUP_COMMIT_HELP = {
    "records": "Records produced by group commit (each holds the writes that arrived while the one before it "
               "awaited its acknowledgement)",
    "mutations": "Mutations in those records (mutations / records: the writes one record shares)",
    "failed": "Group-commit records the broker refused or did not acknowledge in time (their writes got 503)",
    "ack": "From handing a group-commit record to the producer to its acknowledgement, seen on the event loop",
    "holds": "Group-commit records held back for the clients the last acknowledgement answered, by how the hold "
             "ended: all their writes came (complete), or writes stopped coming or the bound passed first (gave_up: "
             "the record's writes waited for nothing, at most COUNTER_API_GROUP_COMMIT_HOLD_MS; four in a row switch "
             "holding off until a later try completes)",
}


def _group_commit_families() -> tuple[CounterMetricFamily, CounterMetricFamily, CounterMetricFamily,
                                      HistogramMetricFamily, CounterMetricFamily]:
    return (CounterMetricFamily("counter_api_group_commit_records_total", GROUP_COMMIT_HELP["records"]),
            CounterMetricFamily("counter_api_group_commit_mutations_total", GROUP_COMMIT_HELP["mutations"]),
            CounterMetricFamily("counter_api_group_commit_failed_records_total", GROUP_COMMIT_HELP["failed"]),
            HistogramMetricFamily("counter_api_broker_ack_seconds", GROUP_COMMIT_HELP["ack"]),
            CounterMetricFamily("counter_api_group_commit_holds_total", GROUP_COMMIT_HELP["holds"],
                                labels=("ended",)))


def _group_commit_metrics() -> Iterator[Metric]:
    tally = GROUP_COMMIT
    records, mutations, failed, ack, holds = _group_commit_families()
    created = tally.created
    records.add_metric((), tally.records, created=created)
    mutations.add_metric((), tally.mutations, created=created)
    failed.add_metric((), tally.failed, created=created)
    ack.add_metric((), *_exported(tally.acks, _ACK_LE))
    ack.samples.append(Sample("counter_api_broker_ack_seconds_created", {}, created))
    for ended, held in tally.holds.items():
        holds.add_metric((ended,), held, created=created)
    yield from (records, mutations, failed, ack, holds)


# The pipeline's figures (GET /v1/pipeline), set by the /metrics route from its shared snapshot before each scrape.
PIPELINE_HELP = {
    "watermark_lag_seconds": "The largest persist watermark lag of a mutations partition (absent: unknown)",
    "persist_lag_records": "Mutation records on the broker not yet persisted (absent: the broker did not answer)",
    "rollup_lag_seconds": "Age of the oldest rollup work pending, over the namespaces (0: converged)",
    "persisted_still_seconds": "The longest a mutations partition has persisted nothing while records wait on it, "
                               "as this API's snapshots saw it (0: none waits unpersisted)",
    "dead_letters": "Records in the dead-letter topic",
    "warnings": "Warnings GET /v1/pipeline gives (a stall, a stuck watermark, a long local partition)",
    "errors": "Parts GET /v1/pipeline could not read or reach (broker, store, a topic, memcached)",
}
_pipeline: dict[str, float] = {}


def set_pipeline(figures: dict[str, float | None]) -> None:
    """The pipeline figures the next scrape exports (a review: only the worker's gauges showed lag, and they stood
    still through a stall); a figure that is None is left out."""
    _pipeline.clear()
    _pipeline.update({name: value for name, value in figures.items() if value is not None})


def _pipeline_metrics() -> Iterator[Metric]:
    for name, value in list(_pipeline.items()):
        gauge = GaugeMetricFamily(f"counter_pipeline_{name}", PIPELINE_HELP[name])
        gauge.add_metric((), value)
        yield gauge


class _TallyCollector:
    """Exports the tallies as prometheus_client's Counter, Histogram and Gauge would export the same observations."""

    def describe(self) -> Iterator[Metric]:
        """The family names, without reading the tallies: lets the registry refuse a clashing metric."""
        yield from _families()
        yield from _group_commit_families()

    def collect(self) -> Iterator[Metric]:
        requests, latency, cache, ratio = _families()
        # Copies: a scrape from another thread must not iterate a dict that changes size.
        requests_created, latency_created = _requests_created.copy(), _latency_created.copy()
        for (endpoint, status), n in list(_requests.items()):
            requests.add_metric((endpoint, str(status)), n, created=requests_created.get((endpoint, status)))
        for endpoint, tally in list(_latency.items()):
            latency.add_metric((endpoint,), *_exported(tally, _LE))
            if endpoint in latency_created:  # HistogramMetricFamily takes no `created`: add what Histogram writes
                latency.samples.append(Sample("counter_api_request_seconds_created", {"endpoint": endpoint},
                                              latency_created[endpoint]))
        misses, hits = _cache
        cache.add_metric(("hit",), hits, created=_CACHE_CREATED)
        cache.add_metric(("miss",), misses, created=_CACHE_CREATED)
        ratio.add_metric((), hits / (hits + misses) if hits + misses else 0.0)
        yield from (requests, latency, cache, ratio)
        yield from _group_commit_metrics()
        yield from _pipeline_metrics()


REGISTRY.register(_TallyCollector())
