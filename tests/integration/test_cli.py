"""The `counter` CLI as a user runs it: `up` (with SIGINT) and `produce`."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from infra.process import free_port, port_open
from schemas import decode_mutations
from sinks import SqliteRollupStore
from tests.helpers import make_topic, read_all, topic_size, wait_for

pytestmark = pytest.mark.integration

COUNTER = [sys.executable, "-m", "counter_cli.main"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COUNTER_")}
    env.update(extra)
    return env


def test_up_writes_endpoints_answers_and_stops_on_sigint(tmp_path):
    data_dir = tmp_path / "data"
    proc = subprocess.Popen([*COUNTER, "up"], env=_env(COUNTER_DATA_DIR=str(data_dir),
                                                       COUNTER_API_PORT=str(free_port()),
                                                       COUNTER_WORKER_PORT=str(free_port())),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    endpoints_file = data_dir / "endpoints.json"
    try:
        wait_for(lambda: endpoints_file.exists() or proc.poll() is not None, 60, message="endpoints.json")
        assert proc.poll() is None, proc.stdout.read()
        endpoints = json.loads(endpoints_file.read_text())
        assert set(endpoints) >= {"kafka_bootstrap", "api_url", "ui_url", "memcached", "namespaces", "processes"}
        assert Path(endpoints["namespaces"]).is_file()  # the file a `counter worker` joining the stack loads
        with urllib.request.urlopen(endpoints["ui_url"], timeout=10) as page:  # the web UI, served by the API
            assert page.status == 200 and b"Counter Abstraction" in page.read()
        pids = endpoints["processes"]
        assert set(pids) == {"broker", "memcached", "worker-0", "api-0"} and all(pids.values())
        topics = AdminClient({"bootstrap.servers": endpoints["kafka_bootstrap"]}).list_topics(timeout=10).topics
        assert {"counter-mutations", "counter-rollups", "counter-mutations-dlq"} <= set(topics)
        assert len(topics["counter-mutations"].partitions) == 8
        host, port = endpoints["memcached"].rsplit(":", 1)
        assert port_open(host, int(port))
        # `produce` finds the broker through endpoints.json
        produced = subprocess.run([*COUNTER, "produce", "my_dataset", "counter123", "2"],
                                  env=_env(COUNTER_DATA_DIR=str(data_dir)), capture_output=True, text=True,
                                  timeout=60)
        assert produced.returncode == 0, produced.stderr
        (record,) = read_all(endpoints["kafka_bootstrap"], "counter-mutations")
        assert decode_mutations(record.value)[0].delta == 2
        produced = subprocess.run([*COUNTER, "produce", "my_dataset", "counter123", "--", "-5"],
                                  env=_env(COUNTER_DATA_DIR=str(data_dir)), capture_output=True, text=True,
                                  timeout=60)
        assert produced.returncode == 0, produced.stderr
        # The embedded worker counts them exactly (example namespaces: accept_limit 5 s, coalesce 10 s).
        wait_for(lambda: _rollup(data_dir, "my_dataset", "counter123") == -3, 60, interval=0.5,
                 message="counter123 rolled up to -3")
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0, out
    assert "stopped" in out
    assert endpoints["ui_url"] in out  # the printed endpoints include the UI
    bhost, bport = endpoints["kafka_bootstrap"].rsplit(":", 1)
    assert not port_open(bhost, int(bport)), "broker still running after SIGINT"
    assert not port_open(host, int(port)), "memcached still running after SIGINT"
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids.values()), "a child outlived counter up"
    order = [out.index(f"stopping {name} (pid {pids[name]})") for name in ("api-0", "worker-0", "memcached",
                                                                           "broker")]
    assert order == sorted(order), out
    assert not endpoints_file.exists()


def _rollup(data_dir: Path, namespace: str, counter: str) -> int | None:
    """The rolled-up count in the SQLite rollup store of a running `counter up` (None until rolled up)."""
    async def read() -> int | None:
        store = SqliteRollupStore(data_dir / "rollups.sqlite3")
        try:
            state = await store.get(namespace, counter)
        finally:
            await store.close()
        return state.count if state is not None and state.rollup_ts >= state.last_write_ts else None
    return asyncio.run(read())


def test_up_with_bad_setting_fails_naming_it(tmp_path):
    result = subprocess.run([*COUNTER, "up"], env=_env(COUNTER_DATA_DIR=str(tmp_path), COUNTER_API_PORT="x"),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "COUNTER_API_PORT" in result.stderr


def test_up_with_bad_namespace_file_fails_naming_the_field(tmp_path):
    bad = tmp_path / "ns.yaml"
    bad.write_text("namespaces:\n  my_dataset:\n    counter_type: SOMETIMES\n")
    result = subprocess.run([*COUNTER, "up"], env=_env(COUNTER_DATA_DIR=str(tmp_path),
                                                       COUNTER_NAMESPACES=str(bad)),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "counter_type" in result.stderr and "my_dataset" in result.stderr


def test_produce_jsonl_file_with_progress(kafka_bootstrap, topic_name, tmp_path):
    make_topic(kafka_bootstrap, topic_name, 3)
    now_ms = int(time.time() * 1000)  # times `counter produce` admits (it refuses what the pipeline would not)
    lines = [json.dumps({"namespace": "my_dataset", "counter_name": f"c{i % 5}", "delta": i,
                         "idempotency_token": {"token": f"t{i}", "generation_time": now_ms - i}})
             for i in range(300)]
    lines.append(json.dumps({"namespace": "my_dataset", "counter_name": "c1", "op": "clear",
                             "idempotency_token": {"token": "clr", "generation_time": now_ms}}))
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(lines) + "\n")
    result = subprocess.run([*COUNTER, "produce", "--file", str(path), "--bootstrap", kafka_bootstrap,
                             "--topic", topic_name, "--batch-size", "50"],
                            env=_env(COUNTER_DATA_DIR=str(tmp_path)), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "produced 301 mutation(s)" in result.stderr
    records = read_all(kafka_bootstrap, topic_name)
    assert sum(len(decode_mutations(r.value)) for r in records) == 301
    got = {m.event_id: m for r in records for m in decode_mutations(r.value)}
    assert sum(m.delta for k, m in got.items() if k != "clr") == sum(range(300))
    assert got["clr"].op.value == "CLEAR"


def test_produce_bad_file_sends_nothing(kafka_bootstrap, topic_name, tmp_path):
    make_topic(kafka_bootstrap, topic_name, 1)
    path = tmp_path / "bad.jsonl"
    path.write_text('{"namespace": "my_dataset", "counter_name": "ok", "delta": 1}\n'
                    '{"namespace": "my_dataset", "counter_name": "bad", "delta": "two"}\n')
    result = subprocess.run([*COUNTER, "produce", "--file", str(path), "--bootstrap", kafka_bootstrap,
                             "--topic", topic_name], env=_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "bad.jsonl:2" in result.stderr and "delta" in result.stderr
    assert topic_size(kafka_bootstrap, topic_name) == 0


def test_every_verb_has_help():
    for verb in ("up", "produce", "worker", "replay", "recount", "audit", "dlq"):
        result = subprocess.run([*COUNTER, verb, "--help"], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0 and "usage: counter " + verb in result.stdout
