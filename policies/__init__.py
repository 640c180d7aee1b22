"""Policies: which rung to want, given an observation; pure, no I/O, no clock, no torch.

`api` (the interface: `Observation`, `LadderView`, `Decision`), `pinned` (the default: rung
0 raised to the lowest rung holding demand, or a fixed rung for comparisons), `headroom`
(demand plus a turn of growth, a dwell before stepping down; the demand rule every built-in
honours lives there), `throughput` (steps down only when the gain pays back a transition),
`registry` (finds a policy by
name, entry point or `module:attr`). It imports nothing of `ladder` or `engine`.
"""
