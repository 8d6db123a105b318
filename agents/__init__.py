"""agents component."""
