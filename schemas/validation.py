"""Validation of names, deltas, idempotency tokens and generation times.

Why strict: an accepted mutation becomes an immutable event keyed by these values (DESIGN invariant 1),
so anything ambiguous (a float delta, a name with ':' that would collide in the "namespace:counter"
record key, a time in an unknown unit) is rejected at the edge with the field named, never guessed at.
Every check has an allocation-free fast path, because the persist agent runs them per record.
"""

from __future__ import annotations

import math
import re
import time
from datetime import UTC, datetime, timedelta
from decimal import ROUND_FLOOR, Decimal, InvalidOperation
from typing import Any, cast

from schemas.model import MICROS, Mutation, MutationOp

MAX_NAMESPACE_LEN = 64
MAX_COUNTER_NAME_BYTES = 200
MAX_TOKEN_BYTES = 256
MAX_ITEM_KEY_BYTES = 256
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MICRO = timedelta(microseconds=1)
MIN_EVENT_TIME = (datetime(2000, 1, 1, tzinfo=UTC) - _EPOCH) // _ONE_MICRO
"""Earliest accepted event time (2000-01-01T00:00:00Z) in epoch µs: older values are unit mistakes."""
MAX_EVENT_TIME = (datetime(2201, 1, 1, tzinfo=UTC) - _EPOCH) // _ONE_MICRO - 1
"""Latest accepted event time (2200-12-31T23:59:59.999999Z) in epoch µs."""

# Epoch numbers carry no unit, so the unit is chosen by magnitude. The ranges cannot overlap within
# the accepted years 2000..2200: seconds are < 7.3e9, milliseconds 9.4e11..7.3e12, microseconds >= 9.4e14.
SECONDS_BELOW = 10**11
MILLIS_BELOW = 10**14

_NAMESPACE_RE = re.compile(rf"[A-Za-z0-9_.-]{{1,{MAX_NAMESPACE_LEN}}}")
_ASCII_COUNTER_RE = re.compile(rf"[!-~]{{1,{MAX_COUNTER_NAME_BYTES}}}")  # printable ASCII, no space
_BAD_NAME_CHAR_RE = re.compile(r"[\s\x00-\x1f\x7f-\x9f]")  # \s is Unicode-aware on str patterns
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")
NAMESPACE_MATCH = _NAMESPACE_RE.fullmatch
ASCII_COUNTER_MATCH = _ASCII_COUNTER_RE.fullmatch
CONTROL_SEARCH = _CONTROL_RE.search
_NUMERIC_RE = re.compile(r"[+-]?[0-9]+(?:\.[0-9]+)?")
# an offset with seconds and a fraction ("+05:30:30.5"): RFC 3339 has none, and Python 3.11 reads "+00:00:00.123" as UTC
_FRACTIONAL_OFFSET = re.compile(r"[+-][0-9]{2}:?[0-9]{2}:?[0-9]{2}[.,][0-9]+$")
_RFC3339_HEAD = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}").fullmatch
# The date of an ISO-8601 text (calendar, week or ordinal; extended or basic): what must be followed by its end or by
# the date-time separator. A text starting otherwise is left to fromisoformat to refuse.
_ISO_DATE_PART = re.compile(r"[0-9]{4}(-W[0-9]{2}(-[0-9])?|W[0-9]{2}[0-9]?"
                            r"|-[0-9]{2}-[0-9]{2}|-[0-9]{3}|[0-9]{4}|[0-9]{3})").match
_OPS = {"ADD": MutationOp.ADD, "CLEAR": MutationOp.CLEAR}


class ValidationError(ValueError):
    """A value that breaks a wire-format rule; `field` names it, `reason` says what is wrong."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"field '{field}': {reason}")
        self.field = field
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:  # picklable across worker processes
        return (type(self), (self.field, self.reason))


def short_repr(value: object) -> str:
    """A short repr for error messages, so a megabyte of garbage never lands in a DLQ reason (or a config error)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _utf8_len(value: str, field: str) -> int:
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValidationError(field, "is not valid UTF-8 (contains a lone surrogate)") from None


def validate_namespace(name: Any, *, field: str = "namespace") -> str:
    """Return `name` if it is 1-64 characters of [A-Za-z0-9_.-] (no ':': record keys are ns:counter)."""
    if type(name) is str and _NAMESPACE_RE.fullmatch(name):
        return name
    if not isinstance(name, str):
        raise ValidationError(field, f"must be a string, got {_type_name(name)}")
    if type(name) is not str and _NAMESPACE_RE.fullmatch(name):  # a str subclass
        return str.__str__(name)
    if not name:
        raise ValidationError(field, "must not be empty")
    if len(name) > MAX_NAMESPACE_LEN:
        raise ValidationError(field, f"must be at most {MAX_NAMESPACE_LEN} characters, got {len(name)}")
    if ":" in name:
        reason = f"must not contain ':' (record keys are 'namespace:counter'): {short_repr(name)}"
        raise ValidationError(field, reason)
    raise ValidationError(field, f"may only contain letters, digits, '_', '.' and '-': {short_repr(name)}")


