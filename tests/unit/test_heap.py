"""infra.heap: start-up objects leave the collector's scans; what comes after is still collected."""

from __future__ import annotations

import gc

from infra.heap import freeze_startup_heap


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


def test_start_up_objects_are_frozen_and_later_cycles_are_still_collected() -> None:
    try:
        startup = Node()
        frozen = freeze_startup_heap()
        assert frozen >= 1 and gc.get_freeze_count() == frozen
        assert not any(o is startup for o in gc.get_objects())  # out of every generation the collector scans
        later = Node()
        assert any(o is later for o in gc.get_objects())
        del later
        assert gc.collect() >= 1  # a cycle made after the freeze is still found and freed
    finally:
        gc.unfreeze()
