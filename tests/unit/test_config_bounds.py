"""Namespace values that load must work: bounds on TTLs, counts and durations, and the combinations that make sense.

A value accepted at start-up but failing at the first write (an OverflowError in a store, a memcached expiry past
2038, a window of 0 µs) breaks the rule that a bad config stops start-up with a message naming the field.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from control_plane import PRESETS, ConfigError, CounterType, parse_namespaces
from control_plane.admission import admission_error
from control_plane.schema import COUNT_LIMITS, MAX_DURATION_S, MAX_TTL_S
from schemas import MICROS
from sinks.factory import open_namespace_stores
from sinks.memcached import counters as memcached_counters
from sinks.memcached.rollup_cache import MemcachedRollupCache
from sinks.model import Partitioning

INT64_MAX = 2**63 - 1
MEMCACHED_MAX_EXPIRE = 2**31 - 1


def load(fields: dict[str, Any], counter_type: str = "EVENTUAL") -> Any:
    return parse_namespaces({"namespaces": {"ns": {"counter_type": counter_type, **fields}}})["ns"]


def refused(fields: dict[str, Any], counter_type: str = "EVENTUAL") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load(fields, counter_type)
    return info.value


def nested(path: str, value: object) -> dict[str, Any]:
    """{"a.b": v} as {"a": {"b": v}} (the flat shape's sections)."""
    *sections, key = path.split(".")
    doc: dict[str, Any] = {key: value}
    for section in reversed(sections):
        doc = {section: doc}
    return doc


# --- 1. TTL: at most 10 years at load, and memcached never gets an expiry past 2^31 - 1 ----------------------


@pytest.mark.parametrize("counter_type", ["BEST_EFFORT", "EVENTUAL"])
@pytest.mark.parametrize("ttl", ["600w", 1e12, f"{MAX_TTL_S + 1}s"])
def test_a_ttl_beyond_ten_years_is_refused_naming_ttl_and_null(counter_type: str, ttl: object) -> None:
    err = refused({"ttl": ttl}, counter_type)
    assert err.field == "ttl" and "at most 3650d" in err.reason and "null for no expiry" in err.reason


def test_a_ttl_of_ten_years_or_null_loads() -> None:
    assert load({"ttl": f"{MAX_TTL_S}s"}, "BEST_EFFORT").ttl_s == MAX_TTL_S
    assert load({"ttl": None}, "BEST_EFFORT").ttl_s is None


@pytest.mark.parametrize("expire", [memcached_counters._expire, MemcachedRollupCache._expire])
def test_memcached_expiries_never_pass_2038(monkeypatch: pytest.MonkeyPatch, expire: Any) -> None:
    """memcached reads an absolute expiry above 2^31 as already passed: every write of the item would vanish."""
    monkeypatch.setattr(time, "time", lambda: 2_100_000_000.0)  # 2036: ten years on is past 2038
    assert expire(MAX_TTL_S) == MEMCACHED_MAX_EXPIRE
    # a BEST_EFFORT key lives its TTL plus the tenth between two touches past its last write (counters._expire)
    # and a second, for memcached's clock that ticks once a second
    extra, tick = (1.1, 1) if expire is memcached_counters._expire else (1.0, 0)
    assert expire(31 * 86400) == 2_100_000_000 + round(31 * 86400 * extra) + tick  # absolute, unclamped while it fits
    assert expire(3600) == round(3600 * extra) + tick  # relative (up to 30 days)
    if tick:
        assert expire(5) == 7 and expire(0.5) == 2  # 5.5 s and 0.55 s rounded up, and a tick
    assert expire(None) == 0


def test_a_best_effort_key_outlives_its_ttl_after_its_last_write() -> None:
    """A review: touched at most every tenth of the TTL, a key set to expire a TTL after its last touch expired up
    to a tenth of the TTL before a TTL after its last write (0 read 46.5 s after the last write, TTL 50 s)."""
    ttl = 50.0
    last_touch, last_write = 0.0, 0.999 * ttl / 10  # the last write just before the next touch is due
    assert last_touch + memcached_counters._expire(ttl) >= last_write + ttl


# --- 2. upper bounds that keep every value inside the stores' integers ------------------------------------------


@pytest.mark.parametrize("path", sorted(COUNT_LIMITS))
def test_every_count_has_a_maximum_naming_the_field(path: str) -> None:
    limit, _ = COUNT_LIMITS[path]
    fields = nested(path, limit + 1)
    if path == "dimensions.max_combinations":
        fields["dimensions"]["keys"] = ["country"]
    err = refused(fields)
    assert err.field == path and f"must be at most {limit:,}" in err.reason


def test_the_presets_are_inside_the_bounds() -> None:
    for preset in PRESETS.values():
        for path, (limit, _) in COUNT_LIMITS.items():
            assert preset[path] <= limit, path


def test_the_overflowing_bucket_width_is_refused_in_the_netflix_shape_with_its_path() -> None:
    doc = {"persistence_configuration": [
        {"id": "COUNTER_ROLLUP", "physical_storage": {"dataset": "d"}, "config": {"counter_type": "EVENTUAL"}},
        {"id": "EVENT_STORAGE", "config": {"time_partition": {"seconds_per_bucket": 10**13,
                                                                "seconds_per_slice": 10**13}}},
    ]}
    with pytest.raises(ConfigError) as info:
        parse_namespaces(doc)
    assert info.value.field == "persistence_configuration[EVENT_STORAGE].config.time_partition.seconds_per_bucket"


def test_the_widest_partitioning_allowed_still_writes_to_sqlite(tmp_path: Path) -> None:
    """What an OverflowError (SQLite INTEGER) stopped at the first write with seconds_per_bucket 10^13."""
    limit, _ = COUNT_LIMITS["time_partition.seconds_per_slice"]
    registry = parse_namespaces({"namespaces": {"a": {
        "counter_type": "EVENTUAL", "time_partition": {"seconds_per_bucket": limit, "seconds_per_slice": limit}}}})
    part = Partitioning.of(registry["a"].time_partition)
    now_us = time.time_ns() // 1000
    assert (part.slice_of(now_us) + 1) * part.slice_us < INT64_MAX

    async def write() -> int:
        stores = open_namespace_stores("sqlite", tmp_path, registry)
        try:
            return await stores.events.write_events([("a", "c1", time.time_ns() // 1000, "t1", "", 1, False)])
        finally:
            for store in stores:
                await store.close()

    assert asyncio.run(write()) == 1


@pytest.mark.parametrize("fields", [
    {"accept_limit": 1e13, "retention": {"close_after": 2e13, "delete_after": 2e13}},
    {"max_clock_skew": 1e13, "accept_limit": 1e13},
    {"retention": {"close_after": "6d", "delete_after": 1e300}},
    {"windows": {"retention": {"minute": 1e300, "hour": 1e300, "day": 1e300}}},
])
def test_durations_beyond_a_hundred_years_are_refused_naming_the_field(fields: dict[str, Any]) -> None:
    err = refused(fields)
    assert "at most 36500d" in err.reason
    assert err.field in ("accept_limit", "max_clock_skew", "retention.close_after", "retention.delete_after",
                         "windows.retention.minute")


def test_the_longest_durations_allowed_stay_inside_int64_microseconds() -> None:
    quarter = MAX_DURATION_S / 4
    ns = load({"accept_limit": quarter, "max_clock_skew": quarter,
               "retention": {"close_after": MAX_DURATION_S, "delete_after": MAX_DURATION_S},
               "windows": {"retention": {"minute": MAX_DURATION_S, "hour": MAX_DURATION_S, "day": MAX_DURATION_S}}})
    total_us = int((ns.accept_limit_s + ns.max_clock_skew_s + ns.retention.delete_after_s) * MICROS)
    assert total_us + time.time_ns() // 1000 < INT64_MAX


# --- 3. combinations -------------------------------------------------------------------------------------------


def test_accept_limit_below_max_clock_skew_is_refused() -> None:
    """A client behind by less than the declared skew would be dead-lettered as too old (cp5)."""
    err = refused({"accept_limit": "500ms", "max_clock_skew": "2s"})
    assert err.field == "accept_limit" and "must be >= max_clock_skew (2s)" in err.reason
    err = refused({"max_clock_skew": "10s"})  # accept_limit from the preset (5s): blame what was written
    assert err.field == "max_clock_skew" and "(value from" not in err.reason


def test_accept_limit_equal_to_max_clock_skew_admits_a_client_behind_by_the_skew() -> None:
    ns = load({"accept_limit": "2s", "max_clock_skew": "2s"})
    t = 1_800_000_000 * MICROS
    assert admission_error(t - 2 * MICROS, t, ns) is None and admission_error(t + 2 * MICROS, t, ns) is None


def test_the_presets_and_the_posts_values_satisfy_the_combinations() -> None:
    for preset in PRESETS.values():
        assert preset["accept_limit"] >= preset["max_clock_skew"]
        assert preset["accept_limit"] <= preset["retention.close_after"] <= preset["retention.delete_after"]
    for counter_type in CounterType:
        load({}, counter_type.value)


@pytest.mark.parametrize(("fields", "field"), [
    ({"accept_limit": "1ns"}, "accept_limit"),
    ({"accept_limit": "999us", "max_clock_skew": 0}, "accept_limit"),
    ({"max_clock_skew": "1ns"}, "max_clock_skew"),
])
def test_durations_kept_in_microseconds_are_at_least_a_millisecond(fields: dict[str, Any], field: str) -> None:
    err = refused(fields)
    assert err.field == field and "at least 1ms" in err.reason


def test_a_zero_skew_and_a_one_millisecond_accept_limit_load() -> None:
    ns = load({"accept_limit": "1ms", "max_clock_skew": 0})
    assert (ns.accept_limit_s, ns.max_clock_skew_s) == (0.001, 0.0)


def test_close_after_below_accept_limit_is_refused() -> None:
    err = refused({"retention": {"close_after": "1s"}})
    assert err.field == "retention.close_after" and "must be >= accept_limit (5s)" in err.reason
    assert load({"accept_limit": "5s", "retention": {"close_after": "5s"}}).retention.close_after_s == 5.0
