"""Validated, immutable namespace configuration as the rest of the service sees it.

Everything here is already checked by the loader: components read plain typed values and
never re-parse durations or re-apply presets. Objects are frozen so one registry can be shared
across agents, the API server and threads without copies.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, TypeVar, overload

__all__ = [
    "GRANULARITIES",
    "LG_K_DEFAULT",
    "LG_K_MAX",
    "LG_K_MIN",
    "Aggregation",
    "ApiKey",
    "Cardinality",
    "ConfigError",
    "CounterType",
    "DimensionConfig",
    "Namespace",
    "NamespaceRegistry",
    "QueueConfig",
    "Retention",
    "TimePartition",
    "UniqueConfig",
    "Windows",
]


class CounterType(StrEnum):
    """How a namespace counts (see DESIGN.md: write path, read path, guarantees).

    A ``str`` enum: members compare equal to, and format as, their wire value ("EVENTUAL").
    """

    BEST_EFFORT = "BEST_EFFORT"
    EVENTUAL = "EVENTUAL"
    ACCURATE = "ACCURATE"


class Aggregation(StrEnum):
    """What a namespace's counters count: SUM adds the writes' deltas; UNIQUE counts the distinct ``item`` values
    of its writes (e.g. user ids) with mergeable HyperLogLog sketches (EVENTUAL/ACCURATE only)."""

    SUM = "SUM"
    UNIQUE = "UNIQUE"


class Cardinality(StrEnum):
    """Expected scale of a namespace; selects the preset that fills unspecified settings."""

    LOW = "LOW"
    MEDIUM = "MEDIUM"
    HIGH = "HIGH"


class ConfigError(ValueError):
    """A namespace configuration that must not be started with.

    The message names where the problem is (file, line, namespace, dotted field path) so that an
    operator can fix it from the start-up log alone.
    """

    def __init__(
        self,
        reason: str,
        *,
        namespace: str | None = None,
        field: str | None = None,
        path: str | None = None,
        line: int | None = None,
        column: int | None = None,
    ) -> None:
        self.reason = reason
        self.namespace = namespace
        self.field = field
        self.path = path
        self.line = line
        self.column = column
        super().__init__(self._render())

    def _render(self) -> str:
        parts: list[str] = []
        if self.path:
            parts.append(self.path)
        if self.line is not None:
            parts.append(f"line {self.line}" + (f", column {self.column}" if self.column is not None else ""))
        if self.namespace is not None:
            parts.append(f"namespace {self.namespace!r}")
        if self.field is not None:
            parts.append(f"field {self.field!r}")
        parts.append(self.reason)
        return ": ".join(parts)

    def with_path(self, path: str | None) -> ConfigError:
        """Copy of this error that also names the file it came from."""
        return ConfigError(
            self.reason, namespace=self.namespace, field=self.field, path=path,
            line=self.line, column=self.column,
        )

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # keyword-only __init__: make it survive pickling (multiprocessing)
        args = (self.reason, self.namespace, self.field, self.path, self.line, self.column)
        return (_rebuild_config_error, args)


def _rebuild_config_error(
    reason: str,
    namespace: str | None,
    field: str | None,
    path: str | None,
    line: int | None,
    column: int | None,
) -> ConfigError:
    return ConfigError(reason, namespace=namespace, field=field, path=path, line=line, column=column)


@dataclass(frozen=True, slots=True)
class QueueConfig:
    """Rollup queueing: partitions of the rollup topic play Netflix's in-memory queues."""

    num_queues: int
    coalesce_ms: int
    capacity_bytes: int


@dataclass(frozen=True, slots=True)
class TimePartition:
    """Event-store partitioning: keeps a hot counter from making one wide partition."""

    buckets_per_id: int
    seconds_per_bucket: int
    seconds_per_slice: int


@dataclass(frozen=True, slots=True)
class Retention:
    """When an event time slice closes, and when its events may be deleted.

    ``close_after_s`` is informational (the Netflix shape's slice close, checked to lie between accept_limit and
    delete_after): admission already ends a slice's writes accept_limit after it; ``delete_after_s`` drives
    retention."""

    close_after_s: float
    delete_after_s: float


