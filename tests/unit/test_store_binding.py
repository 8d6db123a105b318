"""Which claim binds a consumer group to a store (streams.store_binding), from the bindings topic's records."""

from __future__ import annotations

import pytest

from streams.settings import SettingsError, load_settings
from streams.store_binding import StoreClaim, StoreMismatch, binding_of, check
from streams.topics import topic_specs


def _record(group: str, store: str, *, rebind: bool = False) -> tuple[bytes, bytes]:
    return group.encode(), StoreClaim(store, f"sqlite:///{store}", "host", "2026-11-27T00:00:00+00:00",
                                      rebind).encode()


def test_the_first_claim_binds_and_later_ones_do_not_replace_it() -> None:
    # two processes on different stores starting at once both append: the log's order decides, the same for both
    records = [_record("g", "a"), _record("g", "b"), _record("g", "a")]
    assert binding_of(records, "g").store == "a"  # type: ignore[union-attr]
    assert binding_of(records, "other") is None


def test_the_last_rebind_moves_the_binding() -> None:
    records = [_record("g", "a"), _record("g", "b", rebind=True), _record("g", "c"), _record("g", "d", rebind=True),
               _record("g", "e")]
    binding = binding_of(records, "g")
    assert binding is not None and binding.store == "d" and binding.rebind


def test_records_that_are_not_claims_bind_nothing() -> None:
    junk = [(b"g", b"not json"), (b"g", None), (b"g", b'{"store": 7}'), (b"g", b"[]"), (None, b'{"store": "x"}'),
            (b"g", b'{"location": "sqlite:///x"}')]
    assert binding_of(junk, "g") is None
    assert binding_of([*junk, _record("g", "a")], "g").store == "a"  # type: ignore[union-attr]


def test_a_claim_reads_back_as_written() -> None:
    claim = StoreClaim.now("abc", "cassandra://db1/ks", rebind=True)
    assert StoreClaim.decode(claim.encode()) == claim


def test_another_store_is_refused_naming_both() -> None:
    bound = StoreClaim("aaaa", "sqlite:///srv/counters", "host1", "2026-11-27T00:00:00+00:00")
    check(bound, "aaaa", "sqlite:///elsewhere", "group", "topic")  # the same store: no error
    check(None, "bbbb", "sqlite:///elsewhere", "group", "topic")  # nothing bound yet
    with pytest.raises(StoreMismatch) as refused:
        check(bound, "bbbb", "sqlite:///tmp/new", "group", "t-stores")
    text = str(refused.value)
    assert all(part in text for part in ("bbbb", "sqlite:///tmp/new", "aaaa", "sqlite:///srv/counters", "host1",
                                         "group", "t-stores", "counter store rebind")), text


def test_the_bindings_topic_is_named_after_the_mutations_topic() -> None:
    settings = load_settings(mutations_topic="m")
    spec = {t.name: t for t in topic_specs(settings)}["m-stores"]
    assert spec.partitions == 1 and spec.config["retention.ms"] == "-1"
    with pytest.raises(SettingsError, match=r"COUNTER_MUTATIONS_TOPIC.*at most 242"):
        load_settings(mutations_topic="m" * 243)
    load_settings(mutations_topic="m" * 242)
    with pytest.raises(SettingsError, match=r"COUNTER_DLQ_TOPIC.*store bindings topic"):
        load_settings(mutations_topic="m", dlq_topic="m-stores")


def test_a_running_process_stops_on_another_store_and_outlives_a_broker_away(monkeypatch) -> None:
    import asyncio

    from streams import store_binding

    answers: list[object] = [ConnectionError("broker away"), None, StoreClaim("mine", "x", "h", "t"),
                             StoreClaim("theirs", "y", "h", "t", rebind=True), ConnectionError("away again")]

    def read_binding(*_args: object, **_kwargs: object) -> StoreClaim | None:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[return-value]

    monkeypatch.setattr(store_binding, "read_binding", read_binding)
    watch = store_binding.BindingWatch(load_settings(kafka_bootstrap="b:9092", worker_id="g"), "mine", "x")
    watch.bound = True  # bound at start: checks read the binding
    for _ in range(3):  # away, nothing bound yet, bound to this store
        asyncio.run(watch.check())
        assert watch.mismatch is None
    with pytest.raises(StoreMismatch):
        asyncio.run(watch.check())
    assert watch.mismatch is not None and "theirs" in str(watch.mismatch)
    asyncio.run(watch.check())  # a broker away says nothing new: the mismatch stands
    assert watch.mismatch is not None


def test_a_process_that_could_not_bind_at_start_binds_at_its_next_check(monkeypatch) -> None:
    """An API started while the broker was away serves reads, and binds once the broker answers."""
    import asyncio

    from streams import store_binding

    calls: list[str] = []
    monkeypatch.setattr(store_binding, "ensure_topics", lambda *a, **k: calls.append("topic"))

    def claimed(bootstrap, topic, group, claim, **_kwargs):
        calls.append(f"claim {topic} {group} {claim.store}")
        return StoreClaim("theirs", "y", "h", "t")

    monkeypatch.setattr(store_binding, "claimed", claimed)
    watch = store_binding.BindingWatch(load_settings(kafka_bootstrap="b:9092", worker_id="g", mutations_topic="m"),
                                       "mine", "x")
    assert not watch.bound
    with pytest.raises(StoreMismatch):
        asyncio.run(watch.check())
    assert watch.bound and calls == ["topic", "claim m-stores g mine"] and watch.mismatch is not None
