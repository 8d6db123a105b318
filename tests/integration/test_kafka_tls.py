"""Every Kafka client of the service over TLS (COUNTER_KAFKA_SECURITY_PROTOCOL=SSL), against a real broker.

The local broker speaks plaintext; a TLS proxy in front of it (this file), which the broker advertises as its address,
makes it a cluster that refuses plaintext clients, as managed Kafka does. Before, no client had any security setting
(a review): the worker, the API and the tools could not reach such a cluster. Here the worker (Faust's group, the
aiokafka persist consumer, its producer), the API (its producer, its broker offsets), `counter produce`, `counter
replay` and `counter dlq list` all count or read through it. SASL is not tested here: the local broker's SASL needs
users it cannot create in memory; its settings are checked in tests/unit/test_kafka_security.py."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from confluent_kafka.admin import AdminClient

from infra.broker import LocalBroker
from infra.process import free_port
from producers import CounterProducer
from tests.helpers import wait_for
from tests.pipeline_harness import PipelineEnv

pytestmark = pytest.mark.integration

NS = "my_dataset"


def _certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (openssl, part of the base system)."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    openssl = shutil.which("openssl")
    assert openssl, "openssl is needed to make the TLS proxy's certificate"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


@contextlib.contextmanager
def tls_proxy(port: int, upstream: int, cert: Path, key: Path) -> Iterator[None]:
    """TLS on 127.0.0.1:`port`, plaintext to 127.0.0.1:`upstream`, on a thread of its own."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(cert), str(key))
    loop = asyncio.new_event_loop()
    started = threading.Event()

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def main() -> asyncio.base_events.Server:
        return await asyncio.start_server(serve, "127.0.0.1", port, ssl=context)

    def run() -> None:
        server = loop.run_until_complete(main())
        started.set()
        loop.run_forever()
        server.close()

    thread = threading.Thread(target=run, name="tls-proxy", daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        yield
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def test_the_worker_the_api_and_the_tools_count_over_tls(tmp_path: Path, memcached_address: str) -> None:
    cert, key = _certificate(tmp_path)
    tls_port = free_port("127.0.0.1")
    broker = LocalBroker(tmp_path / "broker.log", advertised=f"127.0.0.1:{tls_port}")
    broker.start()
    try:
        with tls_proxy(tls_port, broker.port, cert, key):
            bootstrap = f"127.0.0.1:{tls_port}"
            with pytest.raises(Exception):  # noqa: B017 - the cluster refuses a plaintext client: librdkafka's error
                AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 3000}).list_topics(timeout=3)
            security = {"COUNTER_KAFKA_SECURITY_PROTOCOL": "SSL", "COUNTER_KAFKA_SSL_CA_FILE": str(cert)}
            env = PipelineEnv(bootstrap, memcached_address, tmp_path / "data", extra_env=security).prepare()
            try:
                env.start_worker()
                api = env.start_api()
                with httpx.Client(base_url=f"http://127.0.0.1:{api.port}", timeout=30) as client:
                    for _ in range(3):
                        assert client.post("/v1/AddCount", json={"namespace": NS, "counter_name": "api",
                                                                 "delta": 2}).status_code == 200
                    with CounterProducer(bootstrap, topic=env.mutations_topic,
                                         config={"security.protocol": "ssl", "ssl.ca.location": str(cert)}) as p:
                        p.add(NS, "client", 5)
                    cli = [sys.executable, "-m", "counter_cli.main"]
                    tool_env = {**{k: v for k, v in os.environ.items() if not k.startswith("COUNTER_")},
                                **env.env()}
                    produced = subprocess.run([*cli, "produce", NS, "cli", "7"], env=tool_env, capture_output=True,
                                              text=True, timeout=120)
                    assert produced.returncode == 0, produced.stderr
                    wait_for(lambda: env.converged(NS, {"api": 6, "client": 5, "cli": 7}), 60,
                             message=lambda: env.mismatches(NS, {"api": 6, "client": 5, "cli": 7}))
                    health = client.get("/v1/pipeline").json()  # the API's broker offsets, over TLS too
                    assert "broker" not in health["errors"] and health["topics"], health
                    for args in (["replay", "--from", "earliest"], ["dlq", "list"]):
                        done = subprocess.run([*cli, *args], env=tool_env, capture_output=True, text=True,
                                              timeout=180)
                        assert done.returncode == 0, (args, done.stderr)
                    assert env.converged(NS, {"api": 6, "client": 5, "cli": 7})
            finally:
                env.stop()
    finally:
        broker.stop()
