"""Helpers the verbs share: settings, namespaces and endpoints, each failing with a one-line reason."""

from __future__ import annotations

import argparse
import errno
import json
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from confluent_kafka import KafkaError, KafkaException
from rich.console import Console
from rich.text import Text

from control_plane import ConfigError, NamespaceRegistry, default_config_path, load_namespaces
from infra.native import BuildOutcome, ensure_native_builds
from sinks import ROLLUPS_FILE, sqlite_directory
from sinks.cassandra.config import CassandraUrlError, masked_url, parse_cassandra_url
from sinks.factory import store_location as sinks_store_location
from streams.settings import (
    Settings,
    SettingsError,
    api_start_problems,
    backend_problems,
    load_settings,
    namespace_bound_problems,
)

console = Console(stderr=True)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print `error: message` and exit. The message is plain text (a `[...]` in it is not markup) and is never
    wrapped, so the paths and values it names can be copied and searched for."""
    console.print(Text.assemble(("error:", "bold red"), " ", message), soft_wrap=True)
    sys.exit(code)


def settings_or_exit(**overrides: Any) -> Settings:
    """COUNTER_* read and checked, or exit naming the variable. A cassandra:// store URL is parsed whole here, by the
    parser that opens the store (its options, one port for all hosts): `streams.settings` checks only its shape, as
    it may not import `sinks`, and a URL it passed failed the API's start with a traceback (a review)."""
    try:
        settings = load_settings(**{k: v for k, v in overrides.items() if v is not None})
    except SettingsError as exc:
        fail(str(exc))
    if settings.store.startswith("cassandra://"):
        try:
            parse_cassandra_url(settings.store)
        except CassandraUrlError as exc:
            fail(f"invalid settings: COUNTER_STORE: {exc} (got {masked_url(settings.store)!r})")
    return settings


def namespaces_or_exit(settings: Settings) -> tuple[Path, NamespaceRegistry]:
    """The namespace file and its registry; a bad one fails naming where it came from (the error names the file)."""
    path = settings.namespaces or default_config_path()
    source = "COUNTER_NAMESPACES" if settings.namespaces else "the shipped example: COUNTER_NAMESPACES is unset"
    try:
        return path, load_namespaces(path)
    except ConfigError as exc:
        fail(f"namespace configuration ({source}): {exc}")


def check_against_namespaces(settings: Settings, registry: NamespaceRegistry) -> None:
    """Fail on a namespace's store the deployment does not run (streams.settings.backend_problems) and on settings
    the namespaces' rollup window would lower (namespace_bound_problems), rather than start a worker that silently
    uses other values."""
    problems = backend_problems(settings, registry.values()) + namespace_bound_problems(settings, registry.values())
    if problems:
        fail("invalid settings: " + "; ".join(problems))


def check_api_namespaces(settings: Settings, registry: NamespaceRegistry, *,
                         in_process_cache: bool | None = None) -> None:
    """Fail on what the API needs of the namespaces before it starts: every API key's environment variable, and a
    shared cache for BEST_EFFORT counts when API processes share the pipeline (`in_process_cache`: whether the
    API's cache will be the in-process one; default: unless COUNTER_CACHE names a memcached)."""
    if in_process_cache is None:
        in_process_cache = not settings.cache.startswith("memcached://")
    if problems := api_start_problems(settings, registry, in_process_cache=in_process_cache):
        fail("; ".join(problems))


def check_listen(host: str, port: int, host_source: str, port_source: str) -> None:
    """Fail (exit 1) unless a server can listen on host:port now, saying why and naming the setting at fault: a host
    that does not resolve or is no address of this machine, a port in use (the children's readiness check only asks
    whether something answers there, so a port another server holds reads as a child that is up)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as exc:
        fail(f"{host_source}={host!r} does not resolve ({getattr(exc, 'strerror', None) or exc}): set it to an "
             "address of this machine, e.g. 127.0.0.1, or 0.0.0.0 for all", code=1)
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                fail(f"port {port} is in use ({port_source}): another `counter up` or server holds it; set "
                     f"{port_source} to a free port, or 0 for any", code=1)
            if exc.errno == errno.EADDRNOTAVAIL:
                fail(f"{host_source}={host!r} is not an address of this machine: set it to one, e.g. 127.0.0.1, or "
                     "0.0.0.0 for all", code=1)
            fail(f"cannot listen on {host} port {port} ({host_source}, {port_source}): {exc.strerror or exc}", code=1)


def read_endpoints(settings: Settings) -> dict[str, Any]:
    """Endpoints written by a running `counter up`, or {} when there is none: also when the file outlived it (a kill
    -9, a power loss), which would point the other commands at a broker that is gone."""
    try:
        endpoints = json.loads(settings.endpoints_path.read_text())
    except (OSError, ValueError):
        return {}
    pid = endpoints.get("supervisor_pid") if isinstance(endpoints, dict) else None
    if not isinstance(endpoints, dict) or (isinstance(pid, int) and not alive(pid)):
        return {}
    return endpoints


def alive(pid: int) -> bool:
    """Whether a process with this pid exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


