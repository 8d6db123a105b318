"""The HTTP routes, one router per concern: writes, reads (totals, windows, series) and operations."""
