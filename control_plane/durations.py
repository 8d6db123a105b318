"""Parse the human-written durations used in namespace files.

The Netflix control plane writes durations as strings ("5s", "518400s"); operators also write
"7d" or ISO-8601 "PT5S". Everything is normalised to float seconds here so that the rest of the
service never has to care which spelling a file used.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta

__all__ = ["parse_duration"]

# Unit spellings (lower-cased) -> seconds. Calendar units (months, years) are deliberately absent:
# they have no fixed length, and a retention that silently means 28..31 days is a bug.
_UNITS: dict[str, float] = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
    "m": 60.0, "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0,
    "h": 3600.0, "hr": 3600.0, "hrs": 3600.0, "hour": 3600.0, "hours": 3600.0,
    "d": 86400.0, "day": 86400.0, "days": 86400.0,
    "w": 604800.0, "week": 604800.0, "weeks": 604800.0,
}

_NUMBER = r"\d+(?:\.\d+)?|\.\d+"
_PLAIN = re.compile(rf"(?:{_NUMBER})")
_TOKEN = re.compile(rf"\s*({_NUMBER})\s*([a-zµ]+)\s*", re.IGNORECASE)
_ISO = re.compile(
    rf"P(?:(?P<w>{_NUMBER})W)?(?:(?P<d>{_NUMBER})D)?"
    rf"(?:T(?:(?P<h>{_NUMBER})H)?(?:(?P<m>{_NUMBER})M)?(?:(?P<s>{_NUMBER})S)?)?",
    re.IGNORECASE,
)
_ISO_SECONDS = {"w": 604800.0, "d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}

_HINT = "expected seconds as a number, or a string like '5s', '10000ms', '10m', '2h', '7d' or 'PT5S'"


def parse_duration(value: object) -> float:
    """Return ``value`` as non-negative float seconds.

    Accepts numbers (seconds), ``timedelta``, digit strings ("600" = seconds), unit strings
    ("10000ms", "5s", "10m", "2h", "7d", "1w", also compound "1h30m") and ISO-8601 durations
    ("PT5S", "P7D", "P1DT12H"). Raises ``ValueError`` with the reason otherwise.
    """
    if isinstance(value, bool):  # bool is an int subclass: True must not mean "1 second"
        raise ValueError(f"a boolean is not a duration (got {value!r}); {_HINT}")
    if isinstance(value, timedelta):
        return _check(value.total_seconds(), value)
    if isinstance(value, int | float):
        return _check(float(value), value)
    if not isinstance(value, str):
        raise ValueError(f"not a duration (got {type(value).__name__} {value!r}); {_HINT}")

    text = value.strip()
    if not text:
        raise ValueError(f"empty duration; {_HINT}")
    if text.startswith("-"):
        raise ValueError(f"duration must not be negative (got {value!r})")
    if _PLAIN.fullmatch(text):
        return _check(float(text), value)
    if text[0] in "Pp":
        return _parse_iso(text, value)
    return _parse_units(text, value)


def _parse_units(text: str, original: str) -> float:
    total = 0.0
    pos = 0
    for match in _TOKEN.finditer(text):
        if match.start() != pos:
            break
        unit = match.group(2).lower()
        if unit not in _UNITS:
            raise ValueError(
                f"unknown duration unit {match.group(2)!r} in {original!r} (use one of ms, s, m, h, d, w)"
            )
        total += float(match.group(1)) * _UNITS[unit]
        pos = match.end()
    if pos != len(text) or pos == 0:
        raise ValueError(f"cannot parse duration {original!r}; {_HINT}")
    return _check(total, original)


def _parse_iso(text: str, original: str) -> float:
    match = _ISO.fullmatch(text)
    if match is None or not any(match.groupdict().values()) or text.upper().endswith("T"):
        if re.match(r"P[^T]*[YM]", text, re.IGNORECASE):
            raise ValueError(
                f"ISO duration {original!r} uses years or months, which have no fixed length; "
                "use days (e.g. 'P30D')"
            )
        raise ValueError(f"cannot parse ISO-8601 duration {original!r}; {_HINT}")
    total = sum(float(v) * _ISO_SECONDS[k] for k, v in match.groupdict().items() if v is not None)
    return _check(total, original)


def _check(seconds: float, original: object) -> float:
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"duration must be finite (got {original!r})")
    if seconds < 0:
        raise ValueError(f"duration must not be negative (got {original!r})")
    return seconds


def format_duration(seconds: float) -> str:
    """Seconds as the largest whole unit ("48h", "90d"), for messages: what `parse_duration` reads back."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
