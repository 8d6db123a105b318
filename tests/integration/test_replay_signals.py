"""`counter replay`'s rollup signals: sent through the one signal path (streams.signals.SignalSender over an
AsyncProducer) and acknowledged before the replay saves its state and commits its offsets.

The replay runs in-process (jobs.replay.run_replay) on a pipeline's topics and data directory, with no worker
running, so the rollups topic holds exactly the replay's signals.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any
from unittest import mock

import pytest
from confluent_kafka import KafkaException

import jobs.replay as replay_module
from jobs.replay import ReplayOptions, run_replay, state_path
from jobs.state import read_json
from producers import CounterProducer
from producers.errors import DeliveryError
from schemas import Mutation, counter_key, decode_signals
from streams.settings import Settings, load_settings
from streams.signals import SignalSender
from streams.topics import signal_partition
from tests.helpers import read_all
from tests.pipeline_harness import PipelineEnv

pytestmark = pytest.mark.integration

NS = "my_dataset"


def settings_of(env: PipelineEnv) -> Settings:
    return load_settings(**{k.removeprefix("COUNTER_").lower(): v for k, v in env.env().items()})


def produce(env: PipelineEnv, counters: Iterable[str], per_counter: int = 3) -> None:
    now = time.time_ns() // 1000
    with CounterProducer(env.bootstrap, topic=env.mutations_topic, batch_size=1) as producer:
        for i, counter in enumerate(counters):
            for j in range(per_counter):
                producer.send(Mutation(NS, counter, j + 1, now + i * 10 + j, f"tok-{counter}-{j}"))


COUNTERS = [f"c{i}" for i in range(40)] + ["видео", "a:b/c?d"]


def test_a_replay_signals_each_counter_on_its_partition_batched_per_partition(pipeline: PipelineEnv) -> None:
    produce(pipeline, COUNTERS)
    settings = settings_of(pipeline)
    result = asyncio.run(run_replay(ReplayOptions(start="earliest", recount=False), settings))
    assert result.finished and result.totals["records"] == len(COUNTERS) * 3 and result.touched == len(COUNTERS)

    records = read_all(pipeline.bootstrap, settings.rollups_topic)
    signalled = []
    for record in records:
        keys = decode_signals(record.value)
        assert record.key == counter_key(*keys[0]).encode()
        for key in keys:
            assert record.partition == signal_partition(counter_key(*key).encode(), pipeline.partitions)
        signalled += keys
    assert set(signalled) == {(NS, c) for c in COUNTERS}
    assert len(records) < len(signalled), "signals bound for one partition should share a record"


def test_signals_are_acknowledged_before_the_state_and_offsets_are_saved(pipeline: PipelineEnv) -> None:
    produce(pipeline, COUNTERS[:10], per_counter=2)
    settings = settings_of(pipeline)
    options = ReplayOptions(start="earliest", recount=False, batch_size=5)
    order: list[Any] = []
    send, save = SignalSender.send, replay_module.Replay._save

    def recording_send(self: SignalSender, keys: list[tuple[str, str]]) -> asyncio.Future[list[None]]:
        sent = send(self, keys)
        sent.add_done_callback(lambda f: order.append(("acknowledged", len(keys)) if f.exception() is None
                                                      else ("failed",)))
        return sent

    def recording_save(self: replay_module.Replay) -> None:
        order.append(("save", sum(self.positions.values())))
        save(self)

    with mock.patch.object(SignalSender, "send", recording_send), \
            mock.patch.object(replay_module.Replay, "_save", recording_save):
        result = asyncio.run(run_replay(options, settings))
    assert result.finished and result.totals["records"] == 20
    saves = [(i, step[1]) for i, step in enumerate(order) if step[0] == "save"]
    advanced = [(i, at) for (i, at), (_, before) in zip(saves[1:], saves, strict=False) if at > before]
    assert advanced and sum(at for _, at in advanced[-1:]) == 20
    for i, _ in advanced:  # every save that moves the positions follows its batch's acknowledged signals
        assert order[i - 1][0] == "acknowledged", order


def test_a_replay_whose_signals_fail_saves_nothing_and_resumes_from_the_start(pipeline: PipelineEnv) -> None:
    produce(pipeline, COUNTERS[:10], per_counter=2)
    settings = settings_of(pipeline)

    def unacknowledged(self: SignalSender, keys: list[tuple[str, str]]) -> asyncio.Future[list[None]]:
        failed: asyncio.Future[list[None]] = asyncio.get_running_loop().create_future()
        failed.set_exception(DeliveryError("the broker did not acknowledge the record within 30s"))
        return failed

    with mock.patch.object(SignalSender, "send", unacknowledged), \
            pytest.raises(KafkaException, match="rollup signals not delivered"):
        asyncio.run(run_replay(ReplayOptions(start="earliest", recount=False), settings))
    name = ReplayOptions().name_of(settings)
    saved = read_json(state_path(settings, name))
    assert sum(saved["positions"].values()) == 0 and not saved.get("totals", {}).get("records")

    # Run again (resuming the same replay): it re-reads every record, since none was committed.
    result = asyncio.run(run_replay(ReplayOptions(recount=False), settings))
    assert result.finished and result.totals["records"] == 20
    assert {k for r in read_all(pipeline.bootstrap, settings.rollups_topic) for k in decode_signals(r.value)} == {
        (NS, c) for c in COUNTERS[:10]}
