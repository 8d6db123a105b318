"""Control plane: load and validate the namespace configuration.

Each namespace picks a counter type, a cardinality preset and optional overrides (TTL, rollup
queues, time partitioning, accept limit, retention, time windows, dimensions, unique counts, backends, API keys).
Files may use our flat shape or the Netflix post's ``persistence_configuration`` shape. Anything wrong raises
``ConfigError`` at start-up, naming the file, namespace and field.
"""

from .durations import parse_duration
from .loader import default_config_path, load_namespaces, parse_namespaces
from .model import (
    GRANULARITIES,
    Aggregation,
    ApiKey,
    Cardinality,
    ConfigError,
    CounterType,
    DimensionConfig,
    Namespace,
    NamespaceRegistry,
    QueueConfig,
    Retention,
    TimePartition,
    UniqueConfig,
    Windows,
)
from .presets import PRESETS, preset_fields

__all__ = [
    "GRANULARITIES",
    "PRESETS",
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
    "default_config_path",
    "load_namespaces",
    "parse_duration",
    "parse_namespaces",
    "preset_fields",
]
