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
from typing import Any, TypeVar

from .durations import parse_duration
from .model import (
    ApiKey,
    Cardinality,
    ConfigError,
    CounterType,
    Namespace,
    QueueConfig,
    Retention,
    TimePartition,
)
from .presets import preset_fields

__all__ = [
    "FIELDS",
    "SECTIONS",
    "Setting",
    "flatten_flat",
    "resolve_namespace",
    "unknown_key_reason",
]

# Sections are nested mappings in the file; every other field is a scalar (or the api_keys list).
SECTIONS: Mapping[str, tuple[str, ...]] = {
    "queue_config": ("num_queues", "coalesce_ms", "capacity_bytes"),
    "time_partition": ("buckets_per_id", "seconds_per_bucket", "seconds_per_slice"),
    "retention": ("close_after", "delete_after"),
}
SCALARS: tuple[str, ...] = (
    "counter_type", "cardinality", "ttl", "rollup_batch_count", "accept_limit", "max_clock_skew",
    "store", "cache", "api_keys",
)
# Every dotted field path a namespace may set.
FIELDS: tuple[str, ...] = SCALARS + tuple(f"{s}.{k}" for s, keys in SECTIONS.items() for k in keys)

STORES: tuple[str, ...] = ("default", "sqlite", "cassandra")
CACHES: tuple[str, ...] = ("default", "memcached", "memory")
SCOPES: tuple[str, ...] = ("read", "write")

_DIGITS = re.compile(r"[0-9]+")
T = TypeVar("T")


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
    allowed = SCALARS + tuple(SECTIONS) + extra_keys
    out: dict[str, Setting] = {}
    for key, value in entry.items():
        if key in extra_keys:
            continue
        if key in SCALARS:
            out[key] = Setting(value, prefix + key)
        elif key in SECTIONS:
            if not isinstance(value, Mapping):
                raise ConfigError(
                    f"must be a mapping with keys {', '.join(SECTIONS[key])} (got {_show(value)})",
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

    def error(self, path: str, reason: str) -> ConfigError:
        setting = self.fields.get(path)
        if setting is not None and setting.where is None and path not in ("counter_type", "cardinality"):
            reason += f" (value from the {self.cardinality.value} preset)"
        where = setting.where if setting is not None and setting.where else path
        return ConfigError(reason, namespace=self.name, field=where)

    def blame(self, *paths: str) -> str:
        """The first of ``paths`` the user wrote (cross-field errors point at what they can change)."""
        return next((p for p in paths if self.fields[p].where is not None), paths[0])

    def build(self) -> Namespace:
        queue = QueueConfig(
            num_queues=self.get("queue_config.num_queues", _positive_int),
            coalesce_ms=self.get("queue_config.coalesce_ms", _positive_int),
            capacity_bytes=self.get("queue_config.capacity_bytes", _positive_int),
        )
        partition = TimePartition(
            buckets_per_id=self.get("time_partition.buckets_per_id", _positive_int),
            seconds_per_bucket=self.get("time_partition.seconds_per_bucket", _positive_int),
            seconds_per_slice=self.get("time_partition.seconds_per_slice", _positive_int),
        )
        if partition.seconds_per_slice % partition.seconds_per_bucket:
            path = self.blame("time_partition.seconds_per_slice", "time_partition.seconds_per_bucket")
            raise self.error(
                path,
                f"seconds_per_slice ({partition.seconds_per_slice}) must be a positive multiple of "
                f"seconds_per_bucket ({partition.seconds_per_bucket}) so buckets never straddle slices",
            )
        accept_limit = self.get("accept_limit", _duration(positive=True))
        skew = self.get("max_clock_skew", _duration(positive=False))
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
        return Namespace(
            name=self.name,
            counter_type=self.counter_type,
            cardinality=self.cardinality,
            ttl_s=self.get("ttl", _ttl),
            queue=queue,
            rollup_batch_count=self.get("rollup_batch_count", _positive_int),
            time_partition=partition,
            accept_limit_s=accept_limit,
            max_clock_skew_s=skew,
            retention=retention,
            store=self.get("store", _choice(STORES)),
            cache=self.get("cache", _choice(CACHES)),
            api_keys=self._api_keys(),
        )

    def _api_keys(self) -> tuple[ApiKey, ...]:
        setting = self.fields["api_keys"]
        where = setting.where or "api_keys"
        if not isinstance(setting.value, list | tuple):
            raise ConfigError(
                f"must be a list of {{key, scopes}} mappings (got {_show(setting.value)})",
                namespace=self.name, field=where,
            )
        keys: list[ApiKey] = []
        seen: dict[str, int] = {}
        for i, item in enumerate(setting.value):
            api_key = _api_key(item, namespace=self.name, where=f"{where}[{i}]")
            if api_key.key in seen:  # never echo the key itself: error messages end up in logs
                raise ConfigError(
                    f"duplicate API key (same key as {where}[{seen[api_key.key]}]); list each key once "
                    "with all its scopes",
                    namespace=self.name, field=f"{where}[{i}].key",
                )
            seen[api_key.key] = i
            keys.append(api_key)
        return tuple(keys)


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
        key = os.environ.get(var.strip())
        if not key:
            raise ConfigError(
                f"environment variable {var.strip()!r} is not set or empty", namespace=namespace,
                field=f"{where}.key_env",
            )
    else:
        key = item["key"]
        if not isinstance(key, str) or not key:
            got = "an empty string" if key == "" else type(key).__name__
            raise ConfigError(
                f"must be a non-empty string (got {got})",
                namespace=namespace, field=f"{where}.key",
            )
        if key != key.strip():
            raise ConfigError(
                "must not start or end with whitespace (copy-paste error?)", namespace=namespace,
                field=f"{where}.key",
            )
    scopes = item.get("scopes")
    if not isinstance(scopes, list | tuple) or not scopes:
        raise ConfigError(
            f"must be a non-empty list drawn from {', '.join(SCOPES)} (got {_show(scopes)})",
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
    return ApiKey(key=key, scopes=frozenset(normalised))


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _choices(enum: type[CounterType] | type[Cardinality]) -> str:
    return ", ".join(m.value for m in enum)


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
        raise ValueError(f"must be a positive integer (got {_show(value)})")
    return number


def _enum(enum: type[CounterType] | type[Cardinality]) -> Callable[[Any], Any]:
    def convert(value: object) -> Any:
        if isinstance(value, enum):
            return value
        if isinstance(value, str):
            key = value.strip().upper().replace("-", "_").replace(" ", "_")
            if key in enum.__members__:
                return enum[key]
        raise ValueError(f"must be one of {_choices(enum)} (got {_show(value)})")

    return convert


def _choice(allowed: tuple[str, ...]) -> Callable[[Any], str]:
    def convert(value: object) -> str:
        if isinstance(value, str) and value.strip().lower() in allowed:
            return value.strip().lower()
        raise ValueError(f"must be one of {', '.join(allowed)} (got {_show(value)})")

    return convert


def _duration(*, positive: bool) -> Callable[[Any], float]:
    def convert(value: object) -> float:
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            raise ValueError(f"invalid duration: {exc}") from None
        if positive and seconds <= 0:
            raise ValueError(f"must be a positive duration (got {_show(value)})")
        return seconds

    return convert


def _ttl(value: object) -> float | None:
    if value is None:
        return None  # explicit null: never expire
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise ValueError(f"invalid duration: {exc} (use null for no expiry)") from None
    if seconds <= 0:
        raise ValueError(f"must be a positive duration, or null for no expiry (got {_show(value)})")
    return seconds
