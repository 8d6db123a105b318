"""`counter up`: run the embedded default on one machine, keep it running, stop it on Ctrl-C.

The children are supervised (infra.supervisor): a worker, the API or memcached that dies is restarted with
backoff; the local broker's death stops everything, because the in-memory broker takes acknowledged writes not
yet persisted with it. Children die with `counter up`, even when it is killed with SIGKILL.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import time
from pathlib import Path
from types import FrameType
from typing import IO

from confluent_kafka import KafkaException

from control_plane import ConfigError, NamespaceRegistry, load_namespaces
from counter_cli.common import (
    add_no_compile,
    build_native_parts,
    check_against_namespaces,
    check_api_namespaces,
    check_listen,
    console,
    fail,
    kafka_failure,
    namespaces_or_exit,
    settings_or_exit,
    store_location,
)
from counter_cli.unpersisted import unpersisted
from infra.broker import LongPartitionWatch
from infra.memcached import find_memcached
from infra.process import ManagedProcess, ServiceError
from infra.stack import LocalStack
from infra.supervisor import Supervisor
from streams.namespace_shapes import (
    NamespaceChanged,
    guard_namespaces,
    removed_warning,
    restore_shapes,
    save_shapes,
)
from streams.settings import Settings
from streams.topics import TopicError, ensure_topics, topic_specs

BROKER_LOSS = (
    "The local broker keeps its topics in memory: the mutations it acknowledged that the worker had not yet "
    "persisted are lost with it. It is not restarted, because a silent restart would hide that loss; "
    "stopping everything. Persisted counts are safe in the data directory; after `counter up` again, clients "
    "that retry their writes with the same idempotency tokens are counted exactly once, while each retry is within "
    "its namespace's accept_limit of its generation_time (5 s in the shipped presets): later ones are refused (422)."
)
POLL_S = 0.25
LOCK_FILE = "counter-up.lock"  # in the data directory: one `counter up` per directory (_lock_data_dir)
SAVED_SHAPES = "namespace-shapes.json"  # in the data directory: what the local broker recorded, between runs
IN_USE_NAMESPACES = "namespaces-in-use"  # in the data directory, with the source's suffix: what the children read
LOCAL_BROKER_MARK = "local broker"  # the lock file's second line while its owner runs a broker of its own
STOP_TIMEOUT_S = 10.0  # per child: SIGTERM, then SIGKILL
# With the local broker a worker's clean stop first persists what its partitions hold (COUNTER_PERSIST_DRAIN_S):
# the broker keeps its topics in memory, so writes it acknowledged and no worker persisted would go with it.
LOCAL_BROKER_DRAIN_S = 120.0
LOST_ON_STOP = 1  # the exit status of a clean stop after which the local broker lost writes no worker persisted
# Without a broker a worker's graceful stop only waits for a broker that will not come back (and there is
# nothing left to commit to it): give it less time.
STOP_TIMEOUT_WITHOUT_BROKER_S = 3.0
STYLES = {"info": "green", "warning": "yellow", "error": "bold red"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "up", help="start the embedded default (broker, cache, topics, worker, API) and wait for Ctrl-C",
        description="Start everything one machine needs: the local Tansu broker (unless "
                    "COUNTER_KAFKA_BOOTSTRAP points at Kafka), memcached when installed (otherwise an "
                    "in-process cache), the service topics, one pipeline worker and the HTTP API. Prints the "
                    "endpoints and writes them, with the processes' pids, to <data dir>/endpoints.json. "
                    "A worker, API or memcached that dies is restarted (with backoff); the local broker's "
                    "death stops everything (its topics are in memory). Ctrl-C stops everything cleanly (the "
                    "worker first persists what the local broker still holds), and no child outlives "
                    "`counter up`, even if it is killed. The compiled parts (the worker's Avro readers, the "
                    "API's plain AddCount) are built first when missing or stale.",
        epilog="example: COUNTER_DATA_DIR=/tmp/counter COUNTER_API_PORT=8081 counter up",
    )
    p.add_argument("--data-dir", type=Path, help="override COUNTER_DATA_DIR (default .counter/)")
    add_no_compile(p)
    p.set_defaults(run=run)


class Interrupted(Exception):
    """SIGINT or SIGTERM arrived while starting or stopping: abandon what was under way."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class SignalFlag:
    """Set by a signal handler, waited on by the supervision loop. Not a threading.Event: its set() and wait() take a
    lock, and a handler runs in the main thread between any two bytecodes, so a signal landing while the loop's
    wait (or a previous handler's set) held that lock blocked `counter up` for good (two signals in a row from
    `pkill` and `timeout` did). Here setting is one assignment and waiting a sleep: nothing a handler can block on."""

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float) -> bool:
        """Whether the flag is set, after sleeping `timeout` if it was not (a signal's handler runs during the sleep,
        which then goes on for the rest of `timeout`: a stop is seen within one poll)."""
        if not self._set:
            time.sleep(timeout)
        return self._set


