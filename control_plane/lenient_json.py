"""A forgiving JSON reader for control-plane documents copied from prose.

The Netflix post prints its control-plane JSON with ``//`` comments, trailing commas and as a bare
``"persistence_configuration": [...]`` fragment without the enclosing braces. Operators paste
exactly that, so we accept it: comments (outside strings) and trailing commas are blanked out,
and a bare ``"key": value`` fragment is wrapped in braces. Blanking keeps every character at
its original line and column, so parser errors still point at the right place in the file.
Duplicate keys are rejected: a silently shadowed setting is a misconfiguration.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["loads", "strip_comments"]


def loads(text: str) -> Any:
    """Parse lenient JSON text.

    Raises ``json.JSONDecodeError`` (with line/column in ``text``) on syntax errors and a plain
    ``ValueError`` on duplicate keys.
    """
    if text.startswith("\ufeff"):
        text = " " + text[1:]
    cleaned = strip_comments(text)
    wrapped = _is_bare_member(cleaned)
    if wrapped:
        cleaned = "{" + cleaned + "\n}"
    cleaned = _drop_trailing_commas(cleaned)
    try:
        return json.loads(cleaned, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        # Report the position in the caller's text, not in our wrapped copy.
        pos = min(max(exc.pos - 1, 0), len(text)) if wrapped else exc.pos
        raise json.JSONDecodeError(exc.msg, text, pos) from None


def strip_comments(text: str) -> str:
    """Blank out ``//`` and ``/* */`` comments outside string literals, preserving newlines."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            end = _string_end(text, i)
            out.append(text[i:end])
            i = end
        elif ch == "/" and text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end == -1 else end
            out.append(" " * (end - i))
            i = end
        elif ch == "/" and text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end == -1:
                raise json.JSONDecodeError("Unterminated /* comment", text, i)
            end += 2
            out.append("".join(c if c == "\n" else " " for c in text[i:end]))
            i = end
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _string_end(text: str, start: int) -> int:
    """Index just past the string literal opening at ``start`` (or end of line if unterminated)."""
    i, n = start + 1, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2
        elif ch == '"':
            return i + 1
        elif ch == "\n":  # unterminated: let json report it, but keep stripping later lines
            return i
        else:
            i += 1
    return n


def _is_bare_member(text: str) -> bool:
    """True when the document is ``"key": value ...`` rather than a JSON value."""
    start = len(text) - len(text.lstrip())
    if not text.startswith('"', start):
        return False
    rest = text[_string_end(text, start):].lstrip()
    return rest.startswith(":")


def _drop_trailing_commas(text: str) -> str:
    """Blank a comma when the next non-space character closes an object or array."""
    chars = list(text)
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            i = _string_end(text, i)
            continue
        if ch == ",":
            j = i + 1
            while j < n and text[j] in " \t\r\n":
                j += 1
            if j < n and text[j] in "}]":
                chars[i] = " "
        i += 1
    return "".join(chars)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r} in a JSON object")
        result[key] = value
    return result
