"""A tiny MoE decoder whose speed comes from real work on the pools it shares with the server.

L layers, each: single-head attention over the request's paged KV, a recurrent state kept in
the state pool, and a top-k mixture of E experts whose weights live in a host bank (pinned on
CUDA) and are copied into expert slots on a miss. Nothing is modelled by a formula: a miss costs
a host-to-device copy that its layer waits for, a long context costs attention over more pages.

The router's choices come from `engine.reference.routing` (seeded per request, with real models'
skew and locality), never from the cache state, and every request is computed alone, so the same
prompt and seed give the same tokens whatever the pools did meanwhile: moving a page or an expert
copies its bytes exactly, and the arithmetic that reads them is unchanged.

Prefill writes the prompt's KV from its embeddings without the expert mixture (large
dispatches bypass the expert cache, as imp PR 1408 does, so a prefill cannot evict the decode
set).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch

from engine.reference.pools import ExpertSlotPool, PagedKVPool, StatePool
from engine.reference.routing import PRESETS, Router, RoutingStream

__all__ = ["DecodeRequest", "ModelSpec", "TinyMoE"]

_FLOAT_BYTES = 4
_PREFILL_BLOCK_PAGES = 128


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """The tiny model's shape; the byte sizes follow from it."""

    num_layers: int = 8
    num_experts: int = 64
    top_k: int = 4
    hidden: int = 64
    expert_hidden: int = 128
    head_dim: int = 32
    state_heads: int = 1
    vocab_size: int = 4100
    output_vocab: int = 4096
    page_size: int = 16
    routing_preset: str = "A"
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.num_layers, self.num_experts, self.top_k, self.hidden, self.expert_hidden,
               self.head_dim, self.state_heads, self.page_size) < 1:
            raise ValueError("every model dimension must be at least 1")
        if self.top_k > self.num_experts:
            raise ValueError("top_k must not exceed num_experts")
        if self.routing_preset not in PRESETS:
            raise ValueError(f"routing_preset must be one of {sorted(PRESETS)}")

    @property
    def expert_bytes(self) -> int:
        return 2 * self.hidden * self.expert_hidden * _FLOAT_BYTES

    @property
    def kv_bytes_per_token(self) -> int:
        return self.num_layers * 2 * self.head_dim * _FLOAT_BYTES

    @property
    def dense_weight_bytes(self) -> int:
        """Bytes of the weights kept on the device outside the pools (`TinyMoE.dense_weights`)."""
        h, d, n = self.hidden, self.head_dim, self.num_layers
        sd = self.state_heads * d
        floats = (2 * self.vocab_size * h + 4 * n * h * d + n * h * self.num_experts
                  + 4 * n * h * sd)
        return floats * _FLOAT_BYTES

    @property
    def state_bytes(self) -> int:
        """A gated-delta-style state: one head_dim x head_dim matrix per head and layer."""
        return self.num_layers * self.state_heads * self.head_dim**2 * _FLOAT_BYTES


