"""The floor of a durable HTTP write on this machine: HTTP, group commit and the broker's acknowledgement, no work.

    python -m bench.group_commit_floor --port 8098 --bootstrap HOST:PORT --topic TOPIC [--hold-max-ms 2]

uvloop + httptools, as `bench.http_floor`, but each POST is answered only once the broker has acknowledged a record
holding its body: the bodies of one loop pass are joined, as they arrived, into one record, produced through the
API's own `AsyncProducer` (confluent-kafka, acks=all, idempotent), at most one record in flight, the next one
gathering meanwhile and held for the clients an acknowledgement answered as the API holds it (`--hold-max-ms`, the
API's COUNTER_API_GROUP_COMMIT_HOLD_MS; `producers.cohort_hold`). That is the shape of the API's group commit
(`producers.group_commit`) without anything the API does per request: no JSON, no validation, no token, no Avro
body, no read-your-write bookkeeping, no metrics, no framework. `counter bench write` runs it next to the stack and
drives it like the API, so each run shows how much of the gap between AddCount and the raw produce is the HTTP
exchange and the group-commit cycle, and how much is the API's own work per request. A GET is answered at once (the
readiness check). The topic should be one no worker reads: its records are not mutations.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import uvloop

from bench.http_floor import FloorProtocol
from producers.asyncio_producer import AsyncProducer
from producers.cohort_hold import CohortHold

BODY = b'{"floor":true}'
RESPONSE = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(BODY)) + BODY
FAILED = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n"


class GroupCommit:
    """The bodies of this loop pass and the connections waiting on them; one record in flight at a time."""

    def __init__(self, producer: AsyncProducer, topic: str, partitions: int, hold_max_s: float) -> None:
        self.producer, self.topic, self.partitions = producer, topic, partitions
        self.bodies: list[bytes] = []
        self.waiting: list[asyncio.Transport] = []
        self.in_flight = False
        self.partition = 0
        self.loop = asyncio.get_running_loop()
        self.hold = CohortHold(hold_max_s)  # as the API's group commit holds (producers.cohort_hold)

    def add(self, transport: asyncio.Transport, body: bytes) -> None:
        # the last request a hold in progress waited for sends the record
        ended = self.hold.expected and self.hold.came(self.loop)
        if ended or not self.waiting:
            self.loop.call_soon(self.flush_pass)
        self.bodies.append(body)
        self.waiting.append(transport)

    def flush_pass(self) -> None:
        if not self.waiting or self.in_flight:
            return
        if self.hold.wait(self.loop, self.flush_pass):
            return
        self.flush()

    def flush(self) -> None:
        self.hold.cancel()
        value, waiting = b"".join(self.bodies), self.waiting
        self.bodies, self.waiting = [], []
        self.partition = (self.partition + 1) % self.partitions
        self.in_flight = True
        sent = time.perf_counter()
        self.producer.produce(self.topic, value, partition=self.partition).add_done_callback(
            lambda record: self.acknowledged(record, waiting, sent))

    def acknowledged(self, record: asyncio.Future[int | None], waiting: list[asyncio.Transport], sent: float) -> None:
        self.in_flight = False
        response = RESPONSE if record.exception() is None else FAILED
        for transport in waiting:
            if not transport.is_closing():
                transport.write(response)
        self.hold.acknowledged(len(waiting), None if record.exception() else time.perf_counter() - sent,
                               self.loop.time())
        self.flush_pass()


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


async def serve(host: str, port: int, bootstrap: str, topic: str, hold_max_s: float) -> None:
    producer = AsyncProducer(bootstrap, client_id="group-commit-floor")
    producer.start()
    group = GroupCommit(producer, topic, await producer.partitions(topic), hold_max_s)
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
    parser.add_argument("--hold-max-ms", type=float, default=0.0,
                        help="the API's COUNTER_API_GROUP_COMMIT_HOLD_MS, to hold records as it does (0: never)")
    args = parser.parse_args(argv)
    uvloop.run(serve(args.host, args.port, args.bootstrap, args.topic, args.hold_max_ms / 1000))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
