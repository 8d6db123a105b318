"""CounterService.write_durable: which records ask the worker to persist promptly (the read-your-write header);
write_plain (the C path of a plain AddCount): what write_durable does for the same write."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import Any

import pytest

from control_plane import default_config_path, load_namespaces
from query_api import service as service_module
from query_api.responses import add_json
from query_api.service import CounterService
from schemas import Mutation, MutationOp, mutation_body

REGISTRY = load_namespaces(default_config_path())


class RecordingProducer:
    def __init__(self) -> None:
        self.marked: list[bool] = []

    def send(self, mutations: Sequence[Mutation], read_your_write: bool = False) -> asyncio.Future[None]:
        self.marked.append(read_your_write)
        return asyncio.get_running_loop().create_future()


@pytest.mark.parametrize("ns_name, then_count, marked", [
    ("my_dataset", False, False),  # AddCount: nobody waits for its count
    ("my_dataset", True, False),  # AddAndGetCount in a plain namespace: this process stores the event itself
    ("my_dataset_accurate", True, False),
    ("plays", False, False),
    ("plays", True, True),  # dimensions: the API cannot store it, the client waits for the worker
])
def test_only_a_write_whose_count_waits_for_the_worker_is_marked(ns_name: str, then_count: bool,
                                                                 marked: bool) -> None:
    async def scenario() -> list[bool]:
        producer = RecordingProducer()
        svc = CounterService(REGISTRY, producer=producer, signals=None, events=None, rollups=None,  # type: ignore[arg-type]
                             cache=None, counters=None)  # type: ignore[arg-type]
        svc.write_durable(REGISTRY[ns_name], "c", 1, MutationOp.ADD, None, None, then_count=then_count)
        return producer.marked

    assert asyncio.run(scenario()) == [marked]


class BodyRecordingProducer(RecordingProducer):
    """Records the v1 body of every write, whether sent as a mutation or already encoded."""

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[bytes] = []

    def send(self, mutations: Sequence[Mutation], read_your_write: bool = False) -> asyncio.Future[None]:
        self.bodies += [mutation_body(m) for m in mutations]
        return super().send(mutations, read_your_write)

    def send_body(self, body: bytes) -> asyncio.Future[None]:
        self.bodies.append(body)
        return super().send([], False)


@pytest.mark.parametrize("ns_name", ["my_dataset", "my_dataset_accurate"])
def test_a_plain_add_is_sent_noted_and_answered_as_write_durable_does(monkeypatch: pytest.MonkeyPatch,
                                                                      ns_name: str) -> None:
    """write_plain (the C path) against write_durable for the same AddCount: the same record body, the same event
    noted for read-your-write, the same answer; with the time and token they would both draw fixed."""
    if service_module.plain_add() is None:
        assert os.environ.get("COUNTER_TEST_PURE_PYTHON") == "1", "no C build: run `python -m query_api.plain_add`"
        pytest.skip("COUNTER_TEST_PURE_PYTHON=1: no C build on this machine")
    monkeypatch.setattr(service_module.time, "time_ns", lambda: 1_764_125_000_123_456_789)
    monkeypatch.setattr(service_module, "new_token", lambda: "0123456789abcdef0123456789abcdef")

    async def scenario() -> tuple[list[Any], ...]:
        sent = []
        for plain in (True, False):
            producer = BodyRecordingProducer()
            svc = CounterService(REGISTRY, producer=producer, signals=None, events=None, rollups=None,  # type: ignore[arg-type]
                                 cache=None, counters=None)  # type: ignore[arg-type]
            if plain:
                result = svc.write_plain(b'{"namespace": "%s", "counter_name": "c-1", "delta": -7}' % ns_name.encode())
                assert result is not None, "the plain body was not taken"
                answer = result[0]
            else:
                written, _ = svc.write_durable(REGISTRY[ns_name], "c-1", -7, MutationOp.ADD, None, None)
                answer = add_json(written)
            noted = [(key, writes[:-1]) for generation in svc.early._generations
                     for key, writes in generation.writes.items()]  # the acknowledgement future left out
            sent.append((producer.bodies, producer.marked, noted, answer))
        return tuple(sent)

    via_plain, via_durable = asyncio.run(scenario())
    assert via_plain == via_durable
    assert via_plain[2] == [(f"{ns_name}:c-1", [1_764_125_000_123_456, "0123456789abcdef0123456789abcdef", "", -7,
                                                False])]


def test_write_plain_declines_what_is_not_a_plain_add_of_a_plain_namespace() -> None:
    async def scenario() -> list[Any]:
        svc = CounterService(REGISTRY, producer=RecordingProducer(), signals=None, events=None,  # type: ignore[arg-type]
                             rollups=None, cache=None, counters=None)  # type: ignore[arg-type]
        return [svc.write_plain(b'{"namespace": "%s", "counter_name": "c", "delta": 1%s}' % (ns, extra))
                for ns, extra in [(b"plays", b""),  # dimensions declared: the worker expands them
                                  (b"my_dataset", b', "idempotency_token": {"token": "t"}')]]

    assert asyncio.run(scenario()) == [None, None]
