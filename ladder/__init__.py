"""The daemon and the CLI: observe a server, choose a rung, move to it without an OOM.

Pure: `rungs` (the ladder and its verified transitions), `units`, `render`, `safeguards`,
`sizing` (what a request needs), `token_bound` (the byte bound, tightened from the request
log), `sse`, `knobs` (each setting declared once) and `parsers`. Adapters and the loop:
`client` (aiohttp, over `engine.ftserve.wire`), `executor` (one plan, step by step: `ladder
apply`), `controller` (observe -> policy -> safeguards -> executor), `gate` (the admission
proxy), `tokenizer_file`, `config/`, `metrics`, `logs`, `clock`, `daemon` (the controllers,
gates and endpoint of one process), `demo` and `cli`. It imports `engine.ftserve` and
`policies`; the torch reference engine only lazily (`ladder engine`, the demo).
"""
