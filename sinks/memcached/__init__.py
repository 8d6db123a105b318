"""memcached backends: the pipelined asyncio client, the rollup cache and BEST_EFFORT counters."""