def validate_counter_name(name: Any, *, field: str = "counter_name") -> str:
    """Return `name` if it is 1-200 UTF-8 bytes with no whitespace or control characters (a cache key)."""
    if type(name) is str:
        if name.isascii():
            if _ASCII_COUNTER_RE.fullmatch(name):
                return name
        elif 0 < _utf8_len(name, field) <= MAX_COUNTER_NAME_BYTES and not _BAD_NAME_CHAR_RE.search(name):
            return name
    elif isinstance(name, str):
        return validate_counter_name(str.__str__(name), field=field)
    else:
        raise ValidationError(field, f"must be a string, got {_type_name(name)}")
    if not name:
        raise ValidationError(field, "must not be empty")
    size = _utf8_len(name, field)
    if size > MAX_COUNTER_NAME_BYTES:
        raise ValidationError(field, f"must be at most {MAX_COUNTER_NAME_BYTES} UTF-8 bytes, got {size}")
    bad = _BAD_NAME_CHAR_RE.search(name)
    found = f"found {bad.group()!r} in " if bad else ""
    raise ValidationError(field, f"must not contain whitespace or control characters, {found}{short_repr(name)}")


def validate_delta(delta: Any, *, field: str = "delta") -> int:
    """Return `delta` if it is an int within int64; bools and floats (even 2.0) are rejected, not coerced."""
    if type(delta) is int and INT64_MIN <= delta <= INT64_MAX:
        return delta
    if isinstance(delta, float) and not math.isfinite(delta):  # the JSON said 1e400 (or NaN): not what it holds
        raise ValidationError(field, f"must be an integer, got a number beyond a float's range or not a number "
                                     f"(read as {delta!r})")
    if isinstance(delta, bool) or not isinstance(delta, int):
        raise ValidationError(field, f"must be an integer, got {_type_name(delta)} {short_repr(delta)}")
    if INT64_MIN <= delta <= INT64_MAX:  # an int subclass such as IntEnum
        return int(delta)
    raise ValidationError(field, f"must fit in a signed 64-bit integer, got {short_repr(delta)}")


def _validate_text(value: Any, field: str, min_bytes: int, max_bytes: int) -> str:
    if type(value) is not str:
        if not isinstance(value, str):
            raise ValidationError(field, f"must be a string, got {_type_name(value)}")
        value = str.__str__(value)
    size = len(value) if value.isascii() else _utf8_len(value, field)
    if min_bytes <= size <= max_bytes and not _CONTROL_RE.search(value):
        return value
    if size < min_bytes:
        raise ValidationError(field, "must not be empty")
    if size > max_bytes:
        raise ValidationError(field, f"must be at most {max_bytes} UTF-8 bytes, got {size}")
    raise ValidationError(field, f"must not contain control characters: {short_repr(value)}")


def validate_token(token: Any, *, field: str = "token") -> str:
    """Return the idempotency token if it is 1-256 UTF-8 bytes without control characters."""
    return _validate_text(token, field, 1, MAX_TOKEN_BYTES)


def validate_item_key(key: Any, *, field: str = "event_item_key") -> str:
    """Return the event item key if it is 0-256 UTF-8 bytes without control characters ("" = unused)."""
    if key == "" and type(key) is str:
        return key
    return _validate_text(key, field, 0, MAX_ITEM_KEY_BYTES)


def _format_micros(micros: int) -> str:
    try:
        return (_EPOCH + micros * _ONE_MICRO).isoformat().replace("+00:00", "Z")
    except OverflowError:
        return f"{micros:.3e} µs since the epoch" if abs(micros) >= 10**20 else f"{micros} µs since the epoch"


def validate_event_time(event_time: Any, *, field: str = "event_time", how: str = "") -> int:
    """Return `event_time` (epoch µs) if it is an int within the years 2000..2200 UTC."""
    if type(event_time) is int and MIN_EVENT_TIME <= event_time <= MAX_EVENT_TIME:
        return event_time
    if isinstance(event_time, bool) or not isinstance(event_time, int):
        raise ValidationError(field, f"must be an integer (epoch µs), got {_type_name(event_time)}")
    if MIN_EVENT_TIME <= event_time <= MAX_EVENT_TIME:
        return int(event_time)
    raise ValidationError(
        field, f"must lie within the years 2000..2200 UTC, got {_format_micros(int(event_time))}{how}")


