"""Reading the registry of dimension combinations (``RollupStore.combinations``) whole, page by page."""

from __future__ import annotations

from sinks.base import RollupStore

__all__ = ["PAGE", "all_combinations"]

PAGE = 1000


async def all_combinations(rollups: RollupStore, namespace: str, counter: str, *, prefix: str = "",
                           full_only: bool = False, page: int = PAGE) -> list[str]:
    """Every registered combination of ``counter`` (starting with ``prefix``; only the full ones with
    ``full_only``), in order, read in pages of ``page``."""
    out: list[str] = []
    after = None
    while True:
        got = await rollups.combinations(namespace, counter, prefix=prefix, after=after, limit=page,
                                         full_only=full_only)
        out.extend(got)
        if len(got) < page:
            return out
        after = got[-1]
