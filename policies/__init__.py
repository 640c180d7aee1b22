"""Policies: which rung to want, given an observation; pure, no I/O, no clock, no torch.

`api` (the interface: `Observation`, `LadderView`, `Decision`), `headroom` (the default, and
the demand rule every built-in honours), `throughput` (steps down only when the gain pays
back a transition), `pinned` (a fixed rung, for comparisons), `registry` (finds a policy by
name, entry point or `module:attr`). It imports nothing of `ladder` or `engine`.
"""
