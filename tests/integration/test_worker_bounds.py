"""A worker started on its own (`python -m agents`, not through `counter up` or `counter worker`, which refuse it)
says which explicitly set value it lowers to half the rollup window, instead of lowering it without a word."""

from __future__ import annotations

import asyncio
import logging

import pytest

from agents.worker import build
from streams.settings import Settings


def test_a_worker_says_which_setting_it_lowers(kafka_bootstrap: str, topic_name: str, tmp_path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="counter.worker")
    settings = Settings(kafka_bootstrap=kafka_bootstrap, data_dir=tmp_path, mutations_topic=f"{topic_name}-m",
                        rollups_topic=f"{topic_name}-r", persist_checkpoint_ms=3_600_000)

    async def built() -> None:  # Faust's app wants a running loop
        pipeline = build(settings)
        await pipeline.events.close()
        await pipeline.rollups.close()

    asyncio.run(built())
    said = [r.getMessage() for r in caplog.records if r.name == "counter.worker"]
    assert any("COUNTER_PERSIST_CHECKPOINT_MS=3600000" in m for m in said), said
    assert not any("COUNTER_PERSIST_EVENTUAL_WITHIN_MS" in m for m in said), said  # the default is not named
