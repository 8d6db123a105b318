"""Local infrastructure: launchers for the Tansu broker and memcached, the CQL schema, the compose file."""
