"""The ft serve model: what the server says, what its pools cost, how to move them safely.

`fields` (the strict field readers and `DocumentError`, the one error every parser raises),
`geometry` (`/v1/cache/status`), `wire` (the other control-plane documents and the rebuild
route's outcomes), `budget` (bytes of a geometry, what fits beside what), `planner` (a
transition in calls whose every instant fits) and `control` (ft serve's validation rules and
replies, which the reference engine applies). Pure: no I/O, no clock, no torch, nothing of
`engine.reference`, so every rule is tested against the captured documents of a real ft serve
(tests/fixtures/freetoken-0.1.2/) and both the daemon and the reference engine import it.
"""
