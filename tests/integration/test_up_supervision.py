"""`counter up` as an operator runs it, with its children killed under it: what may restart is restarted on
the same port and nothing acknowledged is lost; the broker's death stops everything; killing `counter up`
itself (even with SIGKILL) leaves no child behind; a signal stops the children in reverse order."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bench.loadgen import http_load, http_post
from infra.process import free_port, http_ok, port_open
from tests.helpers import gone, wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
COUNTER = [sys.executable, "-m", "counter_cli.main"]
# accept_limit 3 s, coalesce 200 ms: an EVENTUAL count converges seconds after the last write.
NAMESPACES = ROOT / "tests" / "data" / "pipeline_namespaces.yaml"
CHILDREN = {"broker", "memcached", "worker-0", "api-0"}
START_TIMEOUT_S = 90


def children_of(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


@dataclass
class Up:
    """A `counter up` subprocess on free ports, its console output in a file."""

    data_dir: Path
    proc: subprocess.Popen[bytes]
    output_path: Path
    seen_pids: set[int] = field(default_factory=set)

    @property
    def endpoints_file(self) -> Path:
        return self.data_dir / "endpoints.json"

    def endpoints(self) -> dict[str, Any]:
        return json.loads(self.endpoints_file.read_text())

    def pids(self) -> dict[str, int | None]:
        pids = self.endpoints()["processes"]
        self.seen_pids.update(p for p in pids.values() if p)
        return pids

    def output(self) -> str:
        return self.output_path.read_text(errors="replace")

    def wait_for_endpoints(self) -> Up:
        wait_for(lambda: self.endpoints_file.exists() or self.proc.poll() is not None, START_TIMEOUT_S,
                 interval=0.1, message="endpoints.json")
        assert self.proc.poll() is None, self.output()
        return self

    def wait_up(self) -> Up:
        """Up with its own broker: every child has a pid."""
        self.wait_for_endpoints()
        assert set(self.pids()) == CHILDREN and all(self.pids().values()), self.endpoints()
        return self

    def signal_and_wait(self, sig: int, timeout: float) -> tuple[int, float]:
        """Send `sig`; returns the exit code and how long `counter up` took to exit."""
        started = time.monotonic()
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout)
        return code, time.monotonic() - started

    def cleanup(self) -> None:
        """After a failed test: end `counter up` and anything it left (pids it published)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in self.seen_pids:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


