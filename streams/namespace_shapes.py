"""What a namespace's stored data was made under, recorded in Kafka: a fence against a setting changed in place.

Why: most namespace settings may change between restarts, but a few change what the data already stored means
(infra/README.md, Upgrades): a namespace made BEST_EFFORT hides its stored counts (and one made durable ignores the
cache's), a changed `aggregation` reads SUM counts as sketches (0) or sketches as sums, and a window granularity
dropped and kept again has buckets that missed every write in between, so its windows read short with no error.
Nothing said so. The first worker, API or `counter up` to start records each namespace's shape (its counter type's
kind, its aggregation, the granularities it keeps and every one it ever kept) in the store bindings topic
(`streams.store_binding`), keyed `<consumer group>/namespace/<name>`; a later start whose configuration changes one of
those in place refuses, naming the namespace and the field, unless `COUNTER_ACCEPT_NAMESPACE_CHANGES` names the
namespace: then the new shape is recorded and the change taken as the operator's. A granularity kept for the first
time, or no longer kept, is recorded without a word (its windows start empty, or are refused). `counter up`'s own
broker keeps nothing across restarts, so it saves the shapes in its data directory (`save_shapes`) and records them
in its next broker (`restore_shapes`).
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from control_plane import CounterType, Namespace, NamespaceRegistry
from streams.settings import Settings
from streams.store_binding import append_records, read_records
from streams.topics import ensure_topics, stores_spec

KEY_PART = "/namespace/"  # a shape's key: <consumer group>/namespace/<namespace>
log = logging.getLogger(__name__)


def kind_of(counter_type: CounterType) -> str:
    """What a counter type keeps: BEST_EFFORT counts in the cache; EVENTUAL and ACCURATE the same events and
    rollups, read two ways (changing between those two is safe)."""
    return "BEST_EFFORT" if counter_type is CounterType.BEST_EFFORT else "EVENTUAL/ACCURATE"


@dataclass(frozen=True, slots=True)
class NamespaceShape:
    """One record of a namespace's shape."""

    kind: str  # kind_of(counter_type)
    aggregation: str
    granularities: tuple[str, ...]  # kept now
    ever_kept: tuple[str, ...]  # kept at any time since the first record
    host: str = "?"
    at: str = "?"  # ISO 8601, UTC

    @classmethod
    def of(cls, ns: Namespace, ever_kept: Iterable[str] = ()) -> NamespaceShape:
        kept = tuple(ns.windows.granularities)
        ever = tuple(sorted({*ever_kept, *kept}))
        return cls(kind_of(ns.counter_type), str(ns.aggregation.value), kept, ever, socket.gethostname(),
                   datetime.now(UTC).isoformat(timespec="seconds"))

    def same_as(self, other: NamespaceShape) -> bool:
        """The same shape, whoever recorded it when."""
        return (self.kind, self.aggregation, self.granularities, self.ever_kept) == (
            other.kind, other.aggregation, other.granularities, other.ever_kept)

    def encode(self) -> bytes:
        return json.dumps({"kind": self.kind, "aggregation": self.aggregation, "granularities": self.granularities,
                           "ever_kept": self.ever_kept, "host": self.host, "at": self.at},
                          separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes | None) -> NamespaceShape | None:
        """The shape a record holds; None for one that is not a shape."""
        try:
            data = json.loads(raw or b"")
            return cls(str(data["kind"]), str(data["aggregation"]), tuple(map(str, data["granularities"])),
                       tuple(map(str, data["ever_kept"])), str(data.get("host", "?")), str(data.get("at", "?")))
        except (ValueError, TypeError, KeyError):
            return None


class NamespaceChanged(RuntimeError):
    """A namespace's configuration changes in place what its stored data means."""


def shape_key(group: str, namespace: str) -> bytes:
    return f"{group}{KEY_PART}{namespace}".encode()


def shapes_of(records: Iterable[tuple[bytes | None, bytes | None]], group: str) -> dict[str, NamespaceShape]:
    """Each namespace's latest shape in the bindings topic's records (key, value), in log order."""
    prefix = f"{group}{KEY_PART}".encode()
    shapes: dict[str, NamespaceShape] = {}
    for key, value in records:
        if key is not None and key.startswith(prefix) and (shape := NamespaceShape.decode(value)) is not None:
            shapes[key[len(prefix):].decode("utf-8", "replace")] = shape
    return shapes


def changes(recorded: NamespaceShape, ns: Namespace) -> list[str]:
    """What `ns` changes in place against its recorded shape, one sentence per field; [] for none."""
    found: list[str] = []
    since = f"(recorded {recorded.at} from {recorded.host})"
    if kind_of(ns.counter_type) != recorded.kind:
        found.append(f"field 'counter_type': {ns.counter_type.value} where the stored data is {recorded.kind} "
                     f"{since}: the counts stored so far would be hidden (a BEST_EFFORT namespace reads the cache, "
                     "the others the store), and writes in flight dead-lettered")
    if str(ns.aggregation.value) != recorded.aggregation:
        found.append(f"field 'aggregation': {ns.aggregation.value} where the stored data is {recorded.aggregation} "
                     f"{since}: its stored counts would be read as the other kind (SUM counts as empty sketches)")
    back = [g for g in ns.windows.granularities if g not in recorded.granularities and g in recorded.ever_kept]
    if back:
        found.append(f"field 'windows.granularities': {', '.join(back)} kept again after it was dropped {since}: "
                     "its buckets missed every write in between, so its windows would read short")
    return found


