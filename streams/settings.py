"""Service-wide settings from the environment (COUNTER_*), validated at start-up.

A bad value stops start-up with a message naming the environment variable, never a stack trace later.
"""

from __future__ import annotations

import difflib
import ipaddress
import logging
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, SecretStr, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from control_plane import CounterType, Namespace, NamespaceRegistry
from streams.kafka_security import PROTOCOLS, SASL_MECHANISMS, KafkaSecurity

ENV_PREFIX = "COUNTER_"
HOUR_S, HOUR_MS = 3600, 3_600_000
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
# Kafka's legal topic names (and Faust derives its own topics and the group from the worker id).
_KAFKA_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
STORES_SUFFIX = "-stores"  # the store bindings topic: <mutations topic>-stores (streams.store_binding)
# A host name's labels (RFC 1123; '_' too, which container and compose names use and their resolvers answer).
_HOST_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
# The shape of a cassandra:// store URL (sinks.cassandra.config parses it whole when the store opens; sinks is not
# importable here): hosts, then a keyspace as Cassandra names them, then options.
_CASSANDRA_URL = re.compile(r"cassandra://(?:[^@/?#]*@)?(?P<hosts>[^@/?#]*)(?:/(?P<keyspace>[^?#]*))?(?:\?[^#]*)?")
_KEYSPACE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,47}")


log = logging.getLogger(__name__)


class SettingsError(ValueError):
    """A COUNTER_* setting is invalid; the message names the variable."""


