"""The benchmarks: scripts run as `python bench/NAME.py`, importable as `bench.NAME` by tests.

Dev-only, like tests/: the wheel ships `ladder`, `engine` and `policies` alone.
"""