class StopSignals:
    """SIGINT/SIGTERM/SIGHUP. While running they ask the supervision loop to stop; while starting or stopping the
    first one interrupts (a Ctrl-C during a slow start stops at once; a second Ctrl-C while stopping kills
    everything). Any further one is noted, never raised: an exception raised in the middle of handling the last one
    (killing the children, removing the endpoints file) would leave children and a traceback behind."""

    def __init__(self) -> None:
        self.requested = SignalFlag()
        self.received: int | None = None
        self.count = 0  # signals received
        self.interrupting = True  # armed: the next signal raises Interrupted (then disarms)
        self.stop_begun = False
        self.noted = False  # a signal past the one that interrupted the stop was noted on the console

    def install(self) -> None:
        # SIGHUP too: a closed terminal or a dropped ssh session ended `counter up` at once, without the drain (the
        # children, killed with it, lost the acknowledged writes the worker had not read)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._handle)

    def running(self) -> None:
        """Started: from here a signal asks the supervision loop to stop. A signal that came while starting
        interrupts now, even if its Interrupted was lost: Python ignores an exception raised in some places, such
        as the at-fork hooks around a child's start (logging's lock release), and starting then went on."""
        self.interrupting = False
        if self.received is not None:
            raise Interrupted(self.received)

    def stopping(self) -> bool:
        """The stop begins: the next signal interrupts it. False when one beyond the signal that asked for the stop
        came already (the stop should not wait then)."""
        self.stop_begun = True
        self.interrupting = self.count <= (1 if self.received is not None else 0)
        return self.interrupting

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum
        self.count += 1
        self.requested.set()
        if self.interrupting:
            self.interrupting = False  # one Interrupted: the code handling it is never interrupted in turn
            raise Interrupted(signum)
        if self.stop_begun and not self.noted:
            self.noted = True
            # os.write: a print here could re-enter the console's buffered stream in the middle of a write
            os.write(2, f"{signal.Signals(signum).name} received again: stopping already, exiting once the children "
                        "are gone\n".encode())


