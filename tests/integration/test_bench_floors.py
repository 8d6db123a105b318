"""The group-commit floor of `counter bench write` (bench.group_commit_floor), against the real session broker: it
answers a POST only once a record holding its body is acknowledged, so its figure is a durable write's floor."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench.common import group_commit_floor
from infra.broker import LocalBroker
from infra.process import ManagedProcess
from tests.helpers import read_all

pytestmark = pytest.mark.integration


def request(body: bytes) -> bytes:
    return (b"POST /v1/AddCount HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body))


async def post_together(server: ManagedProcess, bodies: list[bytes]) -> list[bytes]:
    """Open a connection per body, then send every request while the server is frozen (so they are all waiting
    when it reads: a busy machine could otherwise let it answer each before the next is written), then read each
    status line."""
    connections = await asyncio.gather(*(asyncio.open_connection(server.host, server.port) for _ in bodies))
    server.pause()
    try:
        for (_, writer), body in zip(connections, bodies, strict=True):
            writer.write(request(body))
            await writer.drain()
    finally:
        server.resume()
    statuses = [await reader.readline() for reader, _ in connections]
    for _, writer in connections:
        writer.close()
    return statuses


@pytest.mark.parametrize("hold_max_ms", [0.0, 2.0], ids=["unheld", "held"])  # held as the API holds its records
def test_every_answered_post_is_in_an_acknowledged_record(kafka_bootstrap: str, topic_name: str,
                                                         tmp_path: Path, hold_max_ms: float) -> None:
    bodies = [b'{"n":%d}' % i for i in range(40)]
    with group_commit_floor(tmp_path, kafka_bootstrap, topic_name, hold_max_ms) as floor:
        statuses = asyncio.run(asyncio.wait_for(post_together(floor, bodies), 30))
        statuses += asyncio.run(asyncio.wait_for(post_together(floor, bodies[:8]), 30))  # answered clients again
    assert statuses == [b"HTTP/1.1 200 OK\r\n"] * (len(bodies) + 8)
    records = read_all(kafka_bootstrap, topic_name)
    stored = b"".join(r.value for r in records)
    assert sorted(stored.replace(b"}", b"}\n").split()) == sorted(bodies + bodies[:8])  # each body once, none lost
    assert len(records) < len(bodies)  # posts sent together shared records: the group commit the floor stands for


def test_a_post_waits_for_the_brokers_acknowledgement(tmp_path: Path) -> None:
    """With its broker frozen (SIGSTOP; a broker of its own, not the session's), the floor holds the answer; once the
    broker resumes, the answer comes. A floor that answered on arrival would measure no durable write at all."""
    broker = LocalBroker(tmp_path / "broker.log")
    with broker, group_commit_floor(tmp_path, broker.bootstrap, "t") as floor:
        async def scenario() -> tuple[bool, bytes]:
            reader, writer = await asyncio.open_connection(floor.host, floor.port)
            broker.pause()
            try:
                writer.write(request(b'{"n":1}'))
                held = await _held(reader, 1.0)
            finally:
                broker.resume()
            status = await asyncio.wait_for(reader.readline(), 20)
            writer.close()
            return held, status

        held, status = asyncio.run(scenario())
    assert held, "answered while the broker was frozen"
    assert status == b"HTTP/1.1 200 OK\r\n"


async def _held(reader: asyncio.StreamReader, seconds: float) -> bool:
    """Whether nothing arrives on `reader` for `seconds`."""
    try:
        await asyncio.wait_for(reader.readline(), seconds)
    except TimeoutError:
        return True
    return False