# Time-window granularities, finest first. Each is the sum of the one before it, so a namespace keeps a
# prefix of this chain (DESIGN invariant 7); sinks.windows.Granularity has the same values.
GRANULARITIES: tuple[str, ...] = ("minute", "hour", "day")


@dataclass(frozen=True, slots=True)
class Windows:
    """Time-windowed counts of a namespace: which bucket granularities are kept, and for how long.

    ``granularities`` is a prefix of ``GRANULARITIES`` (empty: no windows, always so for BEST_EFFORT);
    ``retention`` pairs each kept granularity with its retention in seconds (None: kept forever).
    """

    granularities: tuple[str, ...] = ()
    retention: tuple[tuple[str, float | None], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.granularities)

    def enabled(self, granularity: str) -> bool:
        return granularity in self.granularities

    def retention_s(self, granularity: str) -> float | None:
        """Seconds a bucket of ``granularity`` is kept (None: forever); KeyError if it is not kept at all."""
        for name, seconds in self.retention:
            if name == granularity:
                return seconds
        raise KeyError(f"{granularity!r} buckets are not kept (granularities: {', '.join(self.granularities)})")


NO_WINDOWS = Windows()


@dataclass(frozen=True, slots=True)
class DimensionConfig:
    """The dimensions a namespace's writes may carry (``schemas.dimensions``): the declared ``keys`` (at most 4)
    and ``max_combinations``, the most distinct full combinations (a write's whole set of dimensions, e.g.
    ``country=US device=tv``) one counter may have. Empty ``keys``: writes carry no dimensions."""

    keys: tuple[str, ...] = ()
    max_combinations: int = 0

    def __bool__(self) -> bool:
        return bool(self.keys)

    def refusal(self, namespace: str, dimensions: tuple[tuple[str, str], ...]) -> tuple[str, str] | None:
        """``(field, reason)`` when a write's (validated, sorted) dimensions are not allowed here, else None: a
        key the namespace does not declare (field ``dimensions.<key>``), or any key when it declares none."""
        if not dimensions:
            return None
        for key, _ in dimensions:
            if key not in self.keys:
                declared = f"it declares {', '.join(self.keys)}" if self.keys else "it declares none"
                return f"dimensions.{key}", (f"dimension {key!r} is not declared by namespace {namespace!r} "
                                             f"({declared}; see its dimensions.keys)")
        return None


NO_DIMENSIONS = DimensionConfig()

LG_K_MIN, LG_K_MAX, LG_K_DEFAULT = 4, 21, 12  # the HLL sketches' log2 of buckets (datasketches' bounds)


@dataclass(frozen=True, slots=True)
class UniqueConfig:
    """Unique counts (aggregation UNIQUE): ``lg_k`` is log2 of the HLL sketches' buckets, LG_K_MIN..LG_K_MAX. A
    sketch's relative standard error is about 1.04 / sqrt(2^lg_k) (1.6% at 12, 0.4% at 16); a compact sketch
    takes about 2^(lg_k - 1) bytes."""

    lg_k: int = LG_K_DEFAULT

    @property
    def relative_error(self) -> float:
        """One standard deviation of an estimate, relative to it."""
        return 1.04 / float(2 ** self.lg_k) ** 0.5


@dataclass(frozen=True, slots=True)
class ApiKey:
    """A credential for one namespace. ``key`` is kept out of ``repr`` so logs never leak it. ``missing_env``
    names the unset environment variable of a ``key_env`` (``key`` is then empty and matches no caller): only
    the API needs the keys, which refuses to start without them (`NamespaceRegistry.missing_keys`); the worker and
    the jobs load the file without the API's secrets."""

    key: str = field(repr=False)
    scopes: frozenset[str] = frozenset()
    missing_env: str = ""


