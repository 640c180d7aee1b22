"""The reference engine: ft serve's control API on real torch pools, runnable on a CPU.

`runtime` (`ReferenceEngine`: scheduler, the rebuild route), `admission` (which waiting
request fits the free pages and slots, and the refusal when none can), `rebuild` (carrying out
an accepted rebuild, incremental or ft serve's way, and its pauses), `documents` (the status,
health, stats and requests documents it serves), `pools` (chunked expert, KV and state pools),
`memory` (exact accounting, card emulation), `decoder`, `routing` and `tokenizer` (the tiny
model), `server` and `metrics` (thin aiohttp/Prometheus adapters), `scenarios`. It takes every
rule and price from `engine.ftserve`, so it differs from ft serve on the wire only where its
`/v1/cache/status` `engine` block says so. It never imports the daemon; the daemon imports it
only lazily, for `ladder engine`, the demo and the built-in tokenizer, since torch is optional.
"""
