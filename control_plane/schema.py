"""The flat namespace shape: its fields, and turning merged fields into a validated ``Namespace``.

Both accepted file shapes (our flat one and the Netflix ``persistence_configuration`` one) are
reduced to the same dotted field paths ("queue_config.num_queues", "ttl", ...), each remembering
where in the file it was written. Presets, ``defaults`` and the namespace's own fields then merge
as plain dict updates, and every check below can name the exact place to fix.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, TypeVar

from schemas import MAX_DIMENSIONS, MAX_SHARDS, ValidationError, validate_dimension_key
from schemas.validation import short_repr

from .durations import format_duration, parse_duration
from .model import (
    GRANULARITIES,
    LG_K_MAX,
    LG_K_MIN,
    NO_DIMENSIONS,
    NO_WINDOWS,
    Aggregation,
    ApiKey,
    Cardinality,
    ConfigError,
    CounterType,
    DimensionConfig,
    Namespace,
    QueueConfig,
    Retention,
    TimePartition,
    UniqueConfig,
    Windows,
)
from .presets import preset_fields

__all__ = [
    "COUNT_LIMITS",
    "FIELDS",
    "MAX_DURATION_S",
    "MAX_TTL_S",
    "MIN_DURATION_S",
    "SECTIONS",
    "Setting",
    "flatten_flat",
    "flatten_windows",
    "resolve_namespace",
    "unknown_key_reason",
]

# Sections are nested mappings in the file; every other field is a scalar (or the api_keys list).
SECTIONS: Mapping[str, tuple[str, ...]] = {
    "queue_config": ("num_queues", "coalesce_ms", "capacity_bytes"),
    "time_partition": ("buckets_per_id", "seconds_per_bucket", "seconds_per_slice"),
    "retention": ("close_after", "delete_after"),
    "dimensions": ("keys", "max_combinations"),
    "unique": ("lg_k",),
}
DIMENSION_FIELDS: tuple[str, ...] = tuple(f"dimensions.{k}" for k in SECTIONS["dimensions"])
SCALARS: tuple[str, ...] = (
    "counter_type", "cardinality", "ttl", "rollup_batch_count", "accept_limit", "max_clock_skew",
    "store", "cache", "api_keys", "shards", "aggregation",
)
# ``windows`` nests one level deeper: {granularities: [minute, hour, day], retention: {minute: 48h, ...}}.
WINDOW_KEYS: tuple[str, ...] = ("granularities", "retention")
WINDOW_FIELDS: tuple[str, ...] = ("windows.granularities", *(f"windows.retention.{g}" for g in GRANULARITIES))
# Every dotted field path a namespace may set.
FIELDS: tuple[str, ...] = (SCALARS + tuple(f"{s}.{k}" for s, keys in SECTIONS.items() for k in keys)
                           + WINDOW_FIELDS)
FOREVER = "forever"
# A child bucket must outlive its parent's recomputation by this many parent widths: an hour is rebuilt from
# its minutes while it is open (up to an hour after it began), plus however far rollups lag behind.
_CHILD_RETENTION_PARENTS = 2
_WIDTH_S = {"minute": 60, "hour": 3600, "day": 86400}

STORES: tuple[str, ...] = ("default", "sqlite", "cassandra")
CACHES: tuple[str, ...] = ("default", "memcached", "memory")
SCOPES: tuple[str, ...] = ("read", "write")

_DIGITS = re.compile(r"[0-9]+")
T = TypeVar("T")

_DAY_S = 86400
_YEAR_S = 365 * _DAY_S
# Durations end up as microseconds in int64 columns and sums (accept_limit + skew + ...): 100 years stays far
# inside int64 and above anything sane. Below 1 ms a duration is a unit slip ("1ns" is 0 µs: every event rejected).
MAX_DURATION_S = 100 * _YEAR_S
MIN_DURATION_S = 0.001
# memcached takes an expiry above 30 days as an absolute unix time, and reads one past 2^31 (2038) as already
# passed: longer TTLs could not be stored (sinks.memcached also clamps what it sends).
MAX_TTL_S = 10 * _YEAR_S
# Upper bounds of the integer fields: each (bound, why). Values beyond them overflow a store's columns or hold
# more memory than any machine has, long after start-up.
COUNT_LIMITS: Mapping[str, tuple[int, str]] = {
    "queue_config.num_queues": (10_000, "as many as the rollup topic's partitions can be"),
    "queue_config.coalesce_ms": (3_600_000, "1h: counters converge coalesce_ms after their last write"),
    "queue_config.capacity_bytes": (16 << 30, "16 GiB of pending signals per queue"),
    "rollup_batch_count": (10_000, "counters rolled up together per namespace"),
    "time_partition.buckets_per_id": (1_024, "every read scans each bucket"),
    "time_partition.seconds_per_bucket": (_YEAR_S, "365 days"),
    "time_partition.seconds_per_slice": (_YEAR_S, "365 days; retention drops whole slices"),
    "dimensions.max_combinations": (1_000_000, "each combination is tracked per counter"),
}


@dataclass(frozen=True, slots=True)
class Setting:
    """A field value plus where the file wrote it (dotted path); ``where=None`` means a preset."""

    value: Any
    where: str | None


def unknown_key_reason(key: object, expected: tuple[str, ...], *, what: str = "key") -> str:
    """Reason text for an unexpected key, with a "did you mean" hint for typos."""
    reason = f"unknown {what} {key!r}"
    if isinstance(key, str):
        close = difflib.get_close_matches(key, expected, n=1, cutoff=0.6)
        nested = [f for f in FIELDS if f.endswith("." + key)]
        if close:
            reason += f" (did you mean {close[0]!r}?)"
        elif nested and nested[0] not in expected:
            reason += f" (did you mean {nested[0]!r}? it belongs in a section)"
    return f"{reason}; expected one of: {', '.join(expected)}"


def flatten_flat(
    entry: Mapping[Any, Any],
    *,
    namespace: str | None,
    prefix: str = "",
    extra_keys: tuple[str, ...] = (),
) -> dict[str, Setting]:
    """Fields of a flat-shape mapping as dotted paths; unknown keys are errors (typos must not pass).

    ``extra_keys`` are keys the caller handles itself (e.g. ``name``) and are skipped here.
    """
    allowed = SCALARS + tuple(SECTIONS) + ("windows",) + extra_keys
    out: dict[str, Setting] = {}
    for key, value in entry.items():
        if key in extra_keys:
            continue
        if key in SCALARS:
            out[key] = Setting(value, prefix + key)
        elif key == "windows":
            out.update(flatten_windows(value, namespace=namespace, where=prefix + key))
        elif key in SECTIONS:
            if not isinstance(value, Mapping):
                raise ConfigError(
                    f"must be a mapping with keys {', '.join(SECTIONS[key])} (got {short_repr(value)})",
                    namespace=namespace, field=prefix + key,
                )
            for sub, sub_value in value.items():
                if sub not in SECTIONS[key]:
                    reason = unknown_key_reason(sub, SECTIONS[key])
                    raise ConfigError(reason, namespace=namespace, field=f"{prefix}{key}.{sub}")
                out[f"{key}.{sub}"] = Setting(sub_value, f"{prefix}{key}.{sub}")
        else:
            raise ConfigError(unknown_key_reason(key, allowed), namespace=namespace, field=f"{prefix}{key}")
    return out


def flatten_windows(value: object, *, namespace: str | None, where: str) -> dict[str, Setting]:
    """The ``windows`` section's fields as dotted paths (``windows.retention.minute``, ...), each remembering
    where it was written. The section itself is kept under ``windows`` too, so that writing one at all
    (even an empty one) can be told apart from the preset (BEST_EFFORT namespaces must not)."""
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"must be a mapping with keys {', '.join(WINDOW_KEYS)} (got {short_repr(value)})",
            namespace=namespace, field=where,
        )
    out = {"windows": Setting(value, where)}
    for key, sub in value.items():
        if key not in WINDOW_KEYS:
            raise ConfigError(unknown_key_reason(key, WINDOW_KEYS), namespace=namespace, field=f"{where}.{key}")
        if key == "granularities":
            out["windows.granularities"] = Setting(sub, f"{where}.granularities")
            continue
        if not isinstance(sub, Mapping):
            raise ConfigError(
                f"must be a mapping of granularity -> retention, e.g. {{minute: 48h, hour: 90d, day: {FOREVER}}} "
                f"(got {short_repr(sub)})", namespace=namespace, field=f"{where}.retention",
            )
        for granularity, retention in sub.items():
            if granularity not in GRANULARITIES:
                raise ConfigError(unknown_key_reason(granularity, GRANULARITIES, what="granularity"),
                                  namespace=namespace, field=f"{where}.retention.{granularity}")
            out[f"windows.retention.{granularity}"] = Setting(retention, f"{where}.retention.{granularity}")
    return out


def resolve_namespace(name: str, own: Mapping[str, Setting], defaults: Mapping[str, Setting]) -> Namespace:
    """Merge preset <- defaults <- own fields and validate the result into a ``Namespace``."""
    return _Resolver(name, own, defaults).build()


class _Resolver:
    def __init__(self, name: str, own: Mapping[str, Setting], defaults: Mapping[str, Setting]) -> None:
        self.name = name
        self.cardinality = Cardinality.LOW
        explicit = {**defaults, **own}
        if "counter_type" not in explicit:
            raise ConfigError(
                f"is required; must be one of {_choices(CounterType)}", namespace=name, field="counter_type"
            )
        # The preset depends on counter type and cardinality: resolve those two first.
        self.fields: dict[str, Setting] = {
            "counter_type": explicit["counter_type"],
            "cardinality": explicit.get("cardinality", Setting(Cardinality.LOW, None)),
        }
        self.counter_type: CounterType = self.get("counter_type", _enum(CounterType))
        self.cardinality = self.get("cardinality", _enum(Cardinality))
        preset = preset_fields(self.cardinality, self.counter_type)
        self.fields = {path: Setting(value, None) for path, value in preset.items()}
        self.fields.update(explicit)

    def get(self, path: str, convert: Callable[[Any], T]) -> T:
        setting = self.fields[path]
        try:
            return convert(setting.value)
        except ValueError as exc:
            raise self.error(path, str(exc)) from None

    def count(self, path: str) -> int:
        """A positive integer field, at most its ``COUNT_LIMITS`` bound."""
        return self.get(path, _bounded_int(*COUNT_LIMITS[path]))

    def error(self, path: str, reason: str) -> ConfigError:
        setting = self.fields.get(path)
        if setting is not None and setting.where is None and path not in ("counter_type", "cardinality"):
            reason += f" (value from the {self.cardinality.value} preset)"
        where = setting.where if setting is not None and setting.where else path
        return ConfigError(reason, namespace=self.name, field=where)

    def own(self, path: str) -> bool:
        """Whether the namespace itself wrote ``path`` (not a preset, not the file's ``defaults``)."""
        setting = self.fields.get(path)
        return setting is not None and setting.where is not None and not setting.where.startswith("defaults.")

    def blame(self, *paths: str) -> str:
        """The first of ``paths`` the user wrote (cross-field errors point at what they can change)."""
        return next((p for p in paths if self.fields[p].where is not None), paths[0])

    def build(self) -> Namespace:
        queue = QueueConfig(
            num_queues=self.count("queue_config.num_queues"),
            coalesce_ms=self.count("queue_config.coalesce_ms"),
            capacity_bytes=self.count("queue_config.capacity_bytes"),
        )
        partition = TimePartition(
            buckets_per_id=self.count("time_partition.buckets_per_id"),
            seconds_per_bucket=self.count("time_partition.seconds_per_bucket"),
            seconds_per_slice=self.count("time_partition.seconds_per_slice"),
        )
        if partition.seconds_per_slice % partition.seconds_per_bucket:
            path = self.blame("time_partition.seconds_per_slice", "time_partition.seconds_per_bucket")
            raise self.error(
                path,
                f"seconds_per_slice ({partition.seconds_per_slice}) must be a positive multiple of "
                f"seconds_per_bucket ({partition.seconds_per_bucket}) so buckets never straddle slices",
            )
        accept_limit, skew = self._admission()
        retention = self._event_retention(accept_limit, skew)
        windows = self._windows()
        if windows and retention.delete_after_s <= _WIDTH_S[windows.granularities[0]] + accept_limit + skew:
            finest = windows.granularities[0]
            raise self.error(
                self.blame("retention.delete_after", "windows.granularities", "accept_limit", "max_clock_skew"),
                f"delete_after ({_span(retention.delete_after_s)}) must be greater than a {finest} plus "
                f"accept_limit + max_clock_skew ({_span(_WIDTH_S[finest] + accept_limit + skew)}) while {finest} "
                f"buckets are kept: a {finest} still admitting events is summed from its stored events, so none of "
                "them may be deleted yet (or keep no windows: windows.granularities: [])",
            )
        return Namespace(
            name=self.name,
            counter_type=self.counter_type,
            cardinality=self.cardinality,
            ttl_s=self.get("ttl", _ttl),
            queue=queue,
            rollup_batch_count=self.count("rollup_batch_count"),
            time_partition=partition,
            accept_limit_s=accept_limit,
            max_clock_skew_s=skew,
            retention=retention,
            store=self.get("store", _choice(STORES)),
            cache=self.get("cache", _choice(CACHES)),
            api_keys=self._api_keys(),
            windows=windows,
            dimensions=self._dimensions(),
            shards=self._shards(),
            **self._aggregation(),
        )

    def _admission(self) -> tuple[float, float]:
        """``(accept_limit, max_clock_skew)``: a client behind by the skew it may have must still be admitted."""
        accept_limit = self.get("accept_limit", _duration(positive=True))
        skew = self.get("max_clock_skew", _duration(positive=False))
        if accept_limit < skew:
            raise self.error(
                self.blame("accept_limit", "max_clock_skew"),
                f"accept_limit ({_span(accept_limit)}) must be >= max_clock_skew ({_span(skew)}): a client whose "
                "clock is behind by the declared skew would have its events rejected as too old",
            )
        return accept_limit, skew

    def _event_retention(self, accept_limit: float, skew: float) -> Retention:
        """Events are deleted only once no longer admitted; ``close_after`` is informational (the Netflix shape's
        slice close; admission already ends writes to a slice ``accept_limit`` after it), so it only has to be
        consistent: between ``accept_limit`` and ``delete_after``."""
        retention = Retention(
            close_after_s=self.get("retention.close_after", _duration(positive=True)),
            delete_after_s=self.get("retention.delete_after", _duration(positive=True)),
        )
        if retention.delete_after_s < retention.close_after_s:
            path = self.blame("retention.delete_after", "retention.close_after")
            raise self.error(
                path,
                f"delete_after ({retention.delete_after_s:g}s) must be >= close_after "
                f"({retention.close_after_s:g}s): events cannot be deleted before their slice closes",
            )
        if retention.delete_after_s <= accept_limit + skew:
            path = self.blame("retention.delete_after", "accept_limit", "max_clock_skew")
            raise self.error(
                path,
                f"delete_after ({retention.delete_after_s:g}s) must be greater than accept_limit + "
                f"max_clock_skew ({accept_limit + skew:g}s), or events would be deleted while still admitted",
            )
        if retention.close_after_s < accept_limit:
            raise self.error(
                self.blame("retention.close_after", "accept_limit"),
                f"close_after ({_span(retention.close_after_s)}) must be >= accept_limit ({_span(accept_limit)}): "
                "a slice cannot close while events for it are still admitted",
            )
        return retention

    def _aggregation(self) -> dict[str, Any]:
        """``aggregation: SUM | UNIQUE`` and ``unique: {lg_k}``: UNIQUE counts distinct items with HLL sketches kept
        per time bucket, so it needs an EVENTUAL/ACCURATE namespace with windows (at least minutes)."""
        aggregation = self.get("aggregation", _enum(Aggregation))
        if self.counter_type is CounterType.BEST_EFFORT:
            if self.own("aggregation") and aggregation is Aggregation.UNIQUE:
                raise self.error("aggregation", "BEST_EFFORT counters live only in memcached and keep no sketches "
                                                "(nothing is rolled up); use EVENTUAL or ACCURATE for UNIQUE")
            if self.own("unique.lg_k"):
                raise self.error("unique.lg_k", "only UNIQUE namespaces keep sketches, and BEST_EFFORT cannot be "
                                                "UNIQUE; remove it")
            return {}
        if aggregation is Aggregation.SUM:
            if self.own("unique.lg_k"):
                raise self.error("unique.lg_k", "sizes the sketches of unique counts: set aggregation: UNIQUE, or "
                                                "remove it")
            return {}
        chain = self.get("windows.granularities", _granularities)
        if not chain:
            raise self.error(self.blame("windows.granularities", "aggregation"),
                             "a UNIQUE namespace keeps its sketches per time bucket: keep at least minute buckets "
                             "(windows.granularities: [minute, hour, day], as the presets do)")
        coarsest = chain[-1]
        kept = self.get(f"windows.retention.{coarsest}", _retention(coarsest))
        if kept is not None:
            raise self.error(self.blame(f"windows.retention.{coarsest}", "aggregation"),
                             f"a UNIQUE total is the union of the counter's sketches, so its coarsest buckets "
                             f"({coarsest}s) must be kept forever (got {_span(kept)}): each {coarsest} leaving "
                             f"retention would take its items out of the total (it read 0 once they all had)")
        return {"aggregation": aggregation, "unique": UniqueConfig(self.get("unique.lg_k", _lg_k))}

    def _shards(self) -> int:
        """``shards: N`` (1..MAX_SHARDS): the Kafka keys each counter's writes are spread over. BEST_EFFORT writes
        never reach Kafka, so one there is a mistake (one from ``defaults`` is ignored, as windows are)."""
        if self.counter_type is CounterType.BEST_EFFORT:
            if self.own("shards"):
                raise self.error("shards", "BEST_EFFORT writes go to memcached, never to Kafka, so there is nothing "
                                           "to spread over partitions; remove it or use EVENTUAL/ACCURATE")
            return 1
        return self.get("shards", _shard_count)

    def _dimensions(self) -> DimensionConfig:
        """``dimensions: {keys: [country, device], max_combinations: 1000}``: at most MAX_DIMENSIONS distinct
        identifiers (a write is counted in 2^n counters: the counter and every non-empty subset of its dimensions;
        16 events per write at 4 keys), and a positive bound on the distinct full combinations per counter."""
        written = next((p for p in DIMENSION_FIELDS if self.own(p)), None)
        if self.counter_type is CounterType.BEST_EFFORT:
            if written is not None:
                raise self.error(written, "BEST_EFFORT counters live only in memcached and keep no dimension "
                                          "combinations (nothing is rolled up); remove it or use EVENTUAL/ACCURATE")
            return NO_DIMENSIONS
        keys = self.get("dimensions.keys", _dimension_keys)
        max_combinations = self.count("dimensions.max_combinations")
        if not keys:
            if self.own("dimensions.max_combinations"):
                raise self.error("dimensions.max_combinations", "bounds the combinations of declared dimensions: "
                                                                "declare dimensions.keys, or remove it")
            return NO_DIMENSIONS
        return DimensionConfig(keys, max_combinations)

    def _windows(self) -> Windows:
        if self.counter_type is CounterType.BEST_EFFORT:
            written = next((p for p in ("windows", *WINDOW_FIELDS) if self.own(p)), None)
            if written is not None:
                raise self.error(written, "BEST_EFFORT counters live only in memcached and keep no time windows "
                                          "(nothing is rolled up); remove it or use EVENTUAL/ACCURATE")
            return NO_WINDOWS
        chain = self.get("windows.granularities", _granularities)
        retention: dict[str, float | None] = {}
        for granularity in GRANULARITIES:
            path = f"windows.retention.{granularity}"
            if granularity in chain:
                retention[granularity] = self.get(path, _retention(granularity))
            elif self.own(path):
                raise self.error(path, f"{granularity} buckets are not kept: add {granularity} to "
                                       "windows.granularities or remove this retention")
        for child, parent in pairwise(chain):
            kept, needed = retention[child], _CHILD_RETENTION_PARENTS * _WIDTH_S[parent]
            if kept is not None and kept < needed:
                raise self.error(
                    f"windows.retention.{child}",
                    f"{child} retention ({_span(kept)}) must be at least {_span(needed)} while {parent} buckets "
                    f"are kept: a {parent} is recomputed from its {child}s until it closes (plus rollup lag), "
                    "so they must outlive it",
                )
        for child, parent in pairwise(chain):
            kept, longer = retention[child], retention[parent]
            if longer is not None and (kept is None or longer < kept):
                path = self.blame(f"windows.retention.{parent}", f"windows.retention.{child}")
                raise self.error(
                    path,
                    f"{parent} retention ({_span(longer)}) must be >= {child} retention ({_span(kept)}): "
                    f"ranges older than the {child} buckets are answered from {parent}s",
                )
        return Windows(tuple(chain), tuple((g, retention[g]) for g in chain))

    def _api_keys(self) -> tuple[ApiKey, ...]:
        setting = self.fields["api_keys"]
        where = setting.where or "api_keys"
        if not isinstance(setting.value, list | tuple):
            raise ConfigError(  # its type only: the value may hold a key, and error messages end up in logs
                f"must be a list of {{key, scopes}} mappings (got {_kind(setting.value)})",
                namespace=self.name, field=where,
            )
        keys: list[ApiKey] = []
        seen: dict[str, int] = {}
        for i, item in enumerate(setting.value):
            api_key = _api_key(item, namespace=self.name, where=f"{where}[{i}]")
            if api_key.missing_env:  # no key to compare: the API refuses to start (NamespaceRegistry.missing_keys)
                keys.append(api_key)
                continue
            if api_key.key in seen:  # never echo the key itself: error messages end up in logs
                raise ConfigError(
                    f"duplicate API key (same key as {where}[{seen[api_key.key]}]); list each key once "
                    "with all its scopes",
                    namespace=self.name, field=f"{where}[{i}].key",
                )
            seen[api_key.key] = i
            keys.append(api_key)
        return tuple(keys)


def _kind(value: object) -> str:
    """A value named by its type alone ("a mapping", "a string"), for messages that must not echo a secret."""
    return {dict: "a mapping", str: "a string", int: "a number", float: "a number", bool: "a boolean"}.get(
        type(value), type(value).__name__)


def _unusable_key(key: str) -> str | None:
    """Why no caller could present this key, or None. A header value's surrounding whitespace is not part of it (a
    trailing newline of a key read from a file never matched), and HTTP headers carry Latin-1, not UTF-8: a
    non-ASCII key matched only when a client sent it Latin-1 encoded (a review). Never echoes the key."""
    if key != key.strip():
        return "must not start or end with whitespace (copy-paste error, or a file's trailing newline?)"
    if not all(" " <= c <= "~" for c in key):
        return "must be printable ASCII (HTTP headers carry other characters as Latin-1, so no client's UTF-8 matches)"
    return None


def _api_key(item: object, *, namespace: str, where: str) -> ApiKey:
    if not isinstance(item, Mapping):
        raise ConfigError(
            f"must be a mapping {{key: ..., scopes: [read, write]}} (got {type(item).__name__})",
            namespace=namespace, field=where,
        )
    allowed = ("key", "key_env", "scopes")
    for k in item:
        if k not in allowed:
            raise ConfigError(unknown_key_reason(k, allowed), namespace=namespace, field=f"{where}.{k}")
    if ("key" in item) == ("key_env" in item):
        raise ConfigError(
            "needs exactly one of 'key' (the secret) or 'key_env' (environment variable holding it)",
            namespace=namespace, field=f"{where}.key",
        )
    if "key_env" in item:
        var = item["key_env"]
        if not isinstance(var, str) or not var.strip():
            raise ConfigError(
                "must name an environment variable", namespace=namespace, field=f"{where}.key_env"
            )
        key = os.environ.get(var.strip()) or ""
        missing_env = "" if key else var.strip()
        if key and (problem := _unusable_key(key)):
            raise ConfigError(f"environment variable {var.strip()}'s value {problem}", namespace=namespace,
                              field=f"{where}.key_env")
    else:
        missing_env = ""
        key = item["key"]
        if not isinstance(key, str) or not key:
            got = "an empty string" if key == "" else type(key).__name__
            raise ConfigError(
                f"must be a non-empty string (got {got})",
                namespace=namespace, field=f"{where}.key",
            )
        if problem := _unusable_key(key):
            raise ConfigError(problem, namespace=namespace, field=f"{where}.key")
    scopes = item.get("scopes")
    if not isinstance(scopes, list | tuple) or not scopes:
        raise ConfigError(
            f"must be a non-empty list drawn from {', '.join(SCOPES)} (got {short_repr(scopes)})",
            namespace=namespace, field=f"{where}.scopes",
        )
    normalised: set[str] = set()
    for scope in scopes:
        value = scope.strip().lower() if isinstance(scope, str) else scope
        if value not in SCOPES:
            raise ConfigError(
                f"unknown scope {scope!r}; allowed: {', '.join(SCOPES)}", namespace=namespace,
                field=f"{where}.scopes",
            )
        normalised.add(value)
    return ApiKey(key=key, scopes=frozenset(normalised), missing_env=missing_env)


def _choices(enum: type[CounterType] | type[Cardinality] | type[Aggregation]) -> str:
    return ", ".join(m.value for m in enum)


def _span(seconds: float | None) -> str:
    """Seconds as the largest whole unit ("48h", "90d"), for messages; None is forever."""
    return FOREVER if seconds is None else format_duration(seconds)


def _granularities(value: object) -> tuple[str, ...]:
    prefixes = ["[" + ", ".join(GRANULARITIES[:n]) + "]" for n in range(len(GRANULARITIES) + 1)]
    reason = (f"must be a prefix of [{', '.join(GRANULARITIES)}] (each bucket is the sum of the finer one): "
              f"{', '.join(prefixes[:-1])} or {prefixes[-1]} (got {short_repr(value)})")
    if not isinstance(value, list | tuple) or not all(isinstance(g, str) for g in value):
        raise ValueError(reason)
    chain = tuple(g.strip().lower() for g in value)
    if chain != GRANULARITIES[:len(chain)]:
        raise ValueError(reason)
    return chain


def _retention(granularity: str) -> Callable[[Any], float | None]:
    width = _WIDTH_S[granularity]

    def convert(value: object) -> float | None:
        if value is None or (isinstance(value, str) and value.strip().lower() == FOREVER):
            return None
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            raise ValueError(f"invalid duration: {exc} (or {FOREVER!r} to keep them)") from None
        if seconds < width:
            raise ValueError(f"must keep at least one {granularity} bucket ({_span(width)}), or {FOREVER!r} "
                             f"(got {short_repr(value)})")
        if seconds > MAX_DURATION_S:
            raise ValueError(f"must be at most {_span(MAX_DURATION_S)}, or {FOREVER!r} (got {short_repr(value)})")
        return seconds

    return convert


def _dimension_keys(value: object) -> tuple[str, ...]:
    example = "e.g. [country, device]"
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise ValueError(f"must be a list of dimension keys, {example} (got {short_repr(value)})")
    if len(value) > MAX_DIMENSIONS:
        raise ValueError(f"at most {MAX_DIMENSIONS} dimension keys (a write is counted in the counter and in every "
                         f"combination of its dimensions: {2 ** MAX_DIMENSIONS} events per write at "
                         f"{MAX_DIMENSIONS}), got {len(value)}")
    keys: list[str] = []
    for key in value:
        try:
            keys.append(validate_dimension_key(key, field="dimensions.keys"))
        except ValidationError as exc:
            raise ValueError(exc.reason) from None
        if keys.count(key) > 1:
            raise ValueError(f"dimension key {key!r} is declared twice")
    return tuple(keys)


def _lg_k(value: object) -> int:
    reason = (f"must be an integer from {LG_K_MIN} to {LG_K_MAX}: log2 of the HLL sketches' buckets (relative "
              f"error about 1.04 / sqrt(2^lg_k): 1.6% at 12), got {short_repr(value)}")
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(reason)
    try:
        lg_k = _positive_int(value)
    except ValueError:
        raise ValueError(reason) from None
    if not LG_K_MIN <= lg_k <= LG_K_MAX:
        raise ValueError(reason)
    return lg_k


def _shard_count(value: object) -> int:
    try:
        shards = _positive_int(value)
    except ValueError:
        raise ValueError(f"must be an integer from 1 to {MAX_SHARDS}: the Kafka keys a counter's writes are "
                         f"spread over (got {short_repr(value)})") from None
    if shards > MAX_SHARDS:
        raise ValueError(f"must be at most {MAX_SHARDS} (got {shards}); a few times the mutations topic's "
                         "partition count already spreads a counter over every partition")
    return shards


def _positive_int(value: object) -> int:
    number: int | None = None
    if isinstance(value, bool):  # True is an int in Python; never a count
        number = None
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and _DIGITS.fullmatch(value.strip()):
        number = int(value.strip())  # the Netflix post writes "600"
    if number is None or number <= 0:
        raise ValueError(f"must be a positive integer (got {short_repr(value)})")
    return number


def _enum(enum: type[CounterType] | type[Cardinality] | type[Aggregation]) -> Callable[[Any], Any]:
    def convert(value: object) -> Any:
        if isinstance(value, enum):
            return value
        if isinstance(value, str):
            key = value.strip().upper().replace("-", "_").replace(" ", "_")
            if key in enum.__members__:
                return enum[key]
        raise ValueError(f"must be one of {_choices(enum)} (got {short_repr(value)})")

    return convert


def _choice(allowed: tuple[str, ...]) -> Callable[[Any], str]:
    def convert(value: object) -> str:
        if isinstance(value, str) and value.strip().lower() in allowed:
            return value.strip().lower()
        raise ValueError(f"must be one of {', '.join(allowed)} (got {short_repr(value)})")

    return convert


def _bounded_int(maximum: int, why: str) -> Callable[[Any], int]:
    def convert(value: object) -> int:
        number = _positive_int(value)
        if number > maximum:
            raise ValueError(f"must be at most {maximum:,} ({why}), got {number:,}")
        return number

    return convert


def _duration(*, positive: bool) -> Callable[[Any], float]:
    """Seconds within [MIN_DURATION_S, MAX_DURATION_S] (or 0 when not ``positive``): kept as µs in int64."""
    def convert(value: object) -> float:
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            raise ValueError(f"invalid duration: {exc}") from None
        if positive and seconds <= 0:
            raise ValueError(f"must be a positive duration (got {short_repr(value)})")
        if 0 < seconds < MIN_DURATION_S:
            raise ValueError(f"must be at least 1ms{'' if positive else ' (or 0)'}: it is kept in whole "
                             f"microseconds (got {short_repr(value)})")
        if seconds > MAX_DURATION_S:
            raise ValueError(f"must be at most {_span(MAX_DURATION_S)} (got {short_repr(value)})")
        return seconds

    return convert


def _ttl(value: object) -> float | None:
    """Seconds until a memcached entry expires, or None (never); at most MAX_TTL_S (memcached's 2038 limit)."""
    if value is None:
        return None  # explicit null: never expire
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise ValueError(f"invalid duration: {exc} (use null for no expiry)") from None
    if seconds <= 0:
        raise ValueError(f"must be a positive duration, or null for no expiry (got {short_repr(value)})")
    if seconds > MAX_TTL_S:
        raise ValueError(f"must be at most {_span(MAX_TTL_S)} (memcached cannot hold a later expiry); use null "
                         f"for no expiry (got {short_repr(value)})")
    return seconds
