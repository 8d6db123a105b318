"""Load a namespace file (YAML or JSON) into a validated ``NamespaceRegistry``.

Bad configuration must stop the service at start-up with a message naming the file, namespace and
field; a typo that silently falls back to a preset would run production with settings nobody
chose. Accepted document shapes (see README-style header of ``examples/namespaces.yaml``):

* ``{defaults: {...}, namespaces: {name: {flat fields}}}``, our own shape;
* a namespace given as ``{persistence_configuration: [...]}`` (the Netflix post's shape), mixed
  freely with flat ones, optionally with flat fields next to it (``store``, ``cache``, ``api_keys``);
* ``namespaces:`` as a list of entries named by ``name`` or by their Netflix ``dataset``;
* a whole document that is one Netflix ``persistence_configuration`` (even the post's bare,
  commented, trailing-comma fragment).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from . import lenient_json
from .model import ConfigError, Namespace, NamespaceRegistry
from .netflix import KEY as NETFLIX_KEY
from .netflix import flatten_netflix, netflix_dataset
from .schema import Setting, flatten_flat, resolve_namespace, unknown_key_reason

__all__ = ["NAME_PATTERN", "default_config_path", "load_namespaces", "parse_namespaces"]

# Kafka record keys are "namespace:counter", so ':' (and anything exotic) is not allowed in names.
NAME_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_TOP_LEVEL_KEYS = ("defaults", "namespaces")
_EXAMPLE = Path(__file__).resolve().parent / "examples" / "namespaces.yaml"
_QUOTED_KEY = re.compile(r'"(?:[^"\\\n]|\\.)*"\s*:')
_BARE_MEMBER = re.compile(r'"(?:[^"\\\n]|\\.)*"\s*:\s*[\[{]')


def default_config_path() -> Path:
    """The shipped example file (four namespaces); a working config for local runs and tests."""
    return _EXAMPLE


def load_namespaces(path: str | os.PathLike[str]) -> NamespaceRegistry:
    """Read and validate a namespace file: ``.yaml``/``.yml`` is YAML, ``.json`` lenient JSON,
    anything else is tried as JSON, then YAML. Every failure is a ``ConfigError`` naming the file."""
    file = Path(path).expanduser()
    label = str(file)
    try:
        raw = file.read_bytes()
    except FileNotFoundError:
        raise ConfigError("config file not found", path=label) from None
    except IsADirectoryError:
        raise ConfigError("is a directory, expected a YAML or JSON file", path=label) from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file: {exc.strerror or exc}", path=label) from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", path=label) from None
    suffix = file.suffix.lower()
    fmt = "yaml" if suffix in (".yaml", ".yml") else "json" if suffix == ".json" else None
    try:
        return _build(_parse_text(text, fmt), source=label)
    except ConfigError as exc:
        raise (exc if exc.path else exc.with_path(label)) from None


def parse_namespaces(
    data: Mapping[str, Any] | list[Any] | str, *, source: str = "<string>"
) -> NamespaceRegistry:
    """Validate an already-parsed document, or raw YAML/JSON text (JSON tried first).

    ``source`` labels error messages (e.g. the environment variable the text came from).
    """
    label = None if source == "<string>" else source
    try:
        doc = _parse_text(data, None) if isinstance(data, str) else data
        return _build(doc, source=label)
    except ConfigError as exc:
        raise (exc if exc.path or not label else exc.with_path(label)) from None


# --- text -> document -------------------------------------------------------------------------


def _parse_text(text: str, fmt: str | None) -> Any:
    if not text.strip():
        raise ConfigError("config is empty: expected a 'namespaces' mapping")
    if fmt == "json":
        return _json(text)
    if fmt == "yaml":
        return _yaml(text)
    try:
        return _json(text)
    except ConfigError as json_error:
        if _json_styled(text):  # YAML would read broken JSON as something else and blame a field
            raise json_error from None
        try:
            doc = _yaml(text)
        except ConfigError as yaml_error:
            raise (json_error if _looks_like_json(text) else yaml_error) from None
        if isinstance(doc, Mapping | list):
            return doc
        raise json_error from None


def _looks_like_json(text: str) -> bool:
    try:
        head = lenient_json.strip_comments(text).lstrip()[:1]
    except ValueError:
        return True  # an unterminated /* comment: only JSON has those
    return head in ('{', '[', '"')


def _json_styled(text: str) -> bool:
    """Whether the text is meant as JSON, so its JSON error is the one to report: it opens a ``{``/``[`` holding a
    quoted key, or is a bare ``"key": {...}``/``[...]`` member (the Netflix post's fragment). YAML flow text
    (``{namespaces: {...}}``) has no quoted keys and still falls back to YAML."""
    try:
        cleaned = lenient_json.strip_comments(text).lstrip()
    except ValueError:
        return True  # an unterminated /* comment: only JSON has those
    if cleaned[:1] in ("{", "["):
        return _QUOTED_KEY.search(cleaned) is not None
    return _BARE_MEMBER.match(cleaned) is not None


def _json(text: str) -> Any:
    try:
        return lenient_json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"invalid JSON: {exc.msg}", line=exc.lineno, column=exc.colno) from None
    except ValueError as exc:  # duplicate keys
        raise ConfigError(f"invalid JSON: {exc}") from None
    except RecursionError:
        raise ConfigError("invalid JSON: nested too deeply") from None


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys (PyYAML silently keeps the last one)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # "<<: *anchor" overrides are intended
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            duplicate = key in seen
        except TypeError:  # unhashable key: let PyYAML report it
            continue
        if duplicate:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark,
                f"found duplicate key {key!r}", key_node.start_mark,
            )
        seen.add(key)
    loader.flatten_mapping(node)
    return dict(loader.construct_pairs(node, deep=deep))


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _yaml(text: str) -> Any:
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        reason = f"invalid YAML: {exc.problem or exc.context}"
        if mark is None:
            raise ConfigError(reason) from None
        raise ConfigError(reason, line=mark.line + 1, column=mark.column + 1) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {exc}") from None
    except RecursionError:  # PyYAML composes and constructs nested nodes recursively
        raise ConfigError("invalid YAML: nested too deeply") from None


# --- document -> registry ---------------------------------------------------------------------


def _build(doc: Any, *, source: str | None) -> NamespaceRegistry:
    if doc is None:
        raise ConfigError("config is empty: expected a 'namespaces' mapping")
    defaults: dict[str, Setting] = {}
    if isinstance(doc, list):
        entries = _from_list(doc, "")
    elif not isinstance(doc, Mapping):
        raise ConfigError(f"top level must be a mapping with a 'namespaces' key (got {type(doc).__name__})")
    elif NETFLIX_KEY in doc and "namespaces" not in doc:
        entries = iter([(_listed_name(doc, ""), doc)])  # the whole document is one Netflix namespace
    else:
        for key in doc:
            if key not in _TOP_LEVEL_KEYS:
                reason = unknown_key_reason(key, _TOP_LEVEL_KEYS, what="top-level key")
                raise ConfigError(reason, field=str(key))
        if "defaults" in doc:
            if not isinstance(doc["defaults"], Mapping):
                raise ConfigError("must be a mapping of namespace fields", field="defaults")
            defaults = flatten_flat(doc["defaults"], namespace=None, prefix="defaults.")
        namespaces = doc.get("namespaces")
        if isinstance(namespaces, Mapping):
            entries = iter(namespaces.items())
        elif isinstance(namespaces, list):
            entries = _from_list(namespaces, "namespaces")
        elif namespaces is None:
            raise ConfigError("no namespaces defined", field="namespaces")
        else:
            raise ConfigError(f"must be a mapping of name -> namespace (got {type(namespaces).__name__})",
                              field="namespaces")

    built: list[Namespace] = []
    seen: set[str] = set()
    for name, entry in entries:
        namespace = _namespace(name, entry, defaults)
        if namespace.name in seen:
            raise ConfigError("namespace defined more than once", namespace=namespace.name)
        seen.add(namespace.name)
        built.append(namespace)
    if not built:
        raise ConfigError("no namespaces defined", field="namespaces")
    return NamespaceRegistry(built, source=source)


def _from_list(items: list[Any], where: str) -> Iterator[tuple[str, Any]]:
    for i, item in enumerate(items):
        item_where = f"{where}[{i}]"
        if not isinstance(item, Mapping):
            raise ConfigError(f"must be a mapping (got {type(item).__name__})", field=item_where)
        yield _listed_name(item, item_where), item


def _listed_name(entry: Mapping[str, Any], where: str) -> str:
    name = entry.get("name")
    if name is None and NETFLIX_KEY in entry:
        name = netflix_dataset(entry)
    if name is None:
        field = f"{where}.name" if where else "name"
        raise ConfigError(
            f"missing: give a 'name' (or {NETFLIX_KEY}[COUNTER_ROLLUP].physical_storage.dataset)", field=field
        )
    return name


def _namespace(name: Any, entry: Any, defaults: Mapping[str, Setting]) -> Namespace:
    if not isinstance(name, str):
        raise ConfigError(f"namespace names must be strings; quote {name!r} in the file", namespace=str(name))
    if not NAME_PATTERN.fullmatch(name):
        raise ConfigError(
            "invalid namespace name: use 1-64 of A-Z a-z 0-9 _ . - "
            "(no ':', Kafka keys are 'namespace:counter')",
            namespace=name,
        )
    if not isinstance(entry, Mapping):
        raise ConfigError(
            f"must be a mapping of fields, at least counter_type (got {type(entry).__name__})", namespace=name
        )
    if "name" in entry and entry["name"] != name:
        raise ConfigError(f"{entry['name']!r} does not match the namespace key {name!r}", namespace=name,
                          field="name")
    if NETFLIX_KEY not in entry:
        return resolve_namespace(name, flatten_flat(entry, namespace=name, extra_keys=("name",)), defaults)
    own = flatten_netflix(entry, namespace=name)
    for field, setting in flatten_flat(entry, namespace=name, extra_keys=("name", NETFLIX_KEY)).items():
        if field in own:
            raise ConfigError(f"also set at {own[field].where}; set it in one place only", namespace=name,
                              field=setting.where)
        own[field] = setting
    return resolve_namespace(name, own, defaults)
