"""Benchmarks (not tests): each prints its figure next to a baseline measured in the same run."""
