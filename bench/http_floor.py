"""The floor of any Python HTTP endpoint on this machine: uvloop + httptools answering a constant JSON body.

    python -m bench.http_floor --port 8099

No framework, no memcached, no work: one parse and one send per request, the least an HTTP call costs here.
The read and best-effort benchmarks start it next to the stack and drive it with the same load generator, so
their results show how close the service is to what Python HTTP can do at all on the same cores.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import cast

import httptools
import uvloop

BODY = b'{"namespace":"floor","counter_name":"floor","count":0}'
RESPONSE = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(BODY)) + BODY


class FloorProtocol(asyncio.Protocol):
    transport: asyncio.Transport  # from connection_made, before any data

    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream connection's transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()

    def on_message_complete(self) -> None:
        self.transport.write(RESPONSE)


async def serve(host: str, port: int) -> None:
    server = await asyncio.get_running_loop().create_server(FloorProtocol, host, port)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.http_floor", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    uvloop.run(serve(args.host, args.port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
