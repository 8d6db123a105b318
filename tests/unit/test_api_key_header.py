"""The caller's key as the API reads it (`query_api.dependencies.api_key`)."""

from __future__ import annotations

import asyncio

from query_api.dependencies import api_key


def test_surrounding_whitespace_is_no_part_of_the_key_in_either_header() -> None:
    """A review: `X-API-Key: key ` (a trailing space or tab, which some clients send) was refused with a 401 while
    `Authorization: Bearer key ` was accepted. A header value's surrounding whitespace is not part of it."""
    assert asyncio.run(api_key(x_api_key="reader-key \t")) == "reader-key"
    assert asyncio.run(api_key(authorization="Bearer reader-key  ")) == "reader-key"
    assert asyncio.run(api_key(x_api_key="  ", authorization="Bearer b")) == "b", "a blank X-API-Key is no key"
    assert asyncio.run(api_key()) is None