def joined_stack(settings: Settings, endpoints: dict[str, Any] | None = None) -> dict[str, str]:
    """The settings a process joining a running `counter up` (its endpoints file) takes from it, as overrides: the
    cache its API reads, since a worker rolling counters up without it leaves the API's cached counts as they were
    (a review read 0 for 7, indefinitely) and another API would count BEST_EFFORT writes apart (5 and 7 of 12), and
    its namespace file, since a worker without a namespace dead-letters its acknowledged writes and a replay or a
    recount would judge them by the shipped example's; and its store, consumer group and topics (JOINED_MISMATCH
    says what each would break: a review's joined worker with another COUNTER_STORE persisted 214 of 912
    acknowledged writes where no count reads them). Any of them set to something else fails, naming both."""
    endpoints = read_endpoints(settings) if endpoints is None else endpoints
    if not endpoints:
        return {}
    shared: dict[str, str] = {}
    memcached = endpoints.get("memcached")
    cache = f"memcached://{memcached}" if memcached else "memory"
    if "cache" not in settings.model_fields_set or settings.cache == "auto":
        shared["cache"] = cache
    elif settings.cache.rstrip("/") != cache:
        fail(f"COUNTER_CACHE={settings.cache}, but the running `counter up`'s API reads {cache}: a process joining it "
             "must use the cache the API reads (a worker's rollups would not reach it, an API's BEST_EFFORT counts "
             "would be counted apart); unset COUNTER_CACHE to use counter up's")
    namespaces = endpoints.get("namespaces")
    if isinstance(namespaces, str):
        if settings.namespaces is None:
            shared["namespaces"] = namespaces
        elif not _same_file(settings.namespaces, Path(namespaces)):
            fail(f"COUNTER_NAMESPACES={settings.namespaces}, but the running `counter up` uses {namespaces} (its "
                 "namespace file as it read it at its start: an edit takes effect when it starts again): processes "
                 "of one deployment need the same namespaces (a worker without a namespace dead-letters its "
                 "writes); unset COUNTER_NAMESPACES to use counter up's")
    for name, recorded in _deployment(endpoints).items():
        mine = store_location(settings) if name == "store" else getattr(settings, name)
        if mine == recorded:
            continue
        masked = name == "store" and not recorded.startswith("sqlite://")  # recorded without its password
        if name not in settings.model_fields_set and not masked:
            shared[name] = recorded
            continue
        given = masked_url(settings.store) if name == "store" else getattr(settings, name)
        fix = "set COUNTER_STORE to counter up's, with its password" if masked else \
            f"unset COUNTER_{name.upper()} to use counter up's"
        fail(f"COUNTER_{name.upper()}={given}, but the running `counter up` uses {recorded}: "
             f"{JOINED_MISMATCH[name]}; {fix}")
    return shared


JOINED_MISMATCH = {  # why a process joining a running `counter up` must use its value of each setting
    "store": "a worker would persist its share of the writes into a store no API reads (lost to every count) and "
             "an API would answer from it",
    "worker_id": "a worker would form a second consumer group that counts the topic again, and an API's "
                 "AddAndGetCount would wait for a group no worker is in",
    "mutations_topic": "an API would send writes no worker reads, and a worker would read none of the API's",
    "rollups_topic": "a worker's rollup signals would reach no other worker",
    "dlq_topic": "`counter dlq` would not find what this process dead-letters",
}


def _deployment(endpoints: dict[str, Any]) -> dict[str, str]:
    """The settings a running `counter up` recorded for the processes joining it (JOINED_MISMATCH's), as given."""
    return {name: value for name in JOINED_MISMATCH if isinstance(value := endpoints.get(name), str)}


def store_location(settings: Settings) -> str:
    """The store the settings open, as a URL that names it wherever it is read (`sinks.store_location`)."""
    return sinks_store_location(settings.store, settings.data_dir)


def stack_settings_or_exit(**overrides: Any) -> Settings:
    """`settings_or_exit` for a verb that works with a running `counter up`, if there is one: with its cache and
    namespace file (`joined_stack`)."""
    settings = settings_or_exit(**overrides)
    shared = joined_stack(settings)
    return settings_or_exit(**overrides, **shared) if shared else settings


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or a.read_bytes() == b.read_bytes()
    except OSError:
        return False


