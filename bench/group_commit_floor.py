"""The floor of a durable HTTP write on this machine: HTTP, group commit and the broker's acknowledgement, no work.

    python -m bench.group_commit_floor --port 8098 --bootstrap HOST:PORT --topic TOPIC

uvloop + httptools, as `bench.http_floor`, but each POST is answered only once the broker has acknowledged a record
holding its body: the bodies of one loop pass are joined, as they arrived, into one record, produced through the
API's own `AsyncProducer` (confluent-kafka, acks=all, idempotent), at most one record in flight, the next one
gathering meanwhile. That is the shape of the API's group commit (`producers.group_commit`) without anything the
API does per request: no JSON, no validation, no token, no Avro body, no read-your-write bookkeeping, no metrics, no
framework. `counter bench write` runs it next to the stack and drives it like the API, so each run shows how
much of the gap between AddCount and the raw produce is the HTTP exchange and the group-commit cycle, and how
much is the API's own work per request. A GET is answered at once (the readiness check). The topic should be
one no worker reads: its records are not mutations.
"""

from __future__ import annotations

import argparse
import asyncio

import uvloop

from bench.http_floor import FloorProtocol
from producers.asyncio_producer import AsyncProducer

BODY = b'{"floor":true}'
RESPONSE = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(BODY)) + BODY
FAILED = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n"


class GroupCommit:
    """The bodies of this loop pass and the connections waiting on them; one record in flight at a time."""

    def __init__(self, producer: AsyncProducer, topic: str, partitions: int) -> None:
        self.producer, self.topic, self.partitions = producer, topic, partitions
        self.bodies: list[bytes] = []
        self.waiting: list[asyncio.Transport] = []
        self.in_flight = False
        self.partition = 0
        self.loop = asyncio.get_running_loop()

    def add(self, transport: asyncio.Transport, body: bytes) -> None:
        if not self.waiting:
            self.loop.call_soon(self.flush_pass)
        self.bodies.append(body)
        self.waiting.append(transport)

    def flush_pass(self) -> None:
        if self.waiting and not self.in_flight:
            self.flush()

    def flush(self) -> None:
        value, waiting = b"".join(self.bodies), self.waiting
        self.bodies, self.waiting = [], []
        self.partition = (self.partition + 1) % self.partitions
        self.in_flight = True
        self.producer.produce(self.topic, value, partition=self.partition).add_done_callback(
            lambda record: self.acknowledged(record, waiting))

    def acknowledged(self, record: asyncio.Future[int | None], waiting: list[asyncio.Transport]) -> None:
        self.in_flight = False
        response = RESPONSE if record.exception() is None else FAILED
        for transport in waiting:
            if not transport.is_closing():
                transport.write(response)
        if self.waiting:
            self.flush()


class GroupCommitFloorProtocol(FloorProtocol):
    """`bench.http_floor`'s protocol, answering a POST once its body's record is acknowledged."""

    def __init__(self, group: GroupCommit) -> None:
        super().__init__()
        self.group = group
        self.body = b""

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        body, self.body = self.body, b""
        if self.parser.get_method() == b"POST":
            self.group.add(self.transport, body)
        else:
            self.transport.write(RESPONSE)


async def serve(host: str, port: int, bootstrap: str, topic: str) -> None:
    producer = AsyncProducer(bootstrap, client_id="group-commit-floor")
    producer.start()
    group = GroupCommit(producer, topic, await producer.partitions(topic))
    server = await asyncio.get_running_loop().create_server(lambda: GroupCommitFloorProtocol(group), host, port)
    try:
        async with server:
            await server.serve_forever()
    finally:
        await producer.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.group_commit_floor", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--bootstrap", required=True, help="the broker, host:port")
    parser.add_argument("--topic", required=True, help="a topic no worker reads")
    args = parser.parse_args(argv)
    uvloop.run(serve(args.host, args.port, args.bootstrap, args.topic))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
