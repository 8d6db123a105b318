"""Fixtures shared by the integration tests that run a pipeline worker."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.pipeline_harness import PipelineEnv


@pytest.fixture
def pipeline(kafka_bootstrap: str, memcached_address: str, tmp_path) -> Iterator[PipelineEnv]:
    """Fresh topics, data directory and consumer group on the session broker and memcached."""
    env = PipelineEnv(kafka_bootstrap, memcached_address, tmp_path / "data").prepare()
    yield env
    env.stop()
