"""A namespace setting that changes what its stored data means is refused unless accepted; others are recorded."""

from __future__ import annotations

from typing import Any

import pytest

from control_plane import NamespaceRegistry, parse_namespaces
from streams.namespace_shapes import NamespaceShape, check_shapes, shape_key, shapes_of

GROUP = "counter-worker"


def registry(**fields: Any) -> NamespaceRegistry:
    return parse_namespaces({"namespaces": {"ns": {"counter_type": "EVENTUAL", **fields}}})


def recorded(*registries: NamespaceRegistry) -> list[tuple[bytes | None, bytes | None]]:
    """The records a start of each registry in turn leaves (each recording what check_shapes asks)."""
    records: list[tuple[bytes | None, bytes | None]] = []
    for reg in registries:
        problems, new = check_shapes(records, GROUP, reg, ())
        assert not problems, problems
        records += [(shape_key(GROUP, name), shape.encode()) for name, shape in new.items()]
    return records


def test_a_first_start_records_every_namespace_and_a_second_nothing() -> None:
    records = recorded(registry())
    [(key, value)] = records
    shape = NamespaceShape.decode(value)
    assert key == b"counter-worker/namespace/ns" and shape is not None
    assert (shape.kind, shape.aggregation, shape.granularities) == ("EVENTUAL/ACCURATE", "SUM",
                                                                     ("minute", "hour", "day"))
    assert check_shapes(records, GROUP, registry(), ()) == ({}, {})
    assert check_shapes(records, GROUP, registry(counter_type="ACCURATE"), ()) == ({}, {})  # same data, read otherwise


@pytest.mark.parametrize(("changed", "field"), [
    ({"counter_type": "BEST_EFFORT"}, "counter_type"),
    ({"aggregation": "UNIQUE"}, "aggregation"),
])
def test_a_change_of_what_the_data_means_is_refused_naming_the_field(changed: dict[str, Any], field: str) -> None:
    records = recorded(registry())
    problems, new = check_shapes(records, GROUP, registry(**changed), ())
    assert list(problems) == ["ns"] and f"field '{field}'" in problems["ns"] and not new
    problems, new = check_shapes(records, GROUP, registry(**changed), ("ns",))  # accepted: recorded as it is now
    assert not problems and list(new) == ["ns"]
    assert check_shapes([*records, (shape_key(GROUP, "ns"), new["ns"].encode())], GROUP, registry(**changed),
                        ()) == ({}, {})


def test_a_granularity_dropped_then_kept_again_is_refused_and_a_new_one_recorded() -> None:
    minutes = registry(windows={"granularities": ["minute"]})
    both = registry(windows={"granularities": ["minute", "hour"]}, )
    records = recorded(both, minutes)  # hours dropped: recorded without a word
    assert shapes_of(records, GROUP)["ns"].ever_kept == ("hour", "minute")
    problems, _ = check_shapes(records, GROUP, both, ())
    assert "field 'windows.granularities': hour kept again after it was dropped" in problems["ns"]
    fresh = recorded(minutes, both)  # hours kept for the first time: their windows start empty, as documented
    assert shapes_of(fresh, GROUP)["ns"].granularities == ("minute", "hour")


def test_other_groups_and_records_are_not_shapes() -> None:
    records = [(shape_key("other-group", "ns"), NamespaceShape.of(registry(aggregation="UNIQUE")["ns"]).encode()),
               (GROUP.encode(), b'{"store": "s1"}'), (shape_key(GROUP, "ns"), b"not json"), (None, None)]
    assert shapes_of(records, GROUP) == {}
    problems, new = check_shapes(records, GROUP, registry(), ())
    assert not problems and list(new) == ["ns"]


def test_a_namespace_no_longer_configured_is_named() -> None:
    """Removing a namespace is the operator's to do, but its writes are then dead-lettered and its counts not served:
    a start names it (a warning on `counter up`'s console and in the worker's and API's logs)."""
    from streams.namespace_shapes import removed_namespaces, removed_warning

    both = parse_namespaces({"namespaces": {"ns": {"counter_type": "EVENTUAL"}, "old": {"counter_type": "EVENTUAL"}}})
    records = recorded(both)
    assert removed_namespaces(records, GROUP, both) == []
    assert removed_namespaces(records, GROUP, registry()) == ["old"]
    assert removed_namespaces(records, "another-group", registry()) == []
    assert removed_warning(["old"]).startswith("namespace(s) 'old' were configured before and are not now")
