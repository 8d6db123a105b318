"""The group-commit floor of `counter bench write` (bench.group_commit_floor), against the real session broker: it
answers a POST only once a record holding its body is acknowledged, so its figure is a durable write's floor."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench.common import group_commit_floor
from tests.helpers import read_all

pytestmark = pytest.mark.integration


async def post(host: str, port: int, body: bytes) -> bytes:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"POST /v1/AddCount HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                 b"content-length: %d\r\n\r\n%s" % (len(body), body))
    status = await reader.readline()
    writer.close()
    return status


def test_every_answered_post_is_in_an_acknowledged_record(kafka_bootstrap: str, topic_name: str,
                                                         tmp_path: Path) -> None:
    bodies = [b'{"n":%d}' % i for i in range(40)]
    with group_commit_floor(tmp_path, kafka_bootstrap, topic_name) as floor:
        async def scenario() -> list[bytes]:
            return await asyncio.gather(*(post(floor.host, floor.port, body) for body in bodies))

        statuses = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert statuses == [b"HTTP/1.1 200 OK\r\n"] * len(bodies)
    records = read_all(kafka_bootstrap, topic_name)
    stored = b"".join(r.value for r in records)
    assert sorted(stored.replace(b"}", b"}\n").split()) == sorted(bodies)  # each body once, none lost
    assert len(records) < len(bodies)  # concurrent posts shared records: the group commit the floor stands for
