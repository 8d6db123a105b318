"""A namespace's resolved configuration as plain JSON values, for operators (GET /v1/namespaces): never its keys.

Built from the dataclass fields of `control_plane.Namespace` rather than a hand-kept list, so settings the
control plane gains later (dimensions, unique counts, Top-K...) show up without touching this module. What is
secret is dropped by name (`api_keys`) and by type (any `ApiKey`, wherever it sits).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from enum import Enum
from typing import Any

from control_plane import ApiKey, Namespace, Windows

HIDDEN = frozenset({"name", "counter_type", "api_keys"})  # name and type are shown beside the configuration


def namespace_config(ns: Namespace) -> dict[str, Any]:
    """Every setting of the namespace but its name, type and API keys, as JSON-ready values."""
    return {f.name: _plain(getattr(ns, f.name)) for f in fields(ns) if f.name not in HIDDEN}


def _plain(value: Any) -> Any:
    if isinstance(value, ApiKey):
        return None
    if isinstance(value, Windows):  # granularities with their retention, readable: {"minute": 172800.0, ...}
        return {"granularities": list(value.granularities), "retention_s": dict(value.retention)}
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)
                if not isinstance(getattr(value, f.name), ApiKey)}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, frozenset | set):
        return sorted(_plain(v) for v in value)
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value if not isinstance(v, ApiKey)]
    return value
