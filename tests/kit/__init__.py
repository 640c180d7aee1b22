"""The test kit: what the tests and the benchmarks share, and the wheel does not ship.

Why here and not in `ladder`: the fault proxy and the engine rig exist only to test the daemon
(tests/ and bench/ import `tests.kit`; both are dev-only), and the wheel packages `ladder`,
`engine` and `policies` alone. `tests/test_shipping.py` checks that the product imports none
of it. Helpers the product itself needs (`ladder demo`'s free port and prompt words) live in
the product under public names, and the kit's users import them from there.
"""
