"""Benchmarks, runnable as `python -m ops.bench.<name>`."""