def member_bootstrap(settings: Settings, explicit: str | None, endpoints: dict[str, Any]) -> str:
    """`resolve_bootstrap` for a worker or an API joining a running `counter up` (its `endpoints`): another broker
    is refused. Its topics would be other partitions with the same numbers, whose watermarks would overwrite the
    stack's in the shared store, and a rollup could pass writes the stack's worker had not persisted."""
    bootstrap = resolve_bootstrap(settings, explicit)
    stack = endpoints.get("kafka_bootstrap")
    if isinstance(stack, str) and _brokers(bootstrap) != _brokers(stack):
        given = "--bootstrap" if explicit else "COUNTER_KAFKA_BOOTSTRAP"
        fail(f"{given}={bootstrap}, but the running `counter up` in this data directory uses the broker {stack}: a "
             "worker or API joining it must use its broker (another broker's partitions would overwrite its "
             f"watermarks in the shared store); leave out {given}, or give this process its own COUNTER_DATA_DIR")
    return bootstrap


def _brokers(bootstrap: str) -> set[str]:
    return {part.strip().lower().split("://")[-1] for part in bootstrap.split(",") if part.strip()}


def resolve_bootstrap(settings: Settings, explicit: str | None) -> str:
    """--bootstrap, else COUNTER_KAFKA_BOOTSTRAP, else the broker of a running `counter up`."""
    bootstrap = explicit or settings.kafka_bootstrap or read_endpoints(settings).get("kafka_bootstrap")
    if not bootstrap:
        fail("no Kafka broker: pass --bootstrap, set COUNTER_KAFKA_BOOTSTRAP, or start one with `counter up` "
             f"(its endpoints are read from {settings.endpoints_path})")
    return bootstrap


def kafka_failure(exc: KafkaException, bootstrap: str) -> str:
    """A failing broker in one line: the client's own message (not the KafkaError repr) and where it was."""
    err = exc.args[0] if exc.args else None
    text = err.str() if isinstance(err, KafkaError) else str(exc)
    return f"Kafka at {bootstrap}: {text} (is the broker running? `counter up` starts one)"


def existing_store_or_fail(settings: Settings, also: str = "") -> None:
    """Refuse a SQLite directory that holds no store: a mistyped --data-dir became an empty store, which the job then
    read or wrote, and exited 0 (a review). `also`: what else to say."""
    directory = sqlite_directory(settings.store, settings.data_dir)
    if directory is not None and not (directory / ROLLUPS_FILE).exists():
        fail(f"no store in {directory} (no {ROLLUPS_FILE}; nothing was created): check --data-dir, COUNTER_DATA_DIR "
             f"and COUNTER_STORE{also}")


def job_settings(bootstrap: str, data_dir: Path | None) -> Settings:
    """Settings for a job that needs the broker: COUNTER_* with the resolved bootstrap (SettingsError if bad)."""
    overrides: dict[str, Any] = {"kafka_bootstrap": bootstrap}
    if data_dir is not None:
        overrides["data_dir"] = data_dir
    settings = load_settings(**overrides)
    shared = joined_stack(settings)  # a running `counter up`'s cache and namespaces
    return load_settings(**overrides, **shared) if shared else settings


def add_no_compile(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-compile", action="store_true",
                   help="do not build the compiled parts that are missing or stale (the Python code then runs, "
                        "slower); by default they are built first, which takes a few seconds the first time")


def build_native_parts(args: argparse.Namespace) -> None:
    """Build the compiled parts the processes about to start load (infra.native), unless --no-compile; a part
    that cannot be built is reported and its Python code runs."""
    if not args.no_compile:
        ensure_native_builds(_report_build)


def _report_build(outcome: BuildOutcome) -> None:
    if not outcome.ok:
        console.print(Text.assemble(("warning:", "yellow"), " ", outcome.summary), soft_wrap=True)
    elif outcome.message:  # built now (a current build prints nothing)
        console.print(outcome.summary, soft_wrap=True, highlight=False)


def add_verb(sub: argparse._SubParsersAction, name: str, *, help: str, description: str, epilog: str,
             add_arguments: Callable[[argparse.ArgumentParser], None],
             run: Callable[[argparse.Namespace], int]) -> None:
    """Register a verb whose arguments are added by `add_arguments` (a function tests can reuse)."""
    p = sub.add_parser(name, help=help, description=description, epilog=epilog,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(run=run)
