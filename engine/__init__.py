"""Everything on the engine's side of the wire, in two packages that `ls` tells apart.

`engine.ftserve` is what ft serve is and how a transition is priced: its documents, geometry,
budget, planner and control-plane rules, pure (no I/O, no torch), so the daemon and the
reference engine share one model of it. `engine.reference` is the torch reference engine that
serves ft serve's API on real pools. Imports go one way: `reference` may import `ftserve`,
`ftserve` never imports `reference`, and nothing here imports the daemon (`ladder`) or
`policies`; `tests/test_layers.py` enforces it.
"""