def _epoch_to_micros(number: int | Decimal) -> tuple[int, str]:
    """Scale an epoch number to µs by magnitude: < 1e11 seconds, < 1e14 milliseconds, else microseconds."""
    size = cast(int | Decimal, abs(number))  # mypy joins abs() over the union to `object`
    if size < SECONDS_BELOW:
        scaled, unit = number * MICROS, "seconds"
    elif size < MILLIS_BELOW:
        scaled, unit = number * 1000, "milliseconds"
    else:
        scaled, unit = number, "microseconds"
    if isinstance(scaled, Decimal):  # fractions of a microsecond are dropped (floor), deterministically
        scaled = int(scaled.to_integral_value(rounding=ROUND_FLOOR))
    return scaled, f" (read as epoch {unit})"


def parse_generation_time(value: Any, *, field: str = "generation_time") -> int:
    """Turn an idempotency token's generation_time into epoch µs UTC.

    Accepted: ISO-8601 / RFC 3339 strings ("2024-10-05T14:48:00Z", "+05:30" offsets, fractional seconds,
    lower-case 't'/'z'; naive means UTC), aware or naive `datetime`, and epoch numbers (int, float or
    numeric string) whose unit is chosen by magnitude: < 1e11 seconds, < 1e14 milliseconds, otherwise
    microseconds. Fractions below one microsecond are floored. The result must lie within the years
    2000..2200 UTC, which also catches unit mistakes. bool is rejected.
    """
    how = ""
    if type(value) is int:
        micros, how = _epoch_to_micros(value)
    elif isinstance(value, bool):
        raise ValidationError(field, "must be an ISO-8601 string or an epoch number, got bool")
    elif isinstance(value, int):
        micros, how = _epoch_to_micros(int(value))
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValidationError(field, f"must be a finite number, got {value!r}")
        micros, how = _epoch_to_micros(Decimal(repr(value)))
    elif isinstance(value, str):
        micros, how = _parse_time_text(value, field)
    elif isinstance(value, datetime):
        micros = _datetime_to_micros(value)
    else:
        reason = f"must be an ISO-8601 string or an epoch number, got {_type_name(value)}"
        raise ValidationError(field, reason)
    return validate_event_time(micros, field=field, how=how)


_EPOCH_ORDINAL = _EPOCH.toordinal()
_SECONDS_OF: dict[str, int] = {}  # "2026-11-23T10:00:00" -> epoch seconds: a stream's times share their seconds
_FRACTION_SCALE = (0, 100_000, 10_000, 1_000, 100, 10, 1)  # µs per unit of an n-digit fraction


def utc_datetime(us: int) -> datetime:
    """Epoch µs as an aware UTC datetime (what the API's response models carry)."""
    return datetime.fromtimestamp(us / MICROS, UTC)