class Settings(BaseSettings):
    """Where the broker, store, cache and namespace file are, and how topics are shaped."""

    # No inf/nan: "inf" as an interval would never fire, and 1e400 parses as inf.
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True, allow_inf_nan=False)

    kafka_bootstrap: str | None = Field(
        None, description="host:port[,host:port] of the Kafka cluster; unset = start the local Tansu broker")
    kafka_security_protocol: str = Field("PLAINTEXT", description=(
        f"how every Kafka client connects: one of {', '.join(PROTOCOLS)} (streams.kafka_security)"))
    kafka_sasl_mechanism: str | None = Field(None, description=f"with SASL_*: one of {', '.join(SASL_MECHANISMS)}")
    kafka_sasl_username: str | None = Field(None, min_length=1, description="with SASL_*")
    kafka_sasl_password: SecretStr | None = Field(None, description="with SASL_*")
    kafka_ssl_ca_file: Path | None = Field(None, description="with SSL or SASL_SSL: CA certificates (PEM) to trust; "
                                           "unset: the system's")
    kafka_ssl_cert_file: Path | None = Field(None, description="mutual TLS: this client's certificate (PEM)")
    kafka_ssl_key_file: Path | None = Field(None, description="mutual TLS: its private key (PEM)")
    store: str = Field("sqlite", description="'sqlite', 'sqlite:///path/to/dir' or 'cassandra://h1,h2:9042/ks?dc=..'")
    cache: str = Field("auto", description="'auto' (local memcached if installed), 'memory' or 'memcached://host:port'")
    namespaces: Path | None = Field(None, description="namespace configuration file (YAML or JSON)")
    data_dir: Path = Field(Path(".counter"), description="SQLite files, endpoints.json and logs")
    api_host: str = Field("127.0.0.1", min_length=1, description=(
        "the API's listen address: an IP address or a host name (checked for shape here; `counter up` and `counter "
        "api` check that it resolves to an address of this machine before they start the API)"))
    api_port: int = Field(8080, ge=0, le=65535)
    api_workers: int = Field(1, ge=1, le=64, description="API processes sharing the port (one per core)")
    api_shared_pipeline: bool | None = Field(None, description=(
        "other API processes write to the same mutations topic (api_workers above 1, or instances on other hosts): "
        "AddAndGetCount then waits until the worker has persisted every write acknowledged before it, by any of "
        "them; unset: true exactly when api_workers is above 1"))
    api_keep_alive_s: float = Field(5.0, gt=0, le=HOUR_S, description=(
        "an idle HTTP keep-alive connection is closed after this"))
    api_group_commit_hold_ms: float = Field(2.0, ge=0, le=1000, description=(
        "at most this long (and at most two recent acknowledgement times, and only while requests keep coming) the API "
        "holds its next group-commit record while the clients the last acknowledgement answered have not sent their "
        "next writes, so that one record carries them all (producers.cohort_hold; holds that keep giving up switch "
        "holding off until one completes); 0: never"))
    worker_port: int = Field(6066, ge=0, le=65535, description="worker web port (Prometheus /metrics)")
    mutations_topic: str = "counter-mutations"
    rollups_topic: str = "counter-rollups"
    dlq_topic: str = "counter-mutations-dlq"
    mutations_partitions: int = Field(8, ge=1, le=10_000)
    rollups_partitions: int = Field(8, ge=1, le=10_000)
    dlq_partitions: int = Field(1, ge=1, le=10_000)
    replication_factor: int | None = Field(None, ge=1, le=15, description=(
        "replicas of each topic the service creates; unset: the broker's default.replication.factor (a single "
        "replica loses acknowledged writes with its broker, and fails every write where min.insync.replicas is "
        "above it)"))
    mutations_retention_ms: int = Field(7 * 24 * HOUR_MS, ge=-1, le=100 * 365 * 24 * HOUR_MS, description=(
        "Kafka retention of the mutations topic: -1 (forever) or at least an hour (a worker down longer loses "
        "writes; seconds given as ms land below it)"))
    worker_id: str = Field("counter-worker", description=(
        "Faust app id = consumer group of all workers; also the rollup cache's key prefix (one per deployment)"))
    worker_log_level: str = Field("warning", description=f"one of {', '.join(LOG_LEVELS)}")
    group_session_timeout_s: float = Field(10.0, ge=1, le=1800, description=(
        "consumer group session timeout (a broker refuses more than its group.max.session.timeout.ms, 30 min)"))
    group_rebalance_timeout_s: float = Field(5.0, ge=1, le=HOUR_S, description=(
        "how long a rebalance waits for members to rejoin (Tansu waits all of it before completing a join, so keep "
        "it short)"))
    persist_batch_max: int = Field(20_000, ge=1, le=1_000_000, description=(
        "records per persist batch at most (one transaction); a client-side batched record carries up to hundreds "
        "of mutations"))
    persist_batch_bytes: int = Field(8 << 20, ge=1024, le=1 << 30, description=(
        "record bytes per persist batch at most"))
    persist_checkpoint_ms: int = Field(250, ge=1, le=HOUR_MS, description=(
        "how often the counters persisted batches touched are signalled for rollup and the batches' offsets "
        "committed (at most half the shortest coalesce_ms)"))
    persist_batch_within_ms: int = Field(200, ge=1, le=HOUR_MS, description=(
        "longest wait for records before a persist batch goes with what it has (the broker's fetch wait; the local "
        "broker answers a waiting fetch only when it times out): while ACCURATE writes arrive, whose reads add the "
        "persisted events live, and when idle"))
    persist_eventual_within_ms: int = Field(1000, ge=1, le=HOUR_MS, description=(
        "the same wait while only EVENTUAL writes arrive, whose reads come from rollups that wait out coalesce_ms "
        "anyway: at most half the worker's rollup window (the shortest coalesce_ms), never below "
        "persist_batch_within_ms; longer gathers larger batches (less CPU per write)"))
    persist_prompt_within_ms: int = Field(10, ge=1, le=HOUR_MS, description=(
        "the same wait while read-your-write writes arrive (AddAndGetCount with dimensions or items): it bounds "
        "their persist latency"))
    persist_prompt_for_s: float = Field(2.0, ge=0, le=HOUR_S, description=(
        "how long the persist consumer keeps the wait that records asked for (read-your-write, ACCURATE, EVENTUAL) "
        "after the last of them"))
    persist_fetch_min_bytes: int = Field(1, ge=1, le=100_000_000, description=(
        "the broker answers a persist fetch once it holds this many bytes, or after the fetch's wait; the persist "
        "consumer paces its fetches itself (at most one per wait), so 1 answers a paced fetch at once"))
    persist_drain_s: float = Field(0.0, ge=0, le=HOUR_S, description=(
        "on a clean stop, how long the worker keeps persisting the records its partitions held when the stop began "
        "before it leaves (0: it leaves them to the next owner, as Kafka keeps them); `counter up` sets 120 for its "
        "local broker, which keeps topics in memory only"))
    watermark_interval_ms: int = Field(250, ge=10, le=HOUR_MS, description=(
        "how often the persist watermark is refreshed"))
    watermark_idle_interval_ms: int = Field(2000, ge=10, le=HOUR_MS, description=(
        "how often heartbeats go down the mutations partitions once only heartbeats were persisted for that long "
        "(a local broker's fetches cost by the length of the partitions they read); only as far as the rollup "
        "window hides it: at most half of coalesce_ms - accept_limit - max_clock_skew, never below "
        "watermark_interval_ms; none once the watermark covers every write"))
    sweep_interval_s: float = Field(5.0, gt=0, le=HOUR_S, description="how often stale counters are re-signalled")
    accept_namespace_changes: Annotated[tuple[str, ...], NoDecode] = Field((), description=(
        "namespaces (comma-separated) whose configuration may change in place what their stored data means "
        "(counter_type's kind, aggregation, a window granularity kept again): recorded as changed on purpose "
        "(streams.namespace_shapes)"))
    store_binding_check_s: float = Field(30.0, ge=1, le=HOUR_S, description=(
        "how often a running worker or API reads again which store its consumer group persists into (`counter store "
        "rebind`): a worker on another store stops, an API fails /readyz"))
    read_signal_lag_s: float = Field(5.0, ge=0, le=24 * HOUR_S, description=(
        "a GetCount signals a rollup when the counter's rollup lags the newest possible boundary by more than this "
        "(0: every read signals, throttled to 1/s per counter)"))
    retention_interval_s: float = Field(300.0, gt=0, le=24 * HOUR_S, description=(
        "how often expired, rolled-up slices are dropped"))
    rollup_max_signals: int = Field(50_000, ge=1, le=10_000_000, description=(
        "signals coalesced at most per rollup window"))
    rollup_set_budget_s: float | None = Field(None, gt=0, le=HOUR_S, description=(
        "how long a worker rolls up one coalesced set of signals before it signals the rest of the set again, behind "
        "the signals that came meanwhile: a burst of one namespace's new counters then holds another namespace's "
        "rollups back by about this and a rollup window, not by the whole burst. Unset: 4 rollup windows (the "
        "shortest coalesce_ms), at least 5 s; each set waits out a window first, so a budget of one window halves "
        "a burst's rollup rate"))
    rollup_batch_max: int = Field(512, ge=1, le=10_000, description=(
        "a namespace with more than 8 batches of its rollup_batch_count in one coalesced set is rolled up in about 8 "
        "larger batches, up to this or rollup_batch_count, whichever is greater: a batch costs a few store round "
        "trips whatever its size"))

    @field_validator("accept_namespace_changes", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        """`a,b` from the environment (pydantic-settings would read a tuple as JSON)."""
        if isinstance(value, str):
            return tuple(name.strip() for name in value.split(",") if name.strip())
        return value

    @field_validator("api_shared_pipeline")
    @classmethod
    def _shared_with_workers(cls, value: bool | None, info: ValidationInfo) -> bool | None:
        """Several API processes on one port always share the pipeline: false would let AddAndGetCount miss a write
        acknowledged by a sibling process."""
        if value is False and info.data.get("api_workers", 1) > 1:
            raise ValueError(f"cannot be false with COUNTER_API_WORKERS={info.data['api_workers']}: those "
                             "processes share the pipeline")
        return value

    @field_validator("api_host")
    @classmethod
    def _listen_host(cls, value: str) -> str:
        host = check_host(value.strip())
        if host.startswith("["):  # a URL's form of an IPv6 address: the server binds the address itself
            raise ValueError(f"an IPv6 address is written without brackets here, e.g. {host[1:-1]!r}")
        return host

    @field_validator("kafka_bootstrap")
    @classmethod
    def _bootstrap_hosts(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        _check_host_ports(value, "host:port[,host:port]")
        return ",".join(_listener_host(part.strip()) for part in value.split(","))

    @field_validator("mutations_retention_ms")
    @classmethod
    def _retention_ms(cls, value: int) -> int:
        if value == -1 or value >= HOUR_MS:
            return value
        raise ValueError(f"expected -1 (keep forever) or at least {HOUR_MS} (an hour, in milliseconds)")

    @field_validator("worker_log_level")
    @classmethod
    def _log_level(cls, value: str) -> str:
        if value.strip().lower() in LOG_LEVELS:
            return value.strip().lower()
        raise ValueError(f"expected one of {', '.join(LOG_LEVELS)}")

    @field_validator("kafka_security_protocol", "kafka_sasl_mechanism")
    @classmethod
    def _one_of(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        allowed = PROTOCOLS if info.field_name == "kafka_security_protocol" else SASL_MECHANISMS
        if value.strip().upper() not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}")
        return value.strip().upper()

    @field_validator("kafka_ssl_ca_file", "kafka_ssl_cert_file", "kafka_ssl_key_file")
    @classmethod
    def _readable(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"{value} is not a readable file")
        return value

    @model_validator(mode="after")
    def _security_complete(self) -> Settings:
        """SASL needs its mechanism and credentials; TLS files only mean something with TLS, a certificate needs its
        key; and nothing half-set is silently ignored."""
        sasl = self.kafka_security_protocol.startswith("SASL_")
        tls = self.kafka_security_protocol in ("SSL", "SASL_SSL")
        problems = []
        for name in ("kafka_sasl_mechanism", "kafka_sasl_username", "kafka_sasl_password"):
            if sasl and getattr(self, name) is None:
                problems.append(f"{ENV_PREFIX}{name.upper()}: required with "
                                f"COUNTER_KAFKA_SECURITY_PROTOCOL={self.kafka_security_protocol}")
            elif not sasl and getattr(self, name) is not None:
                problems.append(f"{ENV_PREFIX}{name.upper()}: set, but COUNTER_KAFKA_SECURITY_PROTOCOL="
                                f"{self.kafka_security_protocol} uses no SASL (SASL_PLAINTEXT or SASL_SSL)")
        for name in ("kafka_ssl_ca_file", "kafka_ssl_cert_file", "kafka_ssl_key_file"):
            if not tls and getattr(self, name) is not None:
                problems.append(f"{ENV_PREFIX}{name.upper()}: set, but COUNTER_KAFKA_SECURITY_PROTOCOL="
                                f"{self.kafka_security_protocol} uses no TLS (SSL or SASL_SSL)")
        if (self.kafka_ssl_cert_file is None) != (self.kafka_ssl_key_file is None):
            problems.append("COUNTER_KAFKA_SSL_CERT_FILE and COUNTER_KAFKA_SSL_KEY_FILE: give both (mutual TLS) or "
                            "neither")
        if problems:
            raise ValueError("; ".join(problems))  # each names its variable (load_settings)
        return self

    @property
    def kafka_security(self) -> KafkaSecurity:
        """The Kafka clients' security settings (streams.kafka_security)."""
        return KafkaSecurity(self.kafka_security_protocol, self.kafka_sasl_mechanism, self.kafka_sasl_username,
                             self.kafka_sasl_password.get_secret_value() if self.kafka_sasl_password else None,
                             self.kafka_ssl_ca_file, self.kafka_ssl_cert_file, self.kafka_ssl_key_file)

    @field_validator("mutations_topic", "rollups_topic", "dlq_topic", "worker_id")
    @classmethod
    def _kafka_name(cls, value: str, info: ValidationInfo) -> str:
        """Kafka refuses other topic names only when the topic is created; Faust names topics after the worker id.
        The three topics are three: one named twice failed at start-up with a broker protocol error naming no
        variable (a review), and on a cluster where it exists would mix signals or dead letters into mutations."""
        if not _KAFKA_NAME.fullmatch(value) or value in (".", ".."):
            raise ValueError("expected 1-249 of A-Z a-z 0-9 . _ - (Kafka's legal topic and group names)")
        if info.field_name == "mutations_topic" and len(value) > 249 - len(STORES_SUFFIX):
            raise ValueError(f"expected at most {249 - len(STORES_SUFFIX)} characters: the store bindings topic is "
                             f"named after it (<name>{STORES_SUFFIX}, 249 at most)")
        if info.field_name != "worker_id":
            for other in ("mutations_topic", "rollups_topic"):
                if other != info.field_name and info.data.get(other) == value:
                    raise ValueError(f"is also {ENV_PREFIX}{other.upper()}: the service's three topics must differ")
            if info.field_name != "mutations_topic" and info.data.get("mutations_topic", "") + STORES_SUFFIX == value:
                raise ValueError(f"is the store bindings topic of {ENV_PREFIX}MUTATIONS_TOPIC (<name>{STORES_SUFFIX})")
        return value

    @field_validator("store")
    @classmethod
    def _store_scheme(cls, value: str) -> str:
        """The store URL's shape: the worker and the API open the store only once the broker and memcached are up,
        so a URL that cannot name a store must stop start-up here. (Its options are checked when it is opened.)"""
        if value.startswith("sqlite://") and not value.removeprefix("sqlite://").startswith("/"):
            raise ValueError("expected 'sqlite:///absolute/dir' (three slashes)")
        if value == "sqlite" or value.startswith("sqlite://"):
            return value
        if value.startswith("cassandra://"):
            _check_cassandra_url(value)
            return value
        raise ValueError("expected 'sqlite', 'sqlite:///dir' or 'cassandra://hosts/keyspace'")

    @field_validator("cache")
    @classmethod
    def _cache_scheme(cls, value: str) -> str:
        if value in ("auto", "memory"):
            return value
        if value.startswith("memcached://"):
            _check_host_ports(value.removeprefix("memcached://").rstrip("/"), "memcached://host:port[,host:port]")
            return value
        raise ValueError("expected 'auto', 'memory' or 'memcached://host:port'")

    @property
    def api_shared(self) -> bool:
        """Whether other API processes write to the same pipeline (`api_shared_pipeline`, else api_workers > 1)."""
        return self.api_workers > 1 if self.api_shared_pipeline is None else self.api_shared_pipeline

    @property
    def stores_topic(self) -> str:
        """Where the consumer group's store binding is kept (streams.store_binding), named after the mutations topic."""
        return self.mutations_topic + STORES_SUFFIX

    @property
    def endpoints_path(self) -> Path:
        return self.data_dir / "endpoints.json"


def check_host(host: str) -> str:
    """`host` if it is an IP address or a well-formed host name, else ValueError saying what is wrong with it (a
    dotted-number that is no IPv4 address, such as 999.1.1.1, is taken for neither). Whether a name resolves is
    not asked here: settings are read by every command, most of which never use the host."""
    if not host:
        raise ValueError("expected an IP address or a host name, got an empty one")
    if host.startswith("[") or host.endswith("]"):  # a URL's form of an IPv6 address: both brackets, an address inside
        try:
            if host.startswith("[") and host.endswith("]"):
                ipaddress.IPv6Address(host[1:-1])
                return host
        except ValueError:
            pass
        raise ValueError(f"{host!r} is no IPv6 address in brackets (e.g. '[::1]')")
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    name = host.removesuffix(".")
    labels = name.split(".")
    if all(label.isdigit() for label in labels):
        raise ValueError(f"{host!r} is not an IP address (an IPv4 address is four numbers from 0 to 255)")
    if len(name) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in labels) or labels[-1].isdigit():
        raise ValueError(f"{host!r} is neither an IP address nor a host name (labels of 1-63 letters, digits, "
                         "'-' or '_', separated by dots)")
    return host


def _listener_host(part: str) -> str:
    """``host:port`` of a bootstrap server given in librdkafka's listener form, ``PLAINTEXT://host:port``: Faust and
    aiokafka take host:port only (the worker died on ``PLAINTEXT://``, a review). The protocol is
    COUNTER_KAFKA_SECURITY_PROTOCOL's, for every client; a scheme that is no Kafka protocol is refused."""
    scheme, found, rest = part.partition("://")
    if not found:
        return part
    if scheme.upper() not in PROTOCOLS:
        raise ValueError(f"{part!r}: {scheme!r} is no Kafka listener protocol ({', '.join(PROTOCOLS)}; set the "
                         "protocol with COUNTER_KAFKA_SECURITY_PROTOCOL)")
    return rest


def _check_host_ports(value: str, expected: str) -> None:
    """Every comma-separated part is host:port with a well-formed host and a port in 1..65535 (caught here, not at
    the first connect)."""
    parts = [part.strip() for part in value.split(",")]
    if not any(parts):
        raise ValueError(f"expected {expected}, got no server")
    for part in parts:
        scheme, found, rest = part.partition("://")  # librdkafka's listener form, PLAINTEXT://host:port
        if found and scheme.replace("_", "").isalpha():
            part = rest
        host, sep, port = part.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"expected {expected}, got {part!r}")
        if not 1 <= int(port) <= 65535:
            raise ValueError(f"port {port} of {part!r} is outside 1..65535")
        if ":" in host and not host.startswith("["):
            raise ValueError(f"an IPv6 address is written in brackets before its port, e.g. '[::1]:9092', got {part!r}")
        check_host(host)


