"""A TCP proxy that hands the client every byte its upstream sends `--delay-ms` late: a broker that answers like a
cluster replicating acks=all across hosts, on this one machine.

    python -m bench.delay_proxy --listen PORT --upstream PORT --delay-ms 3

Bytes to the upstream go at once; bytes back wait the delay, in order. Prints "ready" once it listens. Used by
`bench.cohort_hold` in front of the local broker, which advertises the proxy's address so that every client of the
stack goes through it.
"""

from __future__ import annotations

import argparse
import asyncio
import socket

import uvloop


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    loop = asyncio.get_running_loop()
    try:
        while data := await reader.read(1 << 16):
            if delay_s:
                loop.call_later(delay_s, writer.write, data)  # a constant delay keeps the order
            else:
                writer.write(data)
    except ConnectionError:
        pass
    finally:
        loop.call_later(delay_s, writer.close)


async def serve(listen: int, upstream: int, delay_s: float) -> None:
    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", upstream)
        except OSError:
            client_writer.close()
            return
        for writer in (client_writer, upstream_writer):
            writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(_pipe(client_reader, upstream_writer, 0.0), _pipe(upstream_reader, client_writer, delay_s))

    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--listen", type=int, required=True)
    parser.add_argument("--upstream", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, required=True)
    args = parser.parse_args()
    uvloop.run(serve(args.listen, args.upstream, args.delay_ms / 1000))


if __name__ == "__main__":
    main()