@dataclass(frozen=True, slots=True)
class Namespace:
    """One namespace, fully resolved (preset, defaults and the file's own fields merged)."""

    name: str
    counter_type: CounterType
    cardinality: Cardinality
    ttl_s: float | None
    queue: QueueConfig
    rollup_batch_count: int
    time_partition: TimePartition
    accept_limit_s: float
    max_clock_skew_s: float
    retention: Retention
    store: str
    cache: str
    api_keys: tuple[ApiKey, ...] = ()
    windows: Windows = NO_WINDOWS
    dimensions: DimensionConfig = NO_DIMENSIONS
    # Kafka keys one counter's writes are spread over (schemas.shard_key): a hot counter does not pin one
    # partition and one worker. 1 (the default) keys every write `namespace:counter`.
    shards: int = 1
    aggregation: Aggregation = Aggregation.SUM
    unique: UniqueConfig | None = None  # set exactly when aggregation is UNIQUE

    @property
    def counts_unique(self) -> bool:
        """Whether its counters count distinct items (aggregation UNIQUE) rather than sum deltas."""
        return self.unique is not None

    @property
    def requires_auth(self) -> bool:
        """False when the namespace has no API keys (no access control)."""
        return bool(self.api_keys)

    def allows(self, key: str | None, scope: str) -> bool:
        """Whether ``key`` may perform ``scope`` ("read"/"write"); constant-time key comparison."""
        if not self.api_keys:
            return True
        if not key:
            return False
        given = key.encode("utf-8")
        granted = False
        for api_key in self.api_keys:  # no early exit: timing must not reveal which key matched
            if hmac.compare_digest(api_key.key.encode("utf-8"), given) and scope in api_key.scopes:
                granted = True
        return granted


_T = TypeVar("_T")


class NamespaceRegistry(Mapping[str, Namespace]):
    """Immutable ``name -> Namespace`` mapping, in file order."""

    __slots__ = ("_by_name", "source")

    def __init__(self, namespaces: Iterable[Namespace] = (), *, source: str | None = None) -> None:
        by_name: dict[str, Namespace] = {}
        for ns in namespaces:
            if ns.name in by_name:
                raise ConfigError("namespace defined more than once", namespace=ns.name, path=source)
            by_name[ns.name] = ns
        self._by_name: Mapping[str, Namespace] = MappingProxyType(by_name)
        self.source = source

    @overload
    def get(self, name: str, /) -> Namespace | None: ...
    @overload
    def get(self, name: str, default: Namespace, /) -> Namespace: ...
    @overload
    def get(self, name: str, default: _T, /) -> Namespace | _T: ...

    def get(self, name: str, default: object = None) -> object:
        """The namespace called ``name``, or ``default`` (hot path: no message building)."""
        return self._by_name.get(name, default)

    def __getitem__(self, name: str) -> Namespace:
        try:
            return self._by_name[name]
        except KeyError:
            known = ", ".join(self._by_name) or "none"
            where = f" in {self.source}" if self.source else ""
            raise KeyError(f"unknown namespace {name!r}{where} (configured: {known})") from None

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def names(self) -> tuple[str, ...]:
        """Namespace names in the order the file defines them."""
        return tuple(self._by_name)

    def missing_keys(self) -> list[str]:
        """What the API lacks to check callers: one line per API key whose ``key_env`` variable is not set."""
        return [f"namespace {ns.name!r}: api_keys[{i}].key_env: environment variable {k.missing_env!r} is not set or "
                "empty (the API needs it)"
                for ns in self._by_name.values() for i, k in enumerate(ns.api_keys) if k.missing_env]

    def shard_counts(self) -> dict[str, int]:
        """``name -> shards`` of the namespaces that spread their counters over more than one Kafka key (what
        ``producers.CounterProducer(shards=...)`` takes; a namespace left out has one)."""
        return {name: ns.shards for name, ns in self._by_name.items() if ns.shards > 1}

    def __repr__(self) -> str:
        return f"NamespaceRegistry({list(self._by_name)!r}, source={self.source!r})"
