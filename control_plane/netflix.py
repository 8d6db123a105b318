"""Read a namespace written in the Netflix post's ``persistence_configuration`` shape.

The post configures a namespace as three entries: ``CACHE`` (the counter cache), ``COUNTER_ROLLUP``
(cardinality, counter type, rollup queues) and ``EVENT_STORAGE`` (TimeSeries partitioning, accept
limit, retention). We map them onto our flat field paths, each remembering its path in the
document so errors point at the JSON the operator actually wrote.

Time windows (not in the post) go in ``COUNTER_ROLLUP.config.windows``, in the flat shape's form
``{granularities: [...], retention: {...}}``, or next to ``persistence_configuration`` as ``windows``.
Dimensions (not in the post either) likewise: ``COUNTER_ROLLUP.config.dimensions`` as
``{keys: [country, device], max_combinations: 1000}``, or ``dimensions`` next to ``persistence_configuration``.
So is ``shards`` (the Kafka keys a counter's writes are spread over): ``COUNTER_ROLLUP.config.shards``, or
``shards`` next to ``persistence_configuration``.
So are ``aggregation`` (SUM or UNIQUE) and ``unique: {lg_k}``: ``COUNTER_ROLLUP.config.aggregation`` and
``COUNTER_ROLLUP.config.unique``, or next to ``persistence_configuration``.

``physical_storage`` (EVCACHE/CASSANDRA clusters) is informational: the service-wide COUNTER_STORE /
COUNTER_CACHE serve every namespace (``store`` / ``cache`` keys next to ``persistence_configuration`` may
only name those: see ``streams.settings.backend_problems``). Its ``dataset`` names the namespace when
nothing else does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .model import ConfigError
from .schema import Setting, flatten_windows, unknown_key_reason

__all__ = ["KEY", "flatten_netflix", "netflix_dataset"]

KEY = "persistence_configuration"

_ENTRY_KEYS: Mapping[str, tuple[str, ...]] = {
    "CACHE": ("id", "scope", "physical_storage", "config"),
    "COUNTER_ROLLUP": ("id", "scope", "physical_storage", "counter_cardinality", "config"),
    "EVENT_STORAGE": ("id", "scope", "physical_storage", "config", "lifecycleConfigs"),
}
_TYPE_CONFIGS: Mapping[str, str] = {
    "eventual_counter_config": "EVENTUAL",
    "accurate_counter_config": "ACCURATE",
    "best_effort_counter_config": "BEST_EFFORT",
}


def netflix_dataset(doc: Mapping[str, Any]) -> str | None:
    """``COUNTER_ROLLUP.physical_storage.dataset`` if present (tolerant: validation comes later)."""
    entries = doc.get(KEY)
    if not isinstance(entries, list):
        return None
    for entry in entries:
        if isinstance(entry, Mapping) and entry.get("id") == "COUNTER_ROLLUP":
            storage = entry.get("physical_storage")
            if isinstance(storage, Mapping) and isinstance(storage.get("dataset"), str):
                return storage["dataset"]
    return None


def flatten_netflix(doc: Mapping[str, Any], *, namespace: str, prefix: str = "") -> dict[str, Setting]:
    """Our dotted fields from ``doc[KEY]``; every unknown id or key is an error naming its path."""
    return _Reader(namespace, prefix + KEY).read(doc[KEY])


class _Reader:
    def __init__(self, namespace: str, root: str) -> None:
        self.namespace = namespace
        self.root = root
        self.out: dict[str, Setting] = {}

    def fail(self, where: str, reason: str) -> ConfigError:
        return ConfigError(reason, namespace=self.namespace, field=where)

    def mapping(self, value: object, where: str, allowed: tuple[str, ...]) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(where, f"must be a mapping (got {_kind(value)})")
        for key in value:
            if key not in allowed:
                raise self.fail(f"{where}.{key}", unknown_key_reason(key, allowed))
        return value

    def put(self, field: str, value: object, where: str) -> None:
        self.out[field] = Setting(value, where)

    def read(self, entries: object) -> dict[str, Setting]:
        if not isinstance(entries, list) or not entries:
            raise self.fail(
                self.root, "must be a non-empty list of {id: CACHE|COUNTER_ROLLUP|EVENT_STORAGE, ...} entries"
            )
        seen: set[str] = set()
        for i, entry in enumerate(entries):
            if not isinstance(entry, Mapping):
                raise self.fail(f"{self.root}[{i}]", f"must be a mapping (got {_kind(entry)})")
            entry_id: Any = entry.get("id")  # the document's value: a str once found in _ENTRY_KEYS
            if entry_id not in _ENTRY_KEYS:
                raise self.fail(
                    f"{self.root}[{i}].id", unknown_key_reason(entry_id, tuple(_ENTRY_KEYS), what="id")
                )
            if entry_id in seen:
                raise self.fail(f"{self.root}[{i}].id", f"{entry_id} appears more than once")
            seen.add(entry_id)
            where = f"{self.root}[{entry_id}]"
            self.mapping(entry, where, _ENTRY_KEYS[entry_id])
            storage = entry.get("physical_storage", {})
            if not isinstance(storage, Mapping):  # informational, but a mangled document must be noticed
                raise self.fail(f"{where}.physical_storage", f"must be a mapping (got {_kind(storage)})")
            getattr(self, "_" + entry_id.lower())(entry, where)
        if "COUNTER_ROLLUP" not in seen:
            raise self.fail(self.root, "needs a COUNTER_ROLLUP entry (it declares config.counter_type)")
        return self.out

    def _cache(self, entry: Mapping[str, Any], where: str) -> None:
        if "config" in entry:
            config = self.mapping(entry["config"], f"{where}.config", ("ttl",))
            if "ttl" in config:
                self.put("ttl", config["ttl"], f"{where}.config.ttl")

    def _counter_rollup(self, entry: Mapping[str, Any], where: str) -> None:
        if "counter_cardinality" in entry:
            self.put("cardinality", entry["counter_cardinality"], f"{where}.counter_cardinality")
        if "config" not in entry:
            raise self.fail(f"{where}.config", "is required (it declares counter_type)")
        config = self.mapping(entry["config"], f"{where}.config",
                              ("counter_type", "windows", "dimensions", "shards", "aggregation", "unique",
                               *_TYPE_CONFIGS))
        if "windows" in config:  # not in the post: our time-windowed counts, kept by the rollup agents
            self.out.update(flatten_windows(config["windows"], namespace=self.namespace,
                                            where=f"{where}.config.windows"))
        if "dimensions" in config:  # not in the post: counts sliced by declared dimensions
            self._section("dimensions", config["dimensions"], f"{where}.config.dimensions",
                          ("keys", "max_combinations"))
        if "shards" in config:  # not in the post: a hot counter's writes spread over several Kafka keys
            self.put("shards", config["shards"], f"{where}.config.shards")
        if "aggregation" in config:  # not in the post: SUM (default) or UNIQUE (distinct items, HLL sketches)
            self.put("aggregation", config["aggregation"], f"{where}.config.aggregation")
        if "unique" in config:
            self._section("unique", config["unique"], f"{where}.config.unique", ("lg_k",))
        if "counter_type" not in config:
            raise self.fail(
                f"{where}.config.counter_type", "is required; must be one of BEST_EFFORT, EVENTUAL, ACCURATE"
            )
        counter_type = config["counter_type"]
        self.put("counter_type", counter_type, f"{where}.config.counter_type")
        present = [k for k in _TYPE_CONFIGS if k in config]
        if len(present) > 1:
            raise self.fail(f"{where}.config.{present[1]}", f"only one of {', '.join(present)} may be given")
        if not present:
            return
        key = present[0]
        declared = str(counter_type).strip().upper() if isinstance(counter_type, str) else None
        # ACCURATE is "a slightly modified EVENTUAL counter" in the post: its eventual config fits.
        if declared in _TYPE_CONFIGS.values() and _TYPE_CONFIGS[key] != declared and not (
            declared == "ACCURATE" and key == "eventual_counter_config"
        ):
            raise self.fail(f"{where}.config.{key}", f"does not match counter_type {declared}")
        type_where = f"{where}.config.{key}"
        type_config = self.mapping(config[key], type_where, ("internal_config",))
        if "internal_config" not in type_config:
            return
        internal_where = f"{type_where}.internal_config"
        internal = self.mapping(
            type_config["internal_config"], internal_where, ("queue_config", "rollup_batch_count")
        )
        if "rollup_batch_count" in internal:
            self.put(
                "rollup_batch_count", internal["rollup_batch_count"], f"{internal_where}.rollup_batch_count"
            )
        if "queue_config" in internal:
            self._section("queue_config", internal["queue_config"], f"{internal_where}.queue_config",
                          ("num_queues", "coalesce_ms", "capacity_bytes"))

    def _event_storage(self, entry: Mapping[str, Any], where: str) -> None:
        if "config" in entry:
            config_where = f"{where}.config"
            config = self.mapping(
                entry["config"], config_where, ("time_partition", "accept_limit", "max_clock_skew")
            )
            if "time_partition" in config:
                self._section("time_partition", config["time_partition"], f"{config_where}.time_partition",
                              ("buckets_per_id", "seconds_per_bucket", "seconds_per_slice"))
            for key in ("accept_limit", "max_clock_skew"):
                if key in config:
                    self.put(key, config[key], f"{config_where}.{key}")
        if "lifecycleConfigs" in entry:
            lc_where = f"{where}.lifecycleConfigs"
            lifecycle = self.mapping(entry["lifecycleConfigs"], lc_where, ("lifecycleConfig",))
            items = lifecycle.get("lifecycleConfig", [])
            if not isinstance(items, list):
                raise self.fail(f"{lc_where}.lifecycleConfig", "must be a list of {type, config}")
            retention_seen = False
            for i, item in enumerate(items):
                item_where = f"{lc_where}.lifecycleConfig[{i}]"
                item = self.mapping(item, item_where, ("type", "config"))
                if item.get("type") != "retention":
                    raise self.fail(f"{item_where}.type", unknown_key_reason(item.get("type"), ("retention",),
                                                                             what="lifecycle type"))
                if retention_seen:
                    raise self.fail(f"{item_where}.type", "retention appears more than once")
                retention_seen = True
                self._section("retention", item.get("config", {}), f"{item_where}.config",
                              ("close_after", "delete_after"))

    def _section(self, section: str, value: object, where: str, keys: tuple[str, ...]) -> None:
        for key, sub_value in self.mapping(value, where, keys).items():
            self.put(f"{section}.{key}", sub_value, f"{where}.{key}")


def _kind(value: object) -> str:
    return type(value).__name__
