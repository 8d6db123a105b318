"""Dimensions: how a count is sliced (`{"country": "US", "device": "tv"}`), and how a slice is named.

A combination is a counter in its own right (DESIGN invariant 7). For counter `views` and dimensions
`{device: tv, country: US}` the combination counter is named

    views country=US device=tv

the base name, then `key=value` pairs sorted by key, each after a single space. User counter names never hold
whitespace (`validate_counter_name`), so no user counter can collide with a combination, and the name splits back
unambiguously (`split_combination`). Keys are identifiers a namespace declares (`[a-z][a-z0-9_]{0,31}`); values
are 1-64 UTF-8 bytes without whitespace, control characters or '='.

A write to `views` with dimensions D is counted in `views` and in the combination of every non-empty subset of D
(`subset_combinations`), so a filter on any subset of the keys reads one counter. Everything that names counters
internally (rollup signals, stores, caches) accepts both forms: `validate_internal_counter_name`.

The `item` of a mutation (what a UNIQUE namespace counts, e.g. a user id) is validated here too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from itertools import combinations as _choose
from typing import Any

from schemas.validation import (
    ASCII_COUNTER_MATCH,
    MAX_COUNTER_NAME_BYTES,
    ValidationError,
    short_repr,
    validate_counter_name,
)

__all__ = [
    "MAX_DIMENSIONS",
    "MAX_DIMENSION_KEY_LEN",
    "MAX_DIMENSION_VALUE_BYTES",
    "MAX_INTERNAL_COUNTER_BYTES",
    "MAX_ITEM_BYTES",
    "Dimensions",
    "combination",
    "dimension_signature",
    "is_combination",
    "split_combination",
    "split_signature",
    "subset_combinations",
    "validate_dimension_key",
    "validate_dimension_value",
    "validate_dimensions",
    "validate_internal_counter_name",
    "validate_item",
]

Dimensions = tuple[tuple[str, str], ...]
"""A write's dimensions as (key, value) pairs sorted by key (the form `Mutation.dimensions` holds)."""

MAX_DIMENSIONS = 4
"""Keys per write (and per namespace): a write is counted in 2^n counters (the base and every non-empty subset)."""
MAX_DIMENSION_KEY_LEN = 32
MAX_DIMENSION_VALUE_BYTES = 64
MAX_ITEM_BYTES = 256
MAX_INTERNAL_COUNTER_BYTES = MAX_COUNTER_NAME_BYTES + MAX_DIMENSIONS * (1 + MAX_DIMENSION_KEY_LEN + 1
                                                                        + MAX_DIMENSION_VALUE_BYTES)
"""The longest combination name: a base name and MAX_DIMENSIONS `key=value` pairs."""

_KEY_RE = re.compile(rf"[a-z][a-z0-9_]{{0,{MAX_DIMENSION_KEY_LEN - 1}}}")
_ASCII_VALUE_RE = re.compile(rf"[!-<>-~]{{1,{MAX_DIMENSION_VALUE_BYTES}}}")  # printable ASCII but ' ' and '='
_BAD_VALUE_CHAR_RE = re.compile(r"[\s\x00-\x1f\x7f-\x9f=]")  # \s is Unicode-aware on str patterns
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _key_field(field: str, key: object) -> str:
    """`dimensions.<key>` when the key reads as a path segment, else `dimensions` (the message shows it)."""
    return f"{field}.{key}" if isinstance(key, str) and key.isprintable() and 0 < len(key) <= 64 else field


def validate_dimension_key(key: Any, *, field: str = "dimensions") -> str:
    """Return `key` if it is an identifier `[a-z][a-z0-9_]{0,31}`; ValidationError naming `field.<key>`."""
    if type(key) is str and _KEY_RE.fullmatch(key):
        return key
    where = _key_field(field, key)
    if not isinstance(key, str):
        raise ValidationError(where, f"a dimension key must be a string, got {type(key).__name__}")
    raise ValidationError(where, f"dimension key {short_repr(key)} must be a lower-case identifier "
                                 f"([a-z][a-z0-9_]*, at most {MAX_DIMENSION_KEY_LEN} characters)")


def validate_dimension_value(value: Any, *, field: str = "dimensions") -> str:
    """Return `value` if it is 1-64 UTF-8 bytes without whitespace, control characters or '='."""
    if type(value) is str and value.isascii() and _ASCII_VALUE_RE.fullmatch(value):
        return value
    if not isinstance(value, str):
        got = "null" if value is None else type(value).__name__
        raise ValidationError(field, f"must be a string, got {got}")
    value = str.__str__(value)
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValidationError(field, "is not valid UTF-8 (contains a lone surrogate)") from None
    if size == 0:
        raise ValidationError(field, "must not be empty")
    if size > MAX_DIMENSION_VALUE_BYTES:
        raise ValidationError(field, f"must be at most {MAX_DIMENSION_VALUE_BYTES} UTF-8 bytes, got {size}")
    bad = _BAD_VALUE_CHAR_RE.search(value)
    if bad is not None:
        raise ValidationError(field, f"must not contain whitespace, control characters or '=', found "
                                     f"{bad.group()!r} in {short_repr(value)}")
    return value


