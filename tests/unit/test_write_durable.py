"""CounterService.write_durable: which records ask the worker to persist promptly (the read-your-write header)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from control_plane import default_config_path, load_namespaces
from query_api.service import CounterService
from schemas import Mutation, MutationOp

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
