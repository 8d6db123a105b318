"""In-process backends, for one process or when memcached is absent: rollup cache and counters."""
