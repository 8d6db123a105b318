"""The API's request tallies export exactly what prometheus_client's own metrics would for the same observations."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from query_api import metrics

Exported = dict[tuple[str, str, str], dict[tuple[str, tuple[tuple[str, str], ...]], float]]


def _exported(registry: CollectorRegistry) -> tuple[Exported, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    """The text a scrape returns, parsed: {(family, type, help): {(sample, labels): value}}, and the _created
    samples apart (they hold creation times, which differ by construction)."""
    families: Exported = {}
    created = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        samples = {}
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            (created if s.name.endswith("_created") else samples)[key] = s.value
        if samples or not family.name.endswith("_created"):
            families[(family.name, family.type, family.documentation)] = samples
    return families, created


def _reference(requests: list[tuple[str, int, float]], lookups: list[bool],
               records: list[tuple[int, float, bool]] = (),  # type: ignore[assignment]
               holds: list[bool] = ()) -> CollectorRegistry:  # type: ignore[assignment]
    """The same observations made with plain prometheus_client metrics, named and documented as before."""
    registry = CollectorRegistry()
    help_ = metrics.GROUP_COMMIT_HELP
    sent = Counter("counter_api_group_commit_records_total", help_["records"], registry=registry)
    mutations = Counter("counter_api_group_commit_mutations_total", help_["mutations"], registry=registry)
    failed = Counter("counter_api_group_commit_failed_records_total", help_["failed"], registry=registry)
    ack = Histogram("counter_api_broker_ack_seconds", help_["ack"], registry=registry, buckets=metrics.ACK_BUCKETS)
    held = Counter("counter_api_group_commit_holds_total", help_["holds"], ["ended"], registry=registry)
    complete, gave_up = held.labels("complete"), held.labels("gave_up")  # both exported from the start
    for gave_up_ in holds:
        (gave_up if gave_up_ else complete).inc()
    for n, seconds, ok in records:
        sent.inc()
        mutations.inc(n)
        if ok:
            ack.observe(seconds)
        else:
            failed.inc()
    counter = Counter("counter_api_requests_total", "HTTP requests", ["endpoint", "status"], registry=registry)
    histogram = Histogram("counter_api_request_seconds", "HTTP request latency", ["endpoint"], registry=registry,
                          buckets=metrics.BUCKETS)
    cache = Counter("counter_api_cache_total", "Rollup cache lookups", ["result"], registry=registry)
    hits, misses = cache.labels("hit"), cache.labels("miss")
    ratio = Gauge("counter_api_cache_hit_ratio", "Rollup cache hits / lookups since start", registry=registry)
    for endpoint, status, seconds in requests:
        counter.labels(endpoint, str(status)).inc()
        histogram.labels(endpoint).observe(seconds)
    for hit in lookups:
        (hits if hit else misses).inc()
    ratio.set(sum(lookups) / len(lookups) if lookups else 0.0)
    return registry


requests_strategy = st.lists(
    st.tuples(st.sampled_from(["/v1/GetCount", "/v1/AddCount", "/v1/BatchGetCount"]),
              st.sampled_from([200, 404, 422, 503]),
              st.one_of(st.floats(min_value=0, max_value=10, allow_nan=False),
                        st.sampled_from(metrics.BUCKETS[:-1]))),  # bounds themselves: `le` is inclusive
    max_size=60)


records_strategy = st.lists(
    st.tuples(st.integers(min_value=1, max_value=500),
              st.one_of(st.floats(min_value=0, max_value=10, allow_nan=False),
                        st.sampled_from(metrics.ACK_BUCKETS[:-1])),
              st.booleans()),
    max_size=40)


@given(requests_strategy, st.lists(st.booleans(), max_size=20), records_strategy, st.lists(st.booleans(), max_size=20))
def test_a_scrape_equals_what_direct_observations_export(requests: list[tuple[str, int, float]],
                                                          lookups: list[bool],
                                                          records: list[tuple[int, float, bool]],
                                                          holds: list[bool]) -> None:
    started = time.time()
    metrics.reset()
    for endpoint, status, seconds in requests:
        metrics.record(endpoint, status, seconds)
    for hit in lookups:
        metrics.count_cache(hit)
    for n, seconds, ok in records:  # as GroupCommitProducer reports a record: sent, then done
        metrics.GROUP_COMMIT.record_sent(n)
        metrics.GROUP_COMMIT.record_done(seconds, ok)
    for gave_up in holds:
        metrics.GROUP_COMMIT.record_held(gave_up)
    got, got_created = _exported(metrics.REGISTRY)
    expected, expected_created = _exported(_reference(requests, lookups, records, holds))
    assert got == expected  # names, types, help, labels, le bounds, _count and _sum (same additions, same floats)
    assert got_created.keys() == expected_created.keys()
    series_created = [v for (name, _), v in got_created.items()
                      if name != "counter_api_cache_created"]  # the cache's is the module's import time
    assert all(started <= v <= time.time() for v in series_created)


def test_scrapes_are_cumulative_and_collect_is_a_no_op() -> None:
    metrics.reset()
    metrics.record("/v1/GetCount", 200, 0.001)
    metrics.count_cache(hit=True)
    first = _exported(metrics.REGISTRY)
    metrics.collect()  # kept for the /metrics route: must neither move nor count anything
    assert _exported(metrics.REGISTRY) == first  # a scrape reads the tallies, it does not drain them
    metrics.record("/v1/GetCount", 200, 0.003)
    metrics.count_cache(hit=False)
    families, _ = _exported(metrics.REGISTRY)
    requests = families[("counter_api_requests", "counter", "HTTP requests")]
    assert requests[("counter_api_requests_total", (("endpoint", "/v1/GetCount"), ("status", "200")))] == 2
    latency = families[("counter_api_request_seconds", "histogram", "HTTP request latency")]
    assert latency[("counter_api_request_seconds_sum", (("endpoint", "/v1/GetCount"),))] == pytest.approx(0.004)
    assert latency[("counter_api_request_seconds_bucket", (("endpoint", "/v1/GetCount"), ("le", "0.002")))] == 1
    ratio = families[("counter_api_cache_hit_ratio", "gauge", "Rollup cache hits / lookups since start")]
    assert ratio[("counter_api_cache_hit_ratio", ())] == 0.5


def test_the_registry_refuses_a_metric_with_a_taken_name() -> None:
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        Counter("counter_api_requests_total", "clash", registry=metrics.REGISTRY)