def check_shapes(records: Iterable[tuple[bytes | None, bytes | None]], group: str, registry: NamespaceRegistry,
                 accept: Collection[str]) -> tuple[dict[str, str], dict[str, NamespaceShape]]:
    """(problems, shapes to record) for `registry` against the recorded shapes: what each namespace changed in place
    and not in `accept` changes; a new shape for every namespace first seen, changed harmlessly, or accepted."""
    recorded = shapes_of(records, group)
    problems: dict[str, str] = {}
    new: dict[str, NamespaceShape] = {}
    for ns in registry.values():
        before = recorded.get(ns.name)
        if before is None:
            new[ns.name] = NamespaceShape.of(ns)
            continue
        found = changes(before, ns)
        if found and ns.name not in accept:
            problems[ns.name] = f"namespace {ns.name!r}: " + "; ".join(found)
            continue
        shape = NamespaceShape.of(ns, before.ever_kept)
        if not shape.same_as(before):
            new[ns.name] = shape
    return problems, new


def save_shapes(settings: Settings, path: Path, *, timeout_s: float = 15.0) -> int:
    """Write the consumer group's recorded shapes to `path` (JSON), replacing it at once; returns how many. For a
    broker that keeps nothing across restarts (`counter up`'s own): `restore_shapes` fills the next one's."""
    shapes = shapes_of(_records(settings, timeout_s), settings.worker_id)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps({name: json.loads(shape.encode()) for name, shape in shapes.items()}, indent=1))
    os.replace(temporary, path)
    return len(shapes)


def restore_shapes(settings: Settings, path: Path, *, timeout_s: float = 15.0) -> int:
    """Record the shapes `save_shapes` wrote to `path` where none is recorded yet (a fresh broker); returns how
    many. The store bindings topic must exist."""
    if not path.exists():
        return 0
    recorded = shapes_of(_records(settings, timeout_s), settings.worker_id)
    saved = {name: NamespaceShape.decode(json.dumps(value).encode())
             for name, value in json.loads(path.read_text()).items()}
    missing = {name: shape for name, shape in saved.items() if shape is not None and name not in recorded}
    _record(settings, missing, timeout_s)
    return len(missing)


def guard_namespaces(settings: Settings, registry: NamespaceRegistry, *, timeout_s: float = 15.0) -> list[str]:
    """Record the namespaces' shapes, or raise NamespaceChanged naming every one changed in place (module doc).
    Returns the namespaces recorded before and no longer configured, after logging a warning naming them (a
    removal is the operator's to make, but their writes are then dead-lettered: nothing said so). The broker's
    errors propagate."""
    ensure_topics(settings.kafka_bootstrap or "", [stores_spec(settings)], timeout=timeout_s,
                  admin_config=settings.kafka_security.librdkafka())
    records = _records(settings, timeout_s)
    problems, new = check_shapes(records, settings.worker_id, registry, settings.accept_namespace_changes)
    removed = removed_namespaces(records, settings.worker_id, registry)
    if removed:
        log.warning(removed_warning(removed))
    if problems:
        raise NamespaceChanged(
            "; ".join(problems.values()) + ". Write to a new namespace instead (infra/README.md, Upgrades), or, to "
            f"take the change as it is anyway, start once with COUNTER_ACCEPT_NAMESPACE_CHANGES={','.join(problems)}")
    _record(settings, new, timeout_s)
    return removed


def removed_namespaces(records: Iterable[tuple[bytes | None, bytes | None]], group: str,
                       registry: NamespaceRegistry) -> list[str]:
    """The namespaces whose shape is recorded and that `registry` no longer holds, by name."""
    return sorted(set(shapes_of(records, group)) - set(registry.names()))


def removed_warning(removed: Collection[str]) -> str:
    return (f"namespace(s) {', '.join(map(repr, removed))} were configured before and are not now: their writes, "
            "from any client still sending them, are dead-lettered (unknown namespace), and their stored counts are "
            "not served. Their data is kept: configured again with the same settings, they are served again")


def _records(settings: Settings, timeout_s: float) -> list[tuple[bytes | None, bytes | None]]:
    """The store bindings topic's records (shapes among them)."""
    return read_records(settings.kafka_bootstrap or "", settings.stores_topic, settings.kafka_security.librdkafka(),
                        timeout_s)


def _record(settings: Settings, shapes: Mapping[str, NamespaceShape], timeout_s: float) -> None:
    """Append these namespaces' shapes to the store bindings topic, with one producer."""
    if shapes:
        append_records(settings.kafka_bootstrap or "", settings.stores_topic,
                       [(shape_key(settings.worker_id, name), shape.encode()) for name, shape in shapes.items()],
                       settings.kafka_security.librdkafka(), timeout_s)