def validate_dimensions(value: Any, *, field: str = "dimensions") -> Dimensions:
    """Dimensions as sorted (key, value) pairs, from a mapping or pairs; None or empty is `()` (no dimensions).

    At most MAX_DIMENSIONS keys, each an identifier, each once; values as `validate_dimension_value`. Whether a
    namespace declares the keys is the namespace's business (control_plane), not the wire format's."""
    if value is None:
        return ()
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, (list, tuple)):
        items = []
        for pair in value:
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
                raise ValidationError(field, f"must be a map of key -> value, got an item {short_repr(pair)}")
            items.append((pair[0], pair[1]))
    else:
        raise ValidationError(field, f"must be a map of key -> value, got {type(value).__name__}")
    if not items:
        return ()
    if len(items) > MAX_DIMENSIONS:
        raise ValidationError(field, f"at most {MAX_DIMENSIONS} dimensions, got {len(items)}")
    out: dict[str, str] = {}
    for key, raw in items:
        key = validate_dimension_key(key, field=field)
        if key in out:
            raise ValidationError(f"{field}.{key}", "given more than once")
        out[key] = validate_dimension_value(raw, field=f"{field}.{key}")
    return tuple(sorted(out.items()))


def validate_item(item: Any, *, field: str = "item") -> str:
    """Return the item (what a UNIQUE namespace counts) if it is 0-256 UTF-8 bytes without control characters;
    "" means none."""
    if type(item) is str and (item == "" or (item.isascii() and len(item) <= MAX_ITEM_BYTES
                                             and _CONTROL_RE.search(item) is None)):
        return item
    if not isinstance(item, str):
        raise ValidationError(field, f"must be a string, got {'null' if item is None else type(item).__name__}")
    item = str.__str__(item)
    try:
        size = len(item.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValidationError(field, "is not valid UTF-8 (contains a lone surrogate)") from None
    if size > MAX_ITEM_BYTES:
        raise ValidationError(field, f"must be at most {MAX_ITEM_BYTES} UTF-8 bytes, got {size}")
    if _CONTROL_RE.search(item):
        raise ValidationError(field, f"must not contain control characters: {short_repr(item)}")
    return item


# --------------------------------------------------------------------------- naming


def combination(counter: str, dimensions: Mapping[str, str] | Iterable[tuple[str, str]]) -> str:
    """The counter of one combination: `views country=US device=tv` (pairs sorted by key). No dimensions name
    the counter itself. The parts are not validated here (see validate_dimensions)."""
    pairs = sorted(dimensions.items() if isinstance(dimensions, Mapping) else dimensions)
    if not pairs:
        return counter
    return counter + "".join(f" {k}={v}" for k, v in pairs)


def split_combination(name: str) -> tuple[str, Dimensions]:
    """`views country=US device=tv` -> (`views`, (("country", "US"), ("device", "tv"))); a plain counter name
    -> (name, ()). ValueError for a name that is not a well-formed combination (see
    validate_internal_counter_name for the full check)."""
    if " " not in name:
        return name, ()
    counter, *parts = name.split(" ")
    pairs = []
    for part in parts:
        key, sep, value = part.partition("=")
        if not sep or not key or not value:
            raise ValueError(f"not a dimension combination: {short_repr(name)} "
                             f"(part {short_repr(part)} is not key=value)")
        pairs.append((key, value))
    return counter, tuple(pairs)


def dimension_signature(dimensions: Mapping[str, str] | Iterable[tuple[str, str]]) -> str:
    """The dimensions part of a combination's name: `country=BR device=tv` (pairs sorted by key), "" for none. The
    counters sharing one signature are the counters of one filter ("titles in Brazil"): Top-K ranks them."""
    return combination("", dimensions)[1:]


def split_signature(name: str) -> tuple[str, str]:
    """`views country=US device=tv` -> (`views`, `country=US device=tv`); a plain counter name -> (name, ""). The
    inverse of `combination(base, pairs)` for names the service wrote (not validated)."""
    base, _, signature = name.partition(" ")
    return base, signature


def is_combination(name: str) -> bool:
    """Whether a (valid) internal counter name is a combination rather than a base counter."""
    return " " in name


def subset_combinations(counter: str, dimensions: Dimensions) -> tuple[str, ...]:
    """The combination counters a write with `dimensions` (sorted pairs) is counted in besides `counter`: one
    per non-empty subset, 2^n - 1 of them, the full combination last."""
    n = len(dimensions)
    return tuple(combination(counter, chosen) for size in range(1, n + 1) for chosen in _choose(dimensions, size))


def validate_internal_counter_name(name: Any, *, field: str = "counter") -> str:
    """Return `name` if it names a counter inside the service: a user counter name (validate_counter_name) or a
    combination of one (base name, then 1-4 ` key=value` pairs with keys strictly ascending). Used where the
    service reads counter names it wrote itself (rollup signals)."""
    if type(name) is str and name.isascii() and ASCII_COUNTER_MATCH(name):
        return name
    if not isinstance(name, str) or " " not in name:
        return validate_counter_name(name, field=field)
    name = str.__str__(name)
    try:
        counter, pairs = split_combination(name)
    except ValueError as exc:
        raise ValidationError(field, str(exc)) from None
    validate_counter_name(counter, field=field)
    if len(pairs) > MAX_DIMENSIONS:
        raise ValidationError(field, f"a combination has at most {MAX_DIMENSIONS} dimensions: {short_repr(name)}")
    try:
        keys = [validate_dimension_key(k) for k, _ in pairs]
        for _, value in pairs:
            validate_dimension_value(value)
    except ValidationError as exc:
        raise ValidationError(field, f"{exc.reason} in combination {short_repr(name)}") from None
    if keys != sorted(set(keys)):
        raise ValidationError(field, f"a combination's keys are sorted and distinct: {short_repr(name)}")
    return name
