"""Session fixtures: a real Kafka-protocol broker and a real memcached, started once per test session.

COUNTER_KAFKA_BOOTSTRAP / COUNTER_TEST_MEMCACHED point the suite at existing services instead (e.g. Apache
Kafka); otherwise the local Tansu broker and memcached are launched on free ports.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.broker import LocalBroker
from infra.memcached import LocalMemcached


@pytest.fixture(autouse=True)
def _loggers_enabled() -> None:
    """Re-enable loggers another test's logging.config disabled (import-linter's CLI and Faust configure logging
    with disable_existing_loggers), so a test reading caplog sees its module's records whatever ran before it."""
    for logger in logging.root.manager.loggerDict.values():
        if isinstance(logger, logging.Logger) and logger.disabled:
            logger.disabled = False


@pytest.fixture(scope="session")
def service_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("service-logs")


@pytest.fixture(scope="session")
def kafka_bootstrap(service_logs: Path) -> Iterator[str]:
    external = os.environ.get("COUNTER_KAFKA_BOOTSTRAP")
    if external:
        yield external
        return
    with LocalBroker(service_logs / "broker.log") as broker:
        yield broker.bootstrap


@pytest.fixture(scope="session")
def memcached_address(service_logs: Path) -> Iterator[str]:
    external = os.environ.get("COUNTER_TEST_MEMCACHED")
    if external:
        yield external
        return
    with LocalMemcached(service_logs / "memcached.log") as mc:
        yield mc.address


@pytest.fixture
def topic_name() -> str:
    """A fresh topic name per test, so tests sharing the session broker never see each other's records."""
    return f"test-{uuid.uuid4().hex[:12]}"
