"""CounterProducer's client-side batching against the real broker: batches the sending thread lingers out are
split below the broker's record size, a batch it cannot send is reported by flush() (and the thread goes on), and
flush()/close() wait for a batch the thread has taken but not yet handed to librdkafka."""

from __future__ import annotations

import threading
import time

import pytest

import producers.client as client
from producers import CounterProducer, DeliveryError
from producers.client import MAX_RECORD_BYTES
from schemas import Mutation, decode_mutations
from tests.helpers import make_topic, read_all, wait_for

pytestmark = pytest.mark.integration


def test_a_lingered_batch_larger_than_a_record_may_be_is_split_and_delivered(kafka_bootstrap: str,
                                                                              topic_name: str) -> None:
    make_topic(kafka_bootstrap, topic_name, 1)
    tokens = [f"token-{i:06d}-" + "x" * 60 for i in range(12_000)]  # about 1.1 MB as one batch record
    with CounterProducer(kafka_bootstrap, topic=topic_name, batch_size=100_000, linger_ms=50) as producer:
        futures = [producer.add("my_dataset", "hot", 1, token=token) for token in tokens]
        wait_for(lambda: all(f.done() for f in futures), 30, message="the lingered batch's acknowledgement")
        assert all(f.exception() is None for f in futures)
    records = read_all(kafka_bootstrap, topic_name)
    assert len(records) >= 2 and all(len(r.value) <= MAX_RECORD_BYTES for r in records)
    assert sorted(m.event_id or "" for r in records for m in decode_mutations(r.value)) == tokens


def test_a_lingered_batch_that_cannot_be_produced_is_reported_and_sending_goes_on(kafka_bootstrap: str,
                                                                                  topic_name: str) -> None:
    make_topic(kafka_bootstrap, topic_name, 1)
    producer = CounterProducer(kafka_bootstrap, topic=topic_name, batch_size=1000, linger_ms=20,
                               config={"message.max.bytes": 2000})  # the batch below is larger: refused
    try:
        big = [producer.add("my_dataset", "c", 1, token=f"big-{i:03d}-" + "x" * 100) for i in range(100)]
        wait_for(big[0].done, 10, message="the refused batch's failure")
        later = producer.add("my_dataset", "d", 1, token="later")
        wait_for(later.done, 10, message="a later batch lingered out")  # the sending thread is still there
        assert later.exception() is None
        with pytest.raises(DeliveryError) as info:  # no future told it: flush does
            producer.flush(10)
        assert len(info.value.mutations) == 100 and all(isinstance(m, Mutation) for m in info.value.mutations)
        error = big[0].exception()
        assert isinstance(error, DeliveryError) and len(error.mutations) == 100
    finally:
        producer.close(5)


@pytest.mark.parametrize("finish", ["flush", "close"])
def test_flush_and_close_wait_for_a_batch_the_sending_thread_took(kafka_bootstrap: str, topic_name: str,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  finish: str) -> None:
    taken = threading.Event()
    encode_batch = client.encode_batch

    def slow_in_the_sending_thread(ms: list[Mutation]) -> bytes:
        if threading.current_thread().name == "counter-producer-poll":
            taken.set()
            time.sleep(0.5)  # as a long batch, or a GIL hand-over, would take
        return encode_batch(ms)

    monkeypatch.setattr(client, "encode_batch", slow_in_the_sending_thread)
    make_topic(kafka_bootstrap, topic_name, 1)
    producer = CounterProducer(kafka_bootstrap, topic=topic_name, batch_size=100, linger_ms=5)
    try:
        futures = [producer.add("my_dataset", "c", 1, token=f"t{i}") for i in range(10)]
        assert taken.wait(5)
        getattr(producer, finish)(10)
        assert all(f.done() and f.exception() is None for f in futures)
    finally:
        producer.close(5)
    assert sum(len(decode_mutations(r.value)) for r in read_all(kafka_bootstrap, topic_name)) == 10


def test_adds_racing_close_from_other_threads_are_sent_or_refused_never_left(kafka_bootstrap: str,
                                                                              topic_name: str) -> None:
    """A review: with batch_size above 1, threads adding while another closed left 136 of 8,229 accepted adds in the
    closed producer's buffer: their futures never settled, close() returned normally, and they were never sent.
    Now an add either raises (the producer is closed) or is sent before close() returns."""
    make_topic(kafka_bootstrap, topic_name, 2)
    producer = CounterProducer(kafka_bootstrap, topic=topic_name, batch_size=50, linger_ms=200)
    accepted: list[tuple[str, object]] = []
    stop = threading.Event()

    def adder(t: int) -> None:
        i = 0
        while not stop.is_set():
            try:
                accepted.append((f"{t}-{i}", producer.add("my_dataset", "race", 1, token=f"{t}-{i}")))
            except RuntimeError:
                return
            i += 1

    threads = [threading.Thread(target=adder, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    wait_for(lambda: len(accepted) > 2000, 20, message="adds under way")
    producer.close()
    stop.set()
    for thread in threads:
        thread.join(10)
    assert all(f.done() and f.exception() is None for _, f in accepted)  # type: ignore[attr-defined]
    sent = {m.event_id for r in read_all(kafka_bootstrap, topic_name) for m in decode_mutations(r.value)}
    assert sent == {token for token, _ in accepted}, (len(sent), len(accepted))