def run(args: argparse.Namespace) -> int:
    settings = settings_or_exit(data_dir=args.data_dir)
    ns_path, registry = namespaces_or_exit(settings)
    try:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        # held until the end of the stop, or of this process however it ends
        lock = _lock_data_dir(settings.data_dir, settings.endpoints_path)
    except OSError as exc:
        fail(f"data directory {settings.data_dir} (COUNTER_DATA_DIR): {exc.strerror or exc}", code=1)
    in_use, registry = _namespaces_in_use(ns_path, settings.data_dir)
    check_against_namespaces(settings, registry)
    check_api_namespaces(settings, registry, in_process_cache=settings.cache == "memory" or (
        settings.cache == "auto" and find_memcached() is None))
    check_listen(settings.api_host, settings.api_port, "COUNTER_API_HOST", "COUNTER_API_PORT")
    check_listen("127.0.0.1", settings.worker_port, "the worker's host", "COUNTER_WORKER_PORT")
    signals = StopSignals()
    stack = LocalStack(settings.data_dir, {"COUNTER_NAMESPACES": str(in_use)})
    stop_timeout, drain_s, code = STOP_TIMEOUT_S, 0.0, 1
    try:
        signals.install()
        build_native_parts(args)  # before the children start: each loads its build once
        endpoints = _start_or_fail(stack, settings, registry)
        if endpoints is None:
            return code
        endpoints["namespaces"] = str(in_use)  # what `counter worker` joining this stack loads too
        endpoints["namespaces_source"] = str(ns_path.resolve())
        endpoints["api_shared_pipeline"] = settings.api_shared  # whether its API counts another API's writes
        endpoints.update(store=store_location(settings), worker_id=settings.worker_id,  # what joined processes use
                         mutations_topic=settings.mutations_topic, rollups_topic=settings.rollups_topic,
                         dlq_topic=settings.dlq_topic)
        if stack.broker is not None:
            _owned_by(lock, LOCAL_BROKER_MARK)  # from here a death without the stop loses the broker's writes
        drain_s = float(stack.env.get("COUNTER_PERSIST_DRAIN_S", settings.persist_drain_s))
        stop_timeout += drain_s
        signals.running()  # from here a signal is a request to stop, also while printing below
        _write_endpoints(settings, {**endpoints, "processes": stack.pids()})
        _save_shapes(stack, settings)  # as recorded now: kept for the next `counter up`
        console.print(f"[bold green]counter is up[/] (namespaces: {', '.join(registry.names())} from {ns_path}, "
                      "as read now: an edit takes effect at the next `counter up`)", soft_wrap=True)
        for name, value in endpoints.items():
            console.print(f"  {name:16} {value if value is not None else '-'}", soft_wrap=True)
        console.print(f"  processes        {', '.join(f'{k} {v}' for k, v in stack.pids().items())}", soft_wrap=True)
        console.print(f"  endpoints file   {settings.endpoints_path}\nPress Ctrl-C to stop.", soft_wrap=True)
        code = _supervise(stack, settings, endpoints, signals)
        if code != 0:
            stop_timeout = STOP_TIMEOUT_WITHOUT_BROKER_S
    except Interrupted as exc:
        console.print(f"{exc} received while starting")
        code = 128 + exc.signum
    finally:
        _save_shapes(stack, settings)  # with what joined processes recorded since
        lost = _stop(stack, settings, signals, stop_timeout, drain_s)  # from here on no signal raises
        settings.endpoints_path.unlink(missing_ok=True)
        lock.truncate(0)  # stopped: the next `counter up` finds no pid of a run that ended without its stop
        lock.close()  # the directory is free once its endpoints file is gone
        console.print("stopped.")
    # a stop that lost writes the local broker held and no worker persisted is not a clean exit, for a script that
    # checks it: 128 + the signal that forced it (as a shell reports a process a signal ended), or LOST_ON_STOP
    return lost if lost is not None and code == 0 else code


def _save_shapes(stack: LocalStack, settings: Settings) -> None:
    """Save the namespace shapes recorded in `counter up`'s own broker, which keeps nothing across restarts, in the
    data directory: the next one's records them again, so a namespace setting changed in place between two runs is
    refused (streams.namespace_shapes). A broker already gone leaves the last save."""
    if stack.broker is None or not stack.broker.running():
        return
    try:
        save_shapes(settings.model_copy(update={"kafka_bootstrap": stack.broker.bootstrap}),
                    settings.data_dir / SAVED_SHAPES, timeout_s=5.0)
    except Exception as exc:  # a stop must go on: the previous save stands
        console.print(f"[yellow]warning:[/] could not save the namespace shapes: {exc}", highlight=False)