def counter_env(data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COUNTER_")}
    env.update(COUNTER_DATA_DIR=str(data_dir), COUNTER_NAMESPACES=str(NAMESPACES),
               COUNTER_API_PORT=str(free_port()), COUNTER_WORKER_PORT=str(free_port()))
    env.update(extra)
    return env


def start_up(tmp_path: Path, data_dir: Path | None = None, **extra_env: str) -> Up:
    """`counter up` on free ports, its data in `data_dir` (default tmp_path/data), its console in tmp_path."""
    data_dir = data_dir or tmp_path / "data"
    tmp_path.mkdir(parents=True, exist_ok=True)
    output_path = tmp_path / "counter-up.out"
    with open(output_path, "wb") as out:
        proc = subprocess.Popen([*COUNTER, "up"], env=counter_env(data_dir, **extra_env), cwd=ROOT,
                                stdout=out, stderr=subprocess.STDOUT)
    return Up(data_dir, proc, output_path)


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    running = start_up(tmp_path)
    try:
        yield running.wait_up()
    finally:
        running.cleanup()


def post(conn: http.client.HTTPConnection, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    conn.request("POST", path, json.dumps(body), {"content-type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    return response.status, json.loads(data) if data else {}


class WriteLoad:
    """EVENTUAL AddCount requests with unique idempotency tokens from a thread; remembers which were
    acknowledged (HTTP 200) and every request that was not."""

    def __init__(self, api_url: str, counters: list[str]) -> None:
        self.host, port = api_url.removeprefix("http://").rsplit(":", 1)
        self.port = int(port)
        self.counters = counters
        self.acked: list[tuple[str, int]] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> WriteLoad:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive()

    def expected(self) -> dict[str, int]:
        sums: dict[str, int] = defaultdict(int)
        for counter, delta in self.acked:
            sums[counter] += delta
        return {c: sums[c] for c in self.counters}

    def _run(self) -> None:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        i = 0
        while not self._stop.is_set():
            counter, delta = self.counters[i % len(self.counters)], 1 + i % 7
            body = {"namespace": "my_dataset", "counter_name": counter, "delta": delta,
                    "idempotency_token": {"token": uuid.uuid4().hex, "generation_time": int(time.time() * 1000)}}
            try:
                status, answer = post(conn, "/v1/AddCount", body)
            except (OSError, http.client.HTTPException) as exc:
                self.failures.append(f"request {i}: {type(exc).__name__}: {exc}")
                conn.close()
                conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
            else:
                if status == 200:
                    self.acked.append((counter, delta))
                else:
                    self.failures.append(f"request {i}: HTTP {status} {answer}")
            i += 1
            time.sleep(0.003)  # pacing, so the load leaves CPU to the worker and its restart
        conn.close()


def get_counts(api_url: str, counters: list[str]) -> dict[str, int]:
    host, port = api_url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        counts = {}
        for counter in counters:
            status, answer = post(conn, "/v1/GetCount", {"namespace": "my_dataset", "counter_name": counter})
            assert status == 200, answer
            counts[counter] = answer["count"]
        return counts
    finally:
        conn.close()


def test_worker_killed_under_load_is_restarted_and_every_acknowledged_write_counts(up):
    endpoints = up.endpoints()
    api_url, worker_ready = endpoints["api_url"], endpoints["worker_metrics"].replace("/metrics", "/ready")
    counters = [f"killed-worker-{i}" for i in range(3)]
    load = WriteLoad(api_url, counters).start()
    try:
        wait_for(lambda: len(load.acked) >= 300 or load.failures, 30, message="writes acknowledged")
        old = up.pids()["worker-0"]
        os.kill(old, signal.SIGKILL)
        acked_at_kill = len(load.acked)
        new = wait_for(lambda: up.pids()["worker-0"] not in (None, old) and up.pids()["worker-0"], 15,
                       message=lambda: f"a new worker pid in endpoints.json; output:\n{up.output()}")
        wait_for(lambda: http_ok(worker_ready), 90, interval=0.25,
                 message=lambda: f"the restarted worker ready; output:\n{up.output()}")
        acked_at_ready = len(load.acked)
        wait_for(lambda: len(load.acked) >= acked_at_ready + 200 or load.failures, 30,
                 message="writes acknowledged after the restart")
    finally:
        load.stop()
    assert load.failures == [], load.failures[:5]
    assert acked_at_ready > acked_at_kill, "the API stopped acknowledging writes while the worker was down"
    assert gone(old) and not gone(new)
    output = up.output()
    assert f"worker-0 (pid {old}) died: killed by SIGKILL" in output
    assert f"restarted worker-0 (pid {new}, restart #1)" in output
    expected = load.expected()
    wait_for(lambda: get_counts(api_url, counters) == expected, 60, interval=0.5,
             message=lambda: f"GetCount {get_counts(api_url, counters)} == acknowledged sums {expected} "
                             f"({len(load.acked)} writes)")


def test_api_and_memcached_restart_on_their_ports_and_sigterm_stops_all_in_reverse_order(up):
    endpoints = up.endpoints()
    api_url = endpoints["api_url"]
    before = up.pids()
    os.kill(before["api-0"], signal.SIGKILL)
    os.kill(before["memcached"], signal.SIGKILL)
    wait_for(lambda: all(up.pids()[n] not in (None, before[n]) for n in ("api-0", "memcached")), 15,
             message=lambda: f"new api and memcached pids; output:\n{up.output()}")
    wait_for(lambda: http_ok(f"{api_url}/healthz"), 60, interval=0.25,
             message=lambda: f"the restarted API answering on {api_url}; output:\n{up.output()}")
    host, port = endpoints["memcached"].rsplit(":", 1)
    wait_for(lambda: _memcached_version(host, int(port)), 20, message="the restarted memcached on its port")
    after = up.pids()
    assert up.endpoints()["api_url"] == api_url and up.endpoints()["memcached"] == endpoints["memcached"]
    assert after["broker"] == before["broker"] and after["worker-0"] == before["worker-0"]
    output = up.output()
    assert f"api-0 (pid {before['api-0']}) died: killed by SIGKILL" in output
    assert f"memcached (pid {before['memcached']}) died: killed by SIGKILL" in output

    code, took = up.signal_and_wait(signal.SIGTERM, 60)
    output = up.output()
    assert code == 0, output
    assert took < 30, f"stopping took {took:.1f}s"
    order = [output.index(f"stopping {name} (pid {after[name]})") for name in
             ("api-0", "worker-0", "memcached", "broker")]
    assert order == sorted(order), output
    assert all(gone(pid) for pid in after.values())
    assert not up.endpoints_file.exists()


def _memcached_version(host: str, port: int) -> bool:
    import socket

    try:
        with socket.create_connection((host, port), timeout=0.5) as sock:
            sock.sendall(b"version\r\n")
            return sock.recv(64).startswith(b"VERSION")
    except OSError:
        return False


def test_ctrl_c_again_while_stopping_kills_everything_and_no_further_signal_prints_a_traceback(up):
    """The first Ctrl-C starts the stop, and the worker's line says what it waits for (the drain) and what Ctrl-C
    again does. With the broker frozen the stop waits on it; a burst of SIGINT, SIGTERM, SIGHUP and SIGINT then kills
    everything at once, saying what is lost, and the signals after the first are one line, never a traceback (a
    third one raised out of the code killing the children: a traceback, children left, the endpoints file too)."""
    pids = up.pids()
    os.kill(pids["broker"], signal.SIGSTOP)  # counter up's cleanup SIGKILLs it if the test fails
    up.proc.send_signal(signal.SIGINT)
    worker_line = f"stopping worker-0 (pid {pids['worker-0']})"
    wait_for(lambda: worker_line in up.output() or up.proc.poll() is not None, 60,
             message=lambda: f"the worker's stop; output:\n{up.output()}")
    [line] = [line for line in up.output().splitlines() if worker_line in line]
    assert "persists the writes the local broker still holds (up to 120 s)" in line, line
    assert "Ctrl-C again kills everything" in line, line
    started = time.monotonic()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        up.proc.send_signal(sig)
    code = up.proc.wait(30)
    took = time.monotonic() - started
    output = up.output()
    # 128 + the signal that forced the kill: of a burst, Linux delivers the lowest-numbered pending one first
    assert code in {128 + s for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}, \
        f"exit code {code}: a stop that lost acknowledged writes is no clean exit"
    assert "Traceback" not in output and "Interrupted" not in output, output  # nor Python's "lost sys.stderr"
    assert took < 10, f"killing everything took {took:.1f}s"
    assert "received while stopping: killing everything (the writes the worker had not persisted yet are lost" \
        in output, output
    assert output.count("received again: stopping already, exiting once the children are gone") == 1, output
    assert output.rstrip().splitlines()[-1] == "stopped.", output
    assert all(gone(pid) for pid in pids.values()), output
    assert not up.endpoints_file.exists()


def test_kill_9_of_counter_up_takes_every_child_with_it_and_the_next_one_says_so(up, tmp_path):
    """No child outlives a killed `counter up`; its local broker's unpersisted writes went with it, which the next
    `counter up` on the directory says (it found the pid the killed one never cleared), and a clean stop's does not."""
    pids = up.pids()
    assert not any(gone(pid) for pid in pids.values())
    up.proc.kill()
    up.proc.wait(10)
    wait_for(lambda: all(gone(pid) for pid in pids.values()), 10,
             message=lambda: f"children of the killed counter up still alive: "
                             f"{ {n: p for n, p in pids.items() if not gone(p)} }")
    said = f"the last `counter up` on {up.data_dir} (pid {up.proc.pid}) ended without its stop"
    for run, expected in (("after-kill", True), ("after-stop", False)):
        again = start_up(tmp_path / run, up.data_dir)
        try:
            wait_for(lambda run=again: "counter is up" in run.output() or run.proc.poll() is not None,
                     START_TIMEOUT_S, interval=0.1, message="counter up again")  # the killed one's endpoints file stays
            assert (said in again.output()) is expected, again.output()
            code, _ = again.signal_and_wait(signal.SIGINT, 90)
            assert code == 0, again.output()
        finally:
            again.cleanup()


def test_broker_death_is_reported_and_stops_everything(up):
    pids = up.pids()
    killed_at = time.monotonic()
    os.kill(pids["broker"], signal.SIGKILL)
    code = up.proc.wait(60)
    took = time.monotonic() - killed_at
    output = up.output()
    assert code == 1, output
    assert took < 20, f"stopping without the broker took {took:.1f}s"
    assert f"broker (pid {pids['broker']}) died: killed by SIGKILL" in output
    assert "keeps its topics in memory" in output and "lost" in output
    assert "restarting broker" not in output
    assert all(gone(pid) for pid in pids.values()), output
    assert not up.endpoints_file.exists()


def test_ctrl_c_while_starting_stops_what_was_started(tmp_path):
    running = start_up(tmp_path)
    try:
        worker_log = running.data_dir / "logs" / "worker-0.log"
        # its log is opened just before the worker's process starts: wait for the process too
        wait_for(lambda: (worker_log.exists() and len(children_of(running.proc.pid)) >= 3)
                 or running.proc.poll() is not None, START_TIMEOUT_S, message="the worker being started")
        started = children_of(running.proc.pid)
        running.seen_pids.update(started)
        assert len(started) >= 3, started  # broker, memcached, the starting worker
        code, took = running.signal_and_wait(signal.SIGINT, 60)
        output = running.output()
        assert code == 128 + signal.SIGINT, output
        assert "SIGINT received while starting" in output and "stopped." in output
        assert took < 30, f"stopping took {took:.1f}s"
        assert all(gone(pid) for pid in started), output
        assert not running.endpoints_file.exists()
    finally:
        running.cleanup()


def test_with_an_external_broker_there_is_no_broker_child(kafka_bootstrap, tmp_path):
    prefix = f"t{uuid.uuid4().hex[:10]}"
    running = start_up(tmp_path, COUNTER_KAFKA_BOOTSTRAP=kafka_bootstrap, COUNTER_WORKER_ID=f"{prefix}-worker",
                       COUNTER_MUTATIONS_TOPIC=f"{prefix}-mutations", COUNTER_ROLLUPS_TOPIC=f"{prefix}-rollups",
                       COUNTER_DLQ_TOPIC=f"{prefix}-dlq")
    try:
        running.wait_for_endpoints()
        pids = running.pids()
        assert set(pids) == CHILDREN - {"broker"} and all(pids.values()), pids
        assert running.endpoints()["kafka_bootstrap"] == kafka_bootstrap
        code, _ = running.signal_and_wait(signal.SIGINT, 60)
        assert code == 0, running.output()
        assert all(gone(pid) for pid in pids.values())
        host, port = kafka_bootstrap.split(",")[0].rsplit(":", 1)
        assert port_open(host, int(port)), "counter up stopped a broker it did not start"
    finally:
        running.cleanup()


def test_a_clean_stop_persists_the_writes_a_lagging_worker_had_not_read(tmp_path):
    """The local broker keeps its topics in memory: on Ctrl-C a worker that lags (here frozen while tens of
    thousands of writes are acknowledged) persists its partitions up to their end before the broker goes
    (COUNTER_PERSIST_DRAIN_S, which `counter up` sets for its own broker). Started again on the same data
    directory, every acknowledged write counts. Without the drain the first stop lost nearly all of them."""
    first = start_up(tmp_path, COUNTER_WORKER_LOG_LEVEL="info").wait_up()
    counters = [f"clean-stop-{i}" for i in range(3)]
    requests = [http_post("/v1/AddCount", json.dumps({"namespace": "my_dataset", "counter_name": c,
                                                      "delta": 1}).encode()) for c in counters]
    acked = [0] * len(counters)
    try:
        worker = first.pids()["worker-0"]
        assert worker is not None
        host, port = first.endpoints()["api_url"].removeprefix("http://").rsplit(":", 1)
        os.kill(worker, signal.SIGSTOP)  # for 2 s: its group session (10 s) survives
        try:
            result = http_load(host, int(port), requests, concurrency=16, duration_s=2, acked=acked)
        finally:
            os.kill(worker, signal.SIGCONT)
        assert result.errors == 0 and sum(acked) > 1000, (result.summary(), acked)
        code, _ = first.signal_and_wait(signal.SIGINT, 90)
        assert code == 0, first.output()
    finally:
        first.cleanup()
    first_worker_log = (first.data_dir / "logs" / "worker-0.log").read_text(errors="replace")  # before the restart
    again = start_up(tmp_path, COUNTER_WORKER_LOG_LEVEL="info").wait_up()
    try:
        api_url, expected = again.endpoints()["api_url"], dict(zip(counters, acked, strict=True))
        wait_for(lambda: get_counts(api_url, counters) == expected, 60, interval=0.5,
                 message=lambda: f"GetCount {get_counts(api_url, counters)} == acknowledged {expected} after a "
                                 f"clean stop and a start; the pipeline now: {pipeline_view(api_url)}; the first "
                                 f"run's worker at its stop: {stop_lines(first_worker_log)}")
    finally:
        again.cleanup()


def test_a_clean_stop_that_could_not_persist_says_what_is_lost_and_exits_1(tmp_path):
    """A worker that cannot persist within its drain (the event store held locked by another process, as an
    operator's sqlite3 shell or a backup would hold it) leaves with its partitions' writes unpersisted, and the
    local broker loses them when it stops. The stop printed only "stopped." and exited 0; it now counts them before
    the broker goes, says so, and exits 1."""
    first = start_up(tmp_path, COUNTER_PERSIST_DRAIN_S="2").wait_up()
    try:
        host, port = first.endpoints()["api_url"].removeprefix("http://").rsplit(":", 1)
        request = http_post("/v1/AddCount", json.dumps({"namespace": "my_dataset", "counter_name": "locked-out",
                                                        "delta": 1}).encode())
        acked = [0]
        lock = sqlite3.connect(first.data_dir / "events.sqlite3", timeout=30, isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")  # no worker writes an event until it ends
        try:
            result = http_load(host, int(port), [request], concurrency=8, duration_s=1, acked=acked)
            assert result.errors == 0 and acked[0] > 100, result.summary()
            code, _ = first.signal_and_wait(signal.SIGINT, 90)
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        output = first.output()
        assert code == 1, output
        said = re.search(r"error: ([\d,]+) acknowledged write\(s\) \([\d,]+ record\(s\)\) were not persisted", output)
        assert said is not None and int(said[1].replace(",", "")) == acked[0], (acked, output)
    finally:
        first.cleanup()


def pipeline_view(api_url: str) -> str:
    """/v1/pipeline (pending rollups, watermark lag), for a failure's message: were the writes persisted at all?"""
    with urllib.request.urlopen(f"{api_url}/v1/pipeline", timeout=10) as answer:
        return answer.read().decode()[:2000]


def stop_lines(worker_log: str) -> str:
    """What a worker logged about its stop and partitions (the drain's line says how many records it persisted)."""
    wanted = ("stop", "drain", "revoked", "assigned", "persisted", "error", "Error")
    return "\n".join(line for line in worker_log.splitlines() if any(w in line for w in wanted))[-3000:]


def test_a_second_counter_up_on_the_same_data_directory_is_refused(up):
    """Two stacks on one directory would share its stores with two brokers whose partitions have the same names
    (each worker's persist watermark overwriting the other's). The second `counter up` exits naming the first,
    starting nothing and leaving the first's endpoints file alone. (A start after a stop on the same directory is
    test_a_clean_stop_persists_the_writes_a_lagging_worker_had_not_read's.)"""
    env = counter_env(up.data_dir)
    before = up.endpoints()
    second = subprocess.run([*COUNTER, "up", "--no-compile"], env=env, cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    assert second.returncode == 1, second.stderr
    assert f"{up.data_dir} is in use by another `counter up` (pid {up.proc.pid})" in " ".join(second.stderr.split())
    assert "counter is up" not in second.stderr
    assert up.endpoints() == before
    assert all(not gone(pid) for pid in up.pids().values())