def _check_cassandra_url(value: str) -> None:
    """A cassandra:// URL names at least one well-formed host (each with an optional port) and a keyspace."""
    shape = _CASSANDRA_URL.fullmatch(value.strip())
    if shape is None:
        raise ValueError("expected 'cassandra://host[,host][:port]/keyspace[?options]'")
    keyspace = (shape["keyspace"] or "").strip("/")
    if not keyspace:
        raise ValueError("the cassandra URL names no keyspace: expected 'cassandra://host[,host][:port]/keyspace'")
    if not _KEYSPACE.fullmatch(keyspace):
        raise ValueError(f"bad keyspace {keyspace!r}: a letter then up to 47 letters, digits or '_'")
    hosts = [h.strip() for h in shape["hosts"].split(",")]
    if not all(hosts):
        raise ValueError("the cassandra URL names no host (or an empty one between commas): expected "
                         "'cassandra://host[,host][:port]/keyspace'")
    for host in hosts:
        name, sep, port = host.rpartition(":") if not host.endswith("]") else ("", "", "")
        if sep and not (port.isdigit() and 1 <= int(port) <= 65535):
            raise ValueError(f"bad port {port!r} in host {host!r}: a number from 1 to 65535")
        check_host(name if sep else host)


def namespace_bound_problems(settings: Settings, namespaces: Iterable[Namespace]) -> list[str]:
    """The settings a worker would lower to what the namespaces' rollup window allows, when they were set
    (explicitly: a default above the bound is lowered as documented), one message each naming the variable.

    A worker coalesces rollup signals over the shortest `coalesce_ms` of the durable namespaces; signalling or
    committing more often than half that window only repeats signals, and an EVENTUAL fetch wait longer than that
    would delay the rollups readers wait for. The worker (agents.worker) lowers these values to the bound."""
    rolled = [ns for ns in namespaces if ns.counter_type is not CounterType.BEST_EFFORT]
    if not rolled:
        return []
    window = min(rolled, key=lambda ns: ns.queue.coalesce_ms)
    bound = max(1, window.queue.coalesce_ms // 2)
    problems = []
    for field in ("persist_checkpoint_ms", "persist_eventual_within_ms"):
        value = getattr(settings, field)
        if field in settings.model_fields_set and value > bound:
            problems.append(f"{ENV_PREFIX}{field.upper()}={value} is above {bound}, half the rollup window "
                            f"(the shortest coalesce_ms of the namespaces, {window.queue.coalesce_ms} of "
                            f"{window.name!r}): a worker would use {bound}; set at most {bound}, or raise coalesce_ms")
    return problems


def in_process_cache_problem(settings: Settings, namespaces: Iterable[Namespace]) -> str | None:
    """Why API processes sharing a pipeline cannot run on the in-process cache, or None: a BEST_EFFORT namespace
    keeps its counts in the cache, so each process would count its own (a review read 5 and 15 of 20 writes, and
    a ClearCount left the other process's count). Call it when the cache is the in-process one."""
    best_effort = next((ns.name for ns in namespaces if ns.counter_type is CounterType.BEST_EFFORT), None)
    if best_effort is None or not settings.api_shared:
        return None
    shared = (f"{ENV_PREFIX}API_WORKERS={settings.api_workers}" if settings.api_workers > 1
              else f"{ENV_PREFIX}API_SHARED_PIPELINE=true")
    return (f"{shared} with the in-process cache ({ENV_PREFIX}CACHE={settings.cache}"
            f"{', and no memcached installed' if settings.cache == 'auto' else ''}): namespace {best_effort!r} is "
            "BEST_EFFORT, whose counts live in the cache, so each API process would count its own; set "
            f"{ENV_PREFIX}CACHE=memcached://host:port (a memcached every API process reaches), or run one API process")


def backend_problems(settings: Settings, namespaces: Iterable[Namespace], *,
                     in_process_cache: bool | None = None) -> list[str]:
    """A namespace's `store` or `cache` naming another backend than the deployment's, one line each. One store
    (COUNTER_STORE) and one cache (COUNTER_CACHE) serve every namespace, so a namespace may name only those, or
    `default`; a review saw `store: cassandra` served from SQLite and `cache: memory` kept in memcached, unwarned.
    The cache is judged when `in_process_cache` says which the process runs on (the API's; the worker's is None)."""
    store = "cassandra" if settings.store.startswith("cassandra://") else "sqlite"
    cache = None if in_process_cache is None else "memory" if in_process_cache else "memcached"
    problems = []
    for ns in namespaces:
        for field, wanted, running, variable in (("store", ns.store, store, "STORE"),
                                                 ("cache", ns.cache, cache, "CACHE")):
            if running is not None and wanted not in ("default", running):
                problems.append(f"namespace {ns.name!r}: field {field!r}: {wanted}, but this deployment's {field} is "
                                f"{running} ({ENV_PREFIX}{variable}), which serves every namespace: set 'default' or "
                                f"{running!r}, or run the deployment on {wanted}")
    return problems


def api_start_problems(settings: Settings, registry: NamespaceRegistry, *, in_process_cache: bool) -> list[str]:
    """What the API lacks to start with these namespaces, one line each: a namespace's store or cache the
    deployment does not run (`backend_problems`), an API key's unset environment variable
    (`NamespaceRegistry.missing_keys`), and a shared cache for BEST_EFFORT counts (`in_process_cache_problem`)."""
    problems = backend_problems(settings, registry.values(), in_process_cache=in_process_cache)
    problems += registry.missing_keys()
    if in_process_cache and (problem := in_process_cache_problem(settings, registry.values())):
        problems.append(problem)
    return problems


OTHER_VARIABLES = frozenset({"COUNTER_TANSU_BIN", "COUNTER_UI_SCREENSHOTS"})  # read elsewhere (infra, tests)
_warned: set[str] = set()


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """One warning per COUNTER_* variable that no setting reads, with the closest one it may have meant (pydantic
    ignores them: a mistyped COUNTER_MUTATION_PARTITIONS left the default in place without a word, a review).
    COUNTER_TEST_* are the tests' own."""
    known = {ENV_PREFIX + name.upper() for name in Settings.model_fields} | OTHER_VARIABLES
    out = []
    for name in sorted(environ):
        if name.startswith(ENV_PREFIX) and name not in known and not name.startswith(f"{ENV_PREFIX}TEST_"):
            bare = [k.removeprefix(ENV_PREFIX) for k in known]  # the shared prefix made anything look close
            close = difflib.get_close_matches(name.removeprefix(ENV_PREFIX), bare, n=1)
            out.append(f"{name} is not a setting and is ignored"
                       + (f"; did you mean {ENV_PREFIX}{close[0]}?" if close else ""))
    return out


def load_settings(**overrides: Any) -> Settings:
    """Read COUNTER_* from the environment; raise SettingsError naming the variable on a bad value, and warn (once
    per process) of a COUNTER_* variable that is no setting."""
    for warning in unknown_variables(os.environ):
        if warning not in _warned:
            _warned.add(warning)
            log.warning("%s", warning)
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"])
            message = str(err["msg"]).removeprefix("Value error, ")  # pydantic's prefix for a validator's ValueError
            if not field:  # a check of several fields (a model validator): its message names them
                problems.append(message)
                continue
            problems.append(f"{ENV_PREFIX}{field.upper()}: {message} (got {err.get('input')!r})")
        raise SettingsError("invalid settings: " + "; ".join(problems)) from None
