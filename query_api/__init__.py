"""query_api component."""