def micros_iso(us: int) -> str:
    """Epoch µs as RFC 3339 UTC with microseconds ("2026-11-23T10:00:00.000000Z"): the inverse of `iso_micros`, for
    messages and exports a person reads."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(us // 1_000_000)) + f".{us % 1_000_000:06d}Z"


def iso_micros(text: str) -> int | None:
    """Epoch µs of an RFC 3339 time in UTC ("2026-11-23T10:00:00Z", "...:00.123456Z"), or None for any other
    form. The seconds part is parsed once and remembered, the fraction by hand: a fifth of the general path's
    cost, and exactly its result."""
    rest = text[19:]
    if rest == "Z":
        micros = 0
    else:
        fraction = rest[1:-1]
        if not (rest[:1] == "." and rest[-1:] == "Z" and 0 < len(fraction) <= 6 and fraction.isdigit()
                and fraction.isascii()):
            return None
        micros = int(fraction) * _FRACTION_SCALE[len(fraction)]
    head = text[:19]
    seconds = _SECONDS_OF.get(head)
    if seconds is None:
        # Exactly YYYY-MM-DD?HH:MM:SS: fromisoformat also reads other 19-character heads ("...T144800.5" with a
        # fraction, "...T14:48+01" with an offset) that this sum of seconds would misread; "20241005..." would
        # parse as a date, and numbers are epochs.
        if not head.isascii() or _RFC3339_HEAD(head) is None:
            return None
        try:
            dt = datetime.fromisoformat(head)
        except ValueError:
            return None
        seconds = (dt.toordinal() - _EPOCH_ORDINAL) * 86400 + dt.hour * 3600 + dt.minute * 60 + dt.second
        if len(_SECONDS_OF) >= 100_000:
            _SECONDS_OF.clear()
        _SECONDS_OF[head] = seconds
    return seconds * MICROS + micros


def _parse_time_text(text: str, field: str) -> tuple[int, str]:
    micros = iso_micros(text)
    if micros is not None:
        return micros, ""
    if _NUMERIC_RE.fullmatch(text):
        try:
            return _epoch_to_micros(Decimal(text) if "." in text else int(text))
        except (InvalidOperation, ValueError):  # absurdly many digits
            raise ValidationError(field, f"epoch number out of range: {short_repr(text)}") from None
    if not text.isascii() or len(text) > 64:
        raise ValidationError(field, f"is not an ISO-8601 time or epoch number: {short_repr(text)}")
    if _FRACTIONAL_OFFSET.search(text):
        raise ValidationError(field, f"has a UTC offset with a fraction of a second, which ISO-8601 times do not "
                                     f"take: {short_repr(text)}")
    upper = text.upper()  # RFC 3339 allows lower-case 't' and 'z'
    date = _ISO_DATE_PART(upper)
    if date is not None and date.end() < len(upper) and upper[date.end()] not in "T ":
        # fromisoformat takes any character there ("2026-11-27X16:38:00Z", "2026-11-27116:38:00"): a typo or a
        # mangled field
        raise ValidationError(field, f"needs 'T' (or a space) between its date and its time, found "
                                     f"{text[date.end()]!r}: {short_repr(text)}")
    try:
        parsed = datetime.fromisoformat(upper)
    except ValueError:
        raise ValidationError(field, f"is not an ISO-8601 time or epoch number: {short_repr(text)}") from None
    return _datetime_to_micros(parsed), ""


def _datetime_to_micros(value: datetime) -> int:
    if value.tzinfo is None or value.utcoffset() is None:
        value = value.replace(tzinfo=UTC)
    return (value - _EPOCH) // _ONE_MICRO


def plainly_valid(namespace: str, counter_name: str, delta: int, event_time: int, event_id: str,
                  event_item_key: str, op: MutationOp) -> bool:
    """True when Avro-decoded fields (already str/int) are valid and pure ASCII: the decoder's fast path.

    False means "not sure", never "invalid": callers then run validate_mutation for the verdict and message.
    """
    return (
        NAMESPACE_MATCH(namespace) is not None
        and counter_name.isascii()
        and ASCII_COUNTER_MATCH(counter_name) is not None
        and INT64_MIN <= delta <= INT64_MAX
        and MIN_EVENT_TIME <= event_time <= MAX_EVENT_TIME
        and 0 < len(event_id) <= MAX_TOKEN_BYTES
        and event_id.isascii()
        and CONTROL_SEARCH(event_id) is None
        and event_item_key == ""
        and (op is MutationOp.ADD or (op is MutationOp.CLEAR and delta == 0))
    )


_PLAIN_NAMES: set[tuple[str, str]] = set()  # pairs found plainly valid: names repeat, two regexes per record do not


def plainly_valid_names(namespace: str, counter: str) -> bool:
    """True when a decoded (namespace, counter) pair is valid and pure ASCII (the plain records' fast paths);
    False means "not sure": callers then run the validators for the verdict and the message."""
    key = (namespace, counter)
    if key in _PLAIN_NAMES:
        return True
    if not (NAMESPACE_MATCH(namespace) is not None and counter.isascii() and ASCII_COUNTER_MATCH(counter) is not None):
        return False
    if len(_PLAIN_NAMES) >= 200_000:
        _PLAIN_NAMES.clear()
    _PLAIN_NAMES.add(key)
    return True


def validate_mutation(m: Mutation) -> Mutation:
    """Check every field of `m` (CLEAR must have delta 0); return it with `op` as a MutationOp."""
    validate_namespace(m.namespace)
    validate_counter_name(m.counter_name)
    validate_delta(m.delta)
    op = _OPS.get(m.op) if isinstance(m.op, str) else None
    if op is None:
        raise ValidationError("op", f"must be ADD or CLEAR, got {short_repr(m.op)}")
    if op is MutationOp.CLEAR and m.delta != 0:
        raise ValidationError("delta", f"must be 0 for a CLEAR, got {m.delta}")
    if m.event_time is not None:
        validate_event_time(m.event_time)
    if m.event_id is not None:
        validate_token(m.event_id, field="event_id")
    validate_item_key(m.event_item_key)
    if m.dimensions or m.item:
        m = _validate_extras(m, op)
    if op is not m.op:
        return m._replace(op=op)
    return m


def _validate_extras(m: Mutation, op: MutationOp) -> Mutation:
    """The v2 fields: dimensions (sorted pairs; a clear takes none) and item. Returns `m` with the dimensions in
    their canonical (sorted) form."""
    from schemas.dimensions import validate_dimensions, validate_item  # it imports this module

    dimensions = validate_dimensions(m.dimensions)
    if dimensions and op is MutationOp.CLEAR:
        raise ValidationError("dimensions", "a clear applies to the counter and all its combinations: "
                                            "send it without dimensions")
    validate_item(m.item)
    return m if dimensions == m.dimensions else m._replace(dimensions=dimensions)