def request_seed(prompt_ids: list[int], seed: int) -> int:
    """A routing seed that depends only on the request itself."""
    digest = hashlib.blake2b(repr((prompt_ids, seed)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


@dataclass(slots=True)
class DecodeRequest:
    """A running request's decoding state (mutable: it advances token by token)."""

    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    routing: RoutingStream
    position: int = 0
    last_token: int = 0
    generated: int = 0
    # The last step's contiguous page runs its history came from (one copy each), and its
    # layers that waited for an expert copy (one device synchronisation each).
    kv_runs: int = 0
    miss_layers: int = 0


class TinyMoE:
    """Weights on the device, the expert bank on the host, compute over the shared pools."""

    def __init__(self, spec: ModelSpec, device: torch.device) -> None:
        self.spec = spec
        self.device = device
        gen = torch.Generator().manual_seed(spec.seed)
        h, d, n_layers = spec.hidden, spec.head_dim, spec.num_layers

        def weight(*shape: int, scale: float) -> torch.Tensor:
            return (torch.randn(*shape, generator=gen) * scale).to(device)

        self.embed = weight(spec.vocab_size, h, scale=1.0)
        # Projections that read the same input are one matrix, so a layer costs fewer
        # launches: [q | k | v] and the state's [k | v | q]. Constant factors (attention's
        # 1/sqrt(d), the state readout's 1/d) are folded into the weights.
        self.wqkv = weight(n_layers, h, 3 * d, scale=1 / math.sqrt(h))
        self.wqkv[:, :, :d] /= math.sqrt(d)
        self.wo = weight(n_layers, d, h, scale=1 / math.sqrt(d))
        self.wgate = weight(n_layers, h, spec.num_experts, scale=1 / math.sqrt(h))
        self.wout = weight(h, spec.vocab_size, scale=1 / math.sqrt(h))
        sd = spec.state_heads * d
        self.ws_kvq = weight(n_layers, h, 3 * sd, scale=1 / math.sqrt(h))
        self.ws_o = weight(n_layers, sd, h, scale=1 / (math.sqrt(sd) * d))
        bank = torch.randn(n_layers, spec.num_experts, spec.expert_bytes // _FLOAT_BYTES,
                           generator=gen) * (1 / math.sqrt(h))
        # Pinned host memory makes a miss a DMA at PCIe speed instead of a pageable copy (~7x).
        self.host_bank = bank.pin_memory() if device.type == "cuda" else bank
        routing = PRESETS[spec.routing_preset].with_shape(
            n_layers, spec.num_experts, spec.top_k)
        self.router = Router(routing, n_layers, seed=spec.seed)

    def dense_weights(self) -> tuple[torch.Tensor, ...]:
        """Every tensor the model keeps on the device outside the pools."""
        return (self.embed, self.wqkv, self.wo, self.wgate, self.wout, self.ws_kvq, self.ws_o)

    def new_request(self, request_id: str, prompt_ids: list[int], max_tokens: int,
                    seed: int) -> DecodeRequest:
        return DecodeRequest(request_id, list(prompt_ids), max_tokens,
                             self.router.stream(request_seed(prompt_ids, seed)))

    def _kv_page(self, kv: PagedKVPool, page: int) -> torch.Tensor:
        s = self.spec
        return kv.page_view(page).view(torch.float32).view(s.num_layers, 2, s.page_size,
                                                            s.head_dim)

    def prefill(self, req: DecodeRequest, kv: PagedKVPool, states: StatePool) -> None:
        """Write the KV of all prompt tokens but the last, which the first decode step reads."""
        s = self.spec
        pages = kv.page_table(req.request_id)
        body = req.prompt_ids[:-1]
        # Blocks of whole pages bound the temporaries (a 200k-token prompt's KV is GiBs).
        block_tokens = s.page_size * _PREFILL_BLOCK_PAGES
        for start in range(0, len(body), block_tokens):
            ids = body[start : start + block_tokens]
            n_pages = -(-len(ids) // s.page_size)
            x = self.embed[torch.tensor(ids, device=self.device)]
            block = torch.zeros(s.num_layers, 2, n_pages * s.page_size, s.head_dim,
                                device=self.device)
            d = s.head_dim
            block[:, 0, : len(ids)] = torch.einsum("th,lhd->ltd", x, self.wqkv[:, :, d : 2 * d])
            block[:, 1, : len(ids)] = torch.einsum("th,lhd->ltd", x, self.wqkv[:, :, 2 * d :])
            # [layer, k/v, page, token, dim] -> the pool's page layout [page, layer, k/v, ...].
            paged = block.view(s.num_layers, 2, n_pages, s.page_size, s.head_dim)
            first = start // s.page_size
            kv.write_pages(pages[first : first + n_pages],
                           paged.permute(2, 0, 1, 3, 4).contiguous().view(torch.uint8)
                           .view(n_pages, -1))
        states.slot_view(states.slot_of(req.request_id)).zero_()
        req.position = len(body)
        req.last_token = req.prompt_ids[-1]

    def decode_step(self, req: DecodeRequest, kv: PagedKVPool, experts: ExpertSlotPool,
                    states: StatePool) -> int:
        """One token: attention, state update and expert mixture in every layer.

        Written for few kernel launches (about 20 a layer), because at batch size 1 a launch
        costs more than the arithmetic it runs: the engine's fixed cost per token should be
        a real engine's, not Python's, so that what a miss costs shows.
        """
        s = self.spec
        d, sd, pos = s.head_dim, s.state_heads * s.head_dim, req.position
        pages = kv.page_table(req.request_id)
        n_pages = pos // s.page_size + 1
        # One gather of the history a token, layer-major ([layer, k/v, token, dim]) so each
        # layer's keys and values are contiguous rows: a private copy, into which this
        # token's KV is put as well as into its page.
        runs = kv.page_runs(pages[:n_pages])
        req.kv_runs = len(runs)
        history = torch.cat([
            rows.view(torch.float32).view(-1, s.num_layers, 2, s.page_size, d)
            .permute(1, 2, 0, 3, 4) for _, rows in runs
        ], dim=2).view(s.num_layers, 2, n_pages * s.page_size, d)
        page = self._kv_page(kv, pages[pos // s.page_size])
        offset = pos % s.page_size
        state = states.slot_view(states.slot_of(req.request_id)).view(torch.float32).view(
            s.num_layers, s.state_heads, d, d)
        # One host-to-device copy of the token's routing: indexing a device tensor with a
        # Python list copies (and synchronises) once per layer.
        routing = req.routing.step()
        chosen_host = routing.tolist()
        choices = torch.from_numpy(routing).to(self.device)
        gate_weights = torch.gather(
            self.wgate, 2, choices.unsqueeze(1).expand(-1, s.hidden, -1))
        x = self.embed[req.last_token]
        req.miss_layers = 0
        for layer in range(s.num_layers):
            qkv = x @ self.wqkv[layer]
            new_kv = qkv[d:].view(2, d)
            page[layer, :, offset] = new_kv
            history[layer, :, pos] = new_kv
            keys = history[layer, 0, : pos + 1]
            values = history[layer, 1, : pos + 1]
            attn = torch.softmax(torch.mv(keys, qkv[:d]), dim=0)
            x = torch.addmv(x, self.wo[layer].t(), torch.mv(values.t(), attn))
            # Linear-attention recurrence: S = 0.9 S + 0.1 k^T v per head, read out by q.
            skvq = x @ self.ws_kvq[layer]
            sk = torch.tanh(skvq[:sd]).view(s.state_heads, d, 1)
            sv = skvq[sd : 2 * sd].view(s.state_heads, 1, d)
            state[layer].baddbmm_(sk, sv, beta=0.9, alpha=0.1)
            readout = torch.bmm(skvq[2 * sd :].view(s.state_heads, 1, d), state[layer])
            x = torch.addmv(x, self.ws_o[layer].t(), readout.view(-1))
            gates = torch.softmax(x @ gate_weights[layer], dim=0)
            slots = []
            missed = False
            for expert in chosen_host[layer]:
                slot = experts.lookup(layer, expert)
                if slot is None:
                    slot = experts.admit(layer, expert, self.host_bank[layer, expert])
                    missed = True
                slots.append(experts.slot_view(slot))
            req.miss_layers += missed
            if missed and self.device.type == "cuda":
                # A miss is on a real engine's critical path: its graph-captured step is
                # GPU-bound, so the copy adds its PCIe time. This step is bound by Python's
                # launches instead, and an asynchronous copy would hide in the GPU's idle
                # time (measured on the H200: 23 us of a 38 us copy showed), so the layer
                # waits for its copies as the real step does. CPU copies are synchronous.
                torch.cuda.current_stream(self.device).synchronize()
            # The k experts as one batch: a copy of their slots, then two batched products.
            w = torch.stack(slots).view(torch.float32)
            w_in = w[:, : s.hidden * s.expert_hidden].view(-1, s.hidden, s.expert_hidden)
            w_out = w[:, s.hidden * s.expert_hidden:].view(-1, s.expert_hidden, s.hidden)
            hidden = torch.bmm(x.expand(len(slots), 1, -1), w_in).relu_()
            x = torch.addmv(x, torch.bmm(hidden, w_out).view(len(slots), -1).t(), gates)
            x = torch.nn.functional.rms_norm(x, (s.hidden,), eps=1e-12)
        # Only ordinary pieces are generated: specials would end or garble the text.
        token = int(torch.argmax(x @ self.wout[:, : s.output_vocab]))
        req.position += 1
        req.last_token = token
        req.generated += 1
        return token