def _namespaces_in_use(source: Path, data_dir: Path) -> tuple[Path, NamespaceRegistry]:
    """A copy of the namespace file in the data directory, validated, which every child reads: a child restarted
    after the file was edited read the edit while the API kept the old one (a typo crash-looped the worker while the
    API answered 200, and a removed namespace dead-lettered acknowledged writes)."""
    copy = data_dir / f"{IN_USE_NAMESPACES}{source.suffix}"
    try:
        for old in data_dir.glob(f"{IN_USE_NAMESPACES}*"):  # a previous run's, maybe of another format
            old.unlink()
        temporary = copy.with_name(copy.name + ".tmp")
        temporary.write_bytes(source.expanduser().read_bytes())
        os.replace(temporary, copy)
    except OSError as exc:
        fail(f"copying the namespace file {source} to {copy}: {exc.strerror or exc}", code=1)
    try:
        return copy, load_namespaces(copy)
    except ConfigError as exc:  # valid a moment ago: edited while this read it
        fail(f"namespace configuration {source} changed while `counter up` read it: {exc.reason}")


def _start_or_fail(stack: LocalStack, settings: Settings, registry: NamespaceRegistry) -> dict[str, object] | None:
    """`_start`, or None once a failure to start is printed. A separate function: a signal while printing one
    interrupts the start as any other (an exception raised in an except clause escapes its try's other clauses)."""
    try:
        return _start(stack, settings, registry)
    except (ServiceError, TopicError, NamespaceChanged) as exc:
        console.print(f"[bold red]error:[/] {exc}", highlight=False)
    except KafkaException as exc:  # COUNTER_KAFKA_BOOTSTRAP given but not answering
        console.print(f"[bold red]error:[/] {kafka_failure(exc, settings.kafka_bootstrap or '?')}", highlight=False)
    return None


def _lock_data_dir(data_dir: Path, endpoints: Path) -> IO[str]:
    """Own the data directory (an exclusive flock on `counter-up.lock`, which the kernel drops when this process
    ends), or exit naming the `counter up` that owns it. Two stacks on one directory would share its stores with
    two brokers whose partitions have the same names: each worker's persist watermark would overwrite the other's,
    so a rollup could pass events the other had not persisted yet, and one stop would remove the other's
    endpoints file. The file holds the owner's pid, and `local broker` once one runs, until its stop ends: found
    with the lock free, it names a run that ended without its stop (kill -9, the machine down), whose local broker
    lost the writes no worker had persisted, and the console says so. So does an `endpoints` file naming a local
    broker, which a stop removes: left by a version from before the lock file held the pid (an upgrade review)."""
    path = data_dir / LOCK_FILE
    handle = open(path, "a+")  # noqa: SIM115  # held open for the life of the process: that is the lock
    handle.seek(0)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = handle.read().split("\n")[0].strip() or "another process"
        handle.close()
        fail(f"{data_dir} is in use by another `counter up` (pid {owner}); stop it, or give this one another "
             "data directory (--data-dir or COUNTER_DATA_DIR)", code=1)
    previous = handle.read().split("\n")
    crashed = previous[0].strip() if previous[1:2] == [LOCAL_BROKER_MARK] else _left_by(endpoints)
    if crashed:
        console.print(f"[yellow]warning:[/] the last `counter up` on {data_dir} (pid {crashed}) ended "
                      "without its stop (killed, or the machine went down): the writes its broker had acknowledged "
                      "and no worker had persisted were lost with that broker. Writes retried with the same "
                      "idempotency tokens within their namespace's accept_limit are counted exactly once; `counter "
                      "audit` shows what a counter holds.", highlight=False, soft_wrap=True)
    _owned_by(handle)
    return handle


