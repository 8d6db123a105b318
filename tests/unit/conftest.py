"""Unit-test fixtures.

`agents.persist.prepare` refuses records stamped ahead of the worker's clock by more than their namespace's
max_clock_skew (a forged or mis-set CreateTime). Two modules of other owners stamp their records at a fixed
2027-01-15 (1.8e9 s), ahead of the clock until then: for them only, the persist path's clock reads that day until
their records are stamped in the past or they pass `now_us` to `prepare`. Then delete this fixture.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import agents.persist

_STAMPED_AHEAD = {"tests.unit.test_dimensions", "tests.unit.test_unique_counts"}
_THEIR_DAY_US = (1_800_000_000 + 86_400) * 1_000_000  # past every record they stamp


@pytest.fixture(autouse=True)
def _persist_clock_at_their_records(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if request.module.__name__ in _STAMPED_AHEAD:
        wall = agents.persist.wall_clock_us
        monkeypatch.setattr(agents.persist, "wall_clock_us", lambda: max(wall(), _THEIR_DAY_US))
    yield
