"""CounterProducer refuses settings it cannot honour, and splits batches too large for one record (no broker)."""

from __future__ import annotations

import math
from concurrent.futures import Future
from pathlib import Path

import pytest

from control_plane import load_namespaces
from producers import CounterProducer, DeliveryError
from producers.client import MAX_RECORD_BYTES, _records, _settle_when_all
from schemas import Mutation, MutationOp, ValidationError, decode_mutations

EXAMPLE_NAMESPACES = Path(__file__).parents[2] / "control_plane" / "examples" / "namespaces.yaml"


@pytest.mark.parametrize("kwargs, name", [
    ({"linger_ms": -1}, "linger_ms"),
    ({"linger_ms": math.nan}, "linger_ms"),
    ({"linger_ms": math.inf}, "linger_ms"),
    ({"linger_ms": "5"}, "linger_ms"),
    ({"batch_size": 0}, "batch_size"),
    ({"batch_size": 2.5}, "batch_size"),
    ({"delivery_timeout_ms": 0}, "delivery_timeout_ms"),
    ({"delivery_timeout_ms": -5}, "delivery_timeout_ms"),
])
def test_bad_arguments_fail_at_construction_naming_the_argument(kwargs, name) -> None:
    with pytest.raises(ValueError, match=name):
        CounterProducer("127.0.0.1:1", **kwargs)


def mutation(i: int) -> Mutation:
    return Mutation("my_dataset", "hot", 1, 1_730_000_000_000_000 + i, f"token-{i:06d}-" + "x" * 60)


def test_a_batch_too_large_for_one_record_is_split_in_order() -> None:
    ms = [mutation(i) for i in range(12_000)]
    records = _records(ms)
    assert len(records) >= 2 and all(len(value) <= MAX_RECORD_BYTES for _, value in records)
    assert [m for part, _ in records for m in part] == ms
    assert [m for _, value in records for m in decode_mutations(value)] == ms
    assert _records(ms[:10]) == [(ms[:10], _records(ms[:10])[0][1])]  # a small batch stays one record


def test_a_split_batch_fails_with_the_failed_parts_mutations_only() -> None:
    parts: list[Future[None]] = [Future(), Future(), Future()]
    whole: Future[None] = Future()
    _settle_when_all(parts, whole)
    parts[0].set_result(None)
    parts[1].set_exception(DeliveryError("not delivered: x", [("k", "x")], [mutation(1), mutation(2)]))
    assert not whole.done()
    parts[2].set_result(None)
    error = whole.exception()
    assert isinstance(error, DeliveryError) and error.mutations == [mutation(1), mutation(2)]


def test_add_leaves_delta_out_with_an_item_and_requires_it_without(monkeypatch) -> None:
    """README: `producer.add(..., item=)` in a UNIQUE namespace, delta left out (it is 1); without an item the delta is
    required, by a ValidationError naming it rather than a TypeError (from a review)."""
    from schemas import MutationOp, ValidationError

    producer = CounterProducer("127.0.0.1:1")
    sent: list[Mutation] = []
    monkeypatch.setattr(producer, "_queue", lambda m: sent.append(m))  # what add hands on to be sent
    monkeypatch.setattr(producer, "_partitions", lambda: 1)  # no broker: the metadata a generated time waits for
    try:
        producer.add("visitors", "pyc", item="u1")
        producer.add("my_dataset", "c", 3)
        with pytest.raises(ValidationError) as info:
            producer.add("my_dataset", "c")
    finally:
        producer.close(timeout=0.1)
    assert info.value.field == "delta"
    assert [(m.delta, m.item, m.op) for m in sent] == [(1, "u1", MutationOp.ADD), (3, "", MutationOp.ADD)]


@pytest.mark.parametrize("write, field", [
    (lambda p: p.add("nope", "c", 1), "namespace"),
    (lambda p: p.add("my_dataset_best_effort", "c", 1), "namespace"),
    (lambda p: p.add("plays", "t", 1, dimensions={"colour": "red"}), "dimensions.colour"),
    (lambda p: p.add("my_dataset", "c", 1, dimensions={"country": "US"}), "dimensions.country"),
    (lambda p: p.add("my_dataset_best_effort", "c", 1, dimensions={"country": "US"}), "namespace"),
    (lambda p: p.add("my_dataset", "c", 1, item="u1"), "item"),
    (lambda p: p.add("visitors", "home", 5, item="u1"), "delta"),
    (lambda p: p.add("visitors", "home", 1), "item"),
    (lambda p: p.clear("nope", "c"), "namespace"),
    (lambda p: p.send(p.mutation(MutationOp.ADD, "nope", "c", 1)), "namespace"),
])
def test_given_the_namespaces_a_write_always_refused_raises_before_anything_is_sent(write, field) -> None:
    """A review: these resolved their futures as delivered, and the worker dead-lettered every one (NotAdmitted
    judged only the time). The broker here does not exist: a write that got as far as sending would wait for it."""
    registry = load_namespaces(EXAMPLE_NAMESPACES)
    producer = CounterProducer("127.0.0.1:1", namespaces=registry, delivery_timeout_ms=1000)
    try:
        with pytest.raises(ValidationError) as refused:
            write(producer)
        assert refused.value.field == field, refused.value
        assert producer.records_sent == 0
    finally:
        producer.close(timeout=0)


def test_a_delivery_is_read_only_when_its_outcome_was_returned_or_raised() -> None:
    """A review: `result(timeout)` marked a failure read when its report landed just after the wait had timed out
    (the caller got TimeoutError, never the failure), and flush/close then kept quiet about it."""
    from producers.client import Delivery

    future = Delivery()
    with pytest.raises(TimeoutError):
        future.result(timeout=0)
    with pytest.raises(TimeoutError):
        future.exception(timeout=0)
    future.set_exception(DeliveryError("not delivered", mutations=[mutation(1)]))
    assert not future.seen, "a wait that timed out read nothing"
    with pytest.raises(DeliveryError):
        future.result()
    assert future.seen
    whole = Delivery([part := Delivery()])
    whole.set_result(None)
    whole.result()
    assert part.seen, "reading a future standing for several records reads its parts"


def test_a_retry_that_cannot_send_one_mutation_fails_with_it_and_every_one_after_it(monkeypatch) -> None:
    """A review: the retry of three mutations whose second could not be handed over raised an error naming the
    second alone; the third was never sent, and nothing said so."""
    producer = CounterProducer("127.0.0.1:1", delivery_timeout_ms=1000)
    sent: list[Mutation] = []

    def send(m: Mutation):
        if m == mutation(2):
            raise DeliveryError("cannot produce", mutations=[m])
        sent.append(m)
        return Future()

    monkeypatch.setattr(producer, "send", send)
    try:
        with pytest.raises(DeliveryError) as failed:
            producer.retry(DeliveryError("a stall", mutations=[mutation(1), mutation(2), mutation(3)]))
        assert sent == [mutation(1)] and failed.value.mutations == [mutation(2), mutation(3)]
    finally:
        producer.close(timeout=0)