def _left_by(endpoints: Path) -> str | None:
    """The pid of the `counter up` whose endpoints file names a local broker (a stop removes the file), or None."""
    try:
        left = json.loads(endpoints.read_text())
        broker = left["processes"]["broker"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return str(left.get("supervisor_pid", "unknown")) if broker is not None else None


def _owned_by(lock: IO[str], *marks: str) -> None:
    """Write this process's pid and `marks` into the lock file, one a line (`_lock_data_dir`)."""
    lock.truncate(0)
    lock.write("\n".join((str(os.getpid()), *marks)) + "\n")
    lock.flush()


def _start(stack: LocalStack, settings: Settings, registry: NamespaceRegistry) -> dict[str, object]:
    """Start the children in dependency order; returns the endpoints to publish."""
    bootstrap = settings.kafka_bootstrap or stack.start_broker()
    stack.env["COUNTER_KAFKA_BOOTSTRAP"] = bootstrap
    if settings.kafka_bootstrap is None and "COUNTER_PERSIST_DRAIN_S" not in os.environ:
        stack.env["COUNTER_PERSIST_DRAIN_S"] = str(LOCAL_BROKER_DRAIN_S)
    memcached = _cache(stack, settings)
    ensure_topics(bootstrap, topic_specs(settings), admin_config=settings.kafka_security.librdkafka())
    bound = settings.model_copy(update={"kafka_bootstrap": bootstrap})
    if stack.broker is not None:  # a new, empty broker: the namespace shapes the last one recorded
        restore_shapes(bound, settings.data_dir / SAVED_SHAPES)
    # here, not only in the children: a refused change stops `counter up` with the reason, not a worker crash loop
    if removed := guard_namespaces(bound, registry):
        console.print(f"[yellow]warning:[/] {removed_warning(removed)}", highlight=False)
    worker = stack.start_worker(port=settings.worker_port)
    api = stack.start_api(port=settings.api_port, host=settings.api_host)
    return {"kafka_bootstrap": bootstrap, "api_url": f"http://{api.address}", "ui_url": f"http://{api.address}/ui/",
            "memcached": memcached, "worker_metrics": f"http://{worker.address}/metrics", "supervisor_pid": os.getpid()}


def _supervise(stack: LocalStack, settings: Settings, endpoints: dict[str, object], signals: StopSignals) -> int:
    """Restart what dies until a signal asks to stop (0) or the broker dies (1)."""
    supervisor = Supervisor(_report, on_change=lambda: _write_endpoints(
        settings, {**endpoints, "processes": stack.pids()}))
    for process in stack.processes:
        if process is stack.broker:
            supervisor.watch(process, restart=False, consequence=BROKER_LOSS)
        else:
            supervisor.watch(process, restart=True)
    lengths = LongPartitionWatch(stack.broker.bootstrap, settings.mutations_topic) if stack.broker else None
    try:
        while not signals.requested.wait(POLL_S):
            if supervisor.tick() is not None:
                return 1
            if lengths is not None and (warning := lengths.poll()):
                console.print(f"[yellow]warning:[/] {warning}", highlight=False)
    finally:
        if lengths is not None:
            lengths.close()
    console.print(f"{signal.Signals(signals.received or signal.SIGINT).name} received")
    return 0


def _stop(stack: LocalStack, settings: Settings, signals: StopSignals, timeout: float, drain_s: float) -> int | None:
    """Stop the children, last started first; a signal meanwhile (or one already there) kills them all instead.
    Returns the exit status of a stop that lost acknowledged writes from the local broker, else None: 128 + the
    signal that forced it, or LOST_ON_STOP when the worker left writes unpersisted (`_check_persisted`)."""
    lost: list[int] = []

    def report(process: ManagedProcess) -> None:
        if process is stack.broker and _check_persisted(stack, settings, drain_s):
            lost.append(LOST_ON_STOP)
        _stopping(stack, process, drain_s)
    try:  # from the first line: a signal may still interrupt what the start left armed
        console.print("stopping...")
        if signals.stopping():
            try:
                stack.stop(timeout, report=report)
            finally:
                signals.interrupting = False
            return lost[0] if lost else None
        forcing = signals.received or signal.SIGINT
        why = f"{signal.Signals(forcing).name} received again: killing everything"
    except Interrupted as exc:
        forcing, why = exc.signum, f"{exc} received while stopping: killing everything"
    except ServiceError as exc:
        console.print(f"[bold red]error:[/] {exc}", highlight=False)
        stack.kill()
        return None
    return 128 + int(forcing) if _kill(stack, why) else None


def _check_persisted(stack: LocalStack, settings: Settings, drain_s: float) -> bool:
    """Before the local broker stops, with the workers gone: say how many acknowledged writes no worker persisted
    (they go with the broker), and return whether there were any. A worker that could not persist them within its
    drain (a store locked by another process, a full disk) left with only a line in its log."""
    if stack.broker is None or not stack.broker.running() or not stack.workers:
        return False
    try:
        left = unpersisted(stack.broker.bootstrap, settings.mutations_topic, f"{settings.worker_id}.persist")
    except Exception as exc:  # the broker not answering: nothing to say either way
        console.print(f"[yellow]warning:[/] could not check that the worker persisted every write: {exc}",
                      highlight=False, soft_wrap=True)
        return False
    if not left:
        return False
    about = "" if left.complete else "about "
    logs = ", ".join(str(w.log_path) for w in stack.workers)
    console.print(f"[bold red]error:[/] {about}{left.writes:,} acknowledged write(s) ({about}{left.records:,} "
                  f"record(s)) were not persisted and are lost with the local broker: counter up's worker did not "
                  f"persist them within its drain (COUNTER_PERSIST_DRAIN_S={drain_s:g} s; its log says why: "
                  f"{logs}), or a worker that joined this stack (`counter worker`) held their partitions, which "
                  "this drain does not cover (stop joined workers before counter up). After the next `counter up`, "
                  "writes retried with the same idempotency tokens are counted exactly once.",
                  highlight=False, soft_wrap=True)
    return True


def _kill(stack: LocalStack, why: str) -> bool:
    """Kill every child at once; says what a local broker's writes not yet persisted become, and returns whether
    there may have been some (a local broker and a worker both running)."""
    lost = stack.broker is not None and stack.broker.running() and any(w.running() for w in stack.workers)
    console.print(why + (" (the writes the worker had not persisted yet are lost with the local broker)" if lost
                         else ""), highlight=False, soft_wrap=True)
    stack.kill()
    return lost


def _stopping(stack: LocalStack, process: ManagedProcess, drain_s: float) -> None:
    """Which child is being stopped, and for a worker draining the local broker, what it waits for."""
    why = ""
    if process in stack.workers and drain_s > 0 and stack.broker is not None:
        why = (f": it first persists the writes the local broker still holds (up to {drain_s:g} s); Ctrl-C again "
               "kills everything now, and loses them")
    console.print(f"  stopping {process.name} (pid {process.pid}){why}", highlight=False, soft_wrap=True)


def _report(level: str, message: str) -> None:
    """A supervision event on the console; child log lines are printed verbatim, never as markup."""
    console.print(f"{time.strftime('%H:%M:%S')} {message}", style=STYLES.get(level), markup=False,
                  highlight=False, soft_wrap=True)


def _cache(stack: LocalStack, settings: Settings) -> str | None:
    """memcached address to use, or None for the in-process cache."""
    if settings.cache.startswith("memcached://"):
        stack.env["COUNTER_CACHE"] = settings.cache
        return settings.cache.removeprefix("memcached://")
    if settings.cache == "memory" or find_memcached() is None:
        if settings.cache == "auto":
            console.print("memcached is not installed: using the in-process cache "
                          "(apt-get install memcached for a shared one)")
        stack.env["COUNTER_CACHE"] = "memory"
        return None
    return stack.start_memcached()


def _write_endpoints(settings: Settings, endpoints: dict[str, object]) -> None:
    """Replace the file atomically: a reader sees the old or the new content, never half of one."""
    tmp = settings.endpoints_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(endpoints, indent=2) + "\n")
    os.replace(tmp, settings.endpoints_path)
