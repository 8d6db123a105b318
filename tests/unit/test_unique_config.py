"""Unique counts in the control plane: `aggregation: SUM | UNIQUE` and `unique: {lg_k}`, in the flat and Netflix
shapes, with errors naming the field."""

from __future__ import annotations

import pytest

from control_plane import Aggregation, ConfigError, UniqueConfig, default_config_path, load_namespaces, parse_namespaces


def one(text: str):
    [ns] = parse_namespaces("namespaces:\n  " + text).values()
    return ns


def test_sum_is_the_default_and_unique_takes_the_presets_lg_k() -> None:
    plain = one("a: {counter_type: EVENTUAL}")
    assert (plain.aggregation, plain.unique, plain.counts_unique) == (Aggregation.SUM, None, False)
    unique = one("v: {counter_type: ACCURATE, aggregation: unique}")
    assert (unique.aggregation, unique.unique, unique.counts_unique) == (Aggregation.UNIQUE, UniqueConfig(12), True)
    assert unique.windows.granularities == ("minute", "hour", "day")
    assert one("w: {counter_type: EVENTUAL, aggregation: UNIQUE, unique: {lg_k: 16}}").unique == UniqueConfig(16)
    assert one("w: {counter_type: EVENTUAL, aggregation: UNIQUE, unique: {lg_k: '4'}}").unique == UniqueConfig(4)
    assert UniqueConfig(12).relative_error == pytest.approx(1.04 / 64)


def test_the_shipped_example_has_a_unique_namespace() -> None:
    visitors = load_namespaces(default_config_path())["visitors"]
    assert visitors.counts_unique and visitors.dimensions.keys == ("country",)


@pytest.mark.parametrize(("text", "field", "reason"), [
    ("b: {counter_type: BEST_EFFORT, aggregation: UNIQUE}", "aggregation", "BEST_EFFORT"),
    ("b: {counter_type: BEST_EFFORT, unique: {lg_k: 12}}", "unique.lg_k", "BEST_EFFORT"),
    ("b: {counter_type: EVENTUAL, unique: {lg_k: 14}}", "unique.lg_k", "set aggregation: UNIQUE"),
    ("b: {counter_type: EVENTUAL, aggregation: MAX}", "aggregation", "must be one of SUM, UNIQUE"),
    ("b: {counter_type: EVENTUAL, aggregation: UNIQUE, unique: {lg_k: 22}}", "unique.lg_k", "from 4 to 21"),
    ("b: {counter_type: EVENTUAL, aggregation: UNIQUE, unique: {lg_k: 3}}", "unique.lg_k", "from 4 to 21"),
    ("b: {counter_type: EVENTUAL, aggregation: UNIQUE, unique: {lg_k: true}}", "unique.lg_k", "from 4 to 21"),
    ("b: {counter_type: EVENTUAL, aggregation: UNIQUE, unique: {lg_k: 12.5}}", "unique.lg_k", "from 4 to 21"),
    ("b: {counter_type: EVENTUAL, aggregation: UNIQUE, unique: {lgk: 3}}", "unique.lgk", "did you mean 'lg_k'"),
    ("b: {counter_type: EVENTUAL, aggregation: UNIQUE, unique: 12}", "unique", "must be a mapping"),
    ("b: {counter_type: EVENTUAL, aggregation: UNIQUE, windows: {granularities: []}}", "windows.granularities",
     "keep at least minute buckets"),
    # a total is the union of the sketches: one leaving retention took its items out of it (a review read 12, then 0)
    ("b: {counter_type: EVENTUAL, aggregation: UNIQUE, windows: {retention: {day: 400d}}}", "windows.retention.day",
     "must be kept forever (got 400d)"),
    ("b: {counter_type: EVENTUAL, aggregation: UNIQUE, windows: {granularities: [minute], retention: {minute: 48h}}}",
     "windows.retention.minute", "coarsest buckets (minutes) must be kept forever"),
])
def test_errors_name_the_field(text: str, field: str, reason: str) -> None:
    with pytest.raises(ConfigError) as err:
        one(text)
    assert err.value.field == field and reason in err.value.reason, str(err.value)


def test_a_unique_namespace_may_keep_its_finer_buckets_for_a_while() -> None:
    ns = one("b: {counter_type: EVENTUAL, aggregation: UNIQUE, windows: {granularities: [minute, hour], "
             "retention: {minute: 48h, hour: forever}}}")
    assert ns.windows.granularities == ("minute", "hour")


def test_a_best_effort_namespace_ignores_a_unique_default() -> None:
    registry = parse_namespaces("defaults: {aggregation: UNIQUE}\nnamespaces:\n  f: {counter_type: BEST_EFFORT}\n"
                                "  v: {counter_type: EVENTUAL}")
    assert not registry["f"].counts_unique and registry["v"].counts_unique


def _netflix(config: str, beside: str = "") -> str:
    return ("namespaces:\n  n:\n" + beside + "    persistence_configuration:\n"
            "      - id: COUNTER_ROLLUP\n"
            f"        config: {{counter_type: EVENTUAL, {config}}}\n")


def test_the_netflix_shape() -> None:
    [ns] = parse_namespaces(_netflix("aggregation: UNIQUE, unique: {lg_k: 14}")).values()
    assert ns.unique == UniqueConfig(14)
    [ns] = parse_namespaces(_netflix("eventual_counter_config: {}", beside="    aggregation: UNIQUE\n")).values()
    assert ns.unique == UniqueConfig(12)
    with pytest.raises(ConfigError) as err:
        parse_namespaces(_netflix("aggregation: UNIQUE, unique: {lg_k: 30}"))
    assert err.value.field == "persistence_configuration[COUNTER_ROLLUP].config.unique.lg_k"
    with pytest.raises(ConfigError) as err:
        parse_namespaces(_netflix("unique: {k: 30}"))
    assert err.value.field == "persistence_configuration[COUNTER_ROLLUP].config.unique.k"
