"""Which CUDA allocation strategy the pools should use: torch + expandable segments, or VMM.

A measurement, not production code: the VMM code lives only here. On an emulated 16 GiB card
(`engine.reference.memory.emulate_card`, a driver filler outside torch) a KV pool made of chunks
fills the card to within `--headroom-mib` of full; then `--convert-gib` of KV chunks become
expert chunks, chunk by chunk, in one of these modes (each in its own subprocess, so
`PYTORCH_CUDA_ALLOC_CONF` is read by a fresh allocator and no state leaks between modes):

- `torch_free_first`: torch tensors under `expandable_segments:True`; per chunk `del` the KV
  chunk, `torch.cuda.empty_cache()`, then allocate the expert chunk.
- `torch_alloc_first`: the same, but the expert chunk is allocated before the KV chunk is freed.
- `vmm_remap`: CUDA VMM through `cuda.bindings.driver`; 2 MiB handles grouped per chunk; per
  chunk fence, `cuMemUnmap` the KV chunk, `cuMemMap` the *same* handles into the expert range,
  one `cuMemSetAccess` over the chunk (no release, no create: the bytes never leave the process).
- `vmm_recreate`: free-first too, but `cuMemRelease` the KV handles and `cuMemCreate` new ones.
- `vmm_remap_chunk_handle`: `vmm_remap` with one handle per chunk (cost scales with handles).
- `vmm_alloc_first`: `cuMemCreate` the expert chunk's handles before unmapping the KV chunk.

For each: total time, time per GiB, per-chunk pause p50/p99, the lowest `cudaMemGetInfo` free
seen during the conversion (sampled after each half-step, outside the timed region), and whether
an OOM happened. The parent prints one JSON object; `--out FILE` writes it too.

    python3 bench/gpu_alloc.py --out bench/results/gpu_alloc.json

The figures of the recorded H200 run and the choice they led to are in docs/gpu-allocation.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MIB = 1 << 20
GIB = 1 << 30
MODES = ("torch_free_first", "torch_alloc_first", "vmm_remap", "vmm_recreate",
         "vmm_remap_chunk_handle", "vmm_alloc_first")
_EXPANDABLE = "expandable_segments:True"


# --- shared helpers ----------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 100]); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 4)


def _chunk_sizes(kv_bytes: int, chunk: int) -> list[int]:
    """The KV pool's chunks: a partial one first (so conversions from the end take full ones)."""
    full, tail = divmod(kv_bytes, chunk)
    return ([tail] if tail else []) + [chunk] * full


@dataclass
class Conversion:
    """What one conversion run saw; `to_json` is the mode's report."""

    mode: str
    chunk_bytes: int
    start_free: int
    pauses: list[float] = field(default_factory=list)
    free_samples: list[int] = field(default_factory=list)
    converted_bytes: int = 0
    oom: bool = False
    oom_at_chunk: int | None = None
    oom_error: str | None = None
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def sample(self, free: int) -> None:
        self.free_samples.append(free)

    def to_json(self) -> dict[str, Any]:
        total = sum(self.pauses)
        gib = self.converted_bytes / GIB
        lowest = min(self.free_samples, default=self.start_free)
        return {
            "mode": self.mode,
            "chunk_bytes": self.chunk_bytes,
            "chunks_converted": len(self.pauses) if not self.oom else self.oom_at_chunk,
            "converted_bytes": self.converted_bytes,
            "total_ms": _ms(total),
            "ms_per_gib": round(total * 1e3 / gib, 3) if gib else None,
            "pause_p50_ms": _ms(percentile(self.pauses, 50)),
            "pause_p99_ms": _ms(percentile(self.pauses, 99)),
            "pause_max_ms": _ms(max(self.pauses, default=None)),
            "start_free_bytes": self.start_free,
            "min_free_bytes": lowest,
            "transient_bytes": self.start_free - lowest,
            "free_samples": len(self.free_samples),
            "oom": self.oom,
            "oom_at_chunk": self.oom_at_chunk,
            "oom_error": self.oom_error,
            "wall_s": round(self.wall_s, 4),
            **self.extra,
        }


# --- torch mode --------------------------------------------------------------------------------


def run_torch(args: argparse.Namespace, alloc_first: bool) -> dict[str, Any]:
    import torch

    from engine.reference.memory import emulate_card

    device = torch.device("cuda")
    torch.cuda.init()  # type: ignore[no-untyped-call]
    # Load the kernels used below before the card is full: lazy module loading allocates
    # device memory at a kernel's first launch, and 1 MiB left is not enough for it.
    torch.empty(1 << 20, dtype=torch.uint8, device=device).fill_(1)
    torch.cuda.synchronize()
    chunk = args.chunk_mib * MIB
    filler = emulate_card(args.card_gib * GIB, device)
    try:
        free0 = torch.cuda.mem_get_info(device)[0]
        kv_bytes = (free0 - args.headroom_mib * MIB) // (2 * MIB) * (2 * MIB)
        started = time.perf_counter()
        kv = [torch.empty(n, dtype=torch.uint8, device=device) for n in
              _chunk_sizes(kv_bytes, chunk)]
        for index in range(len(kv)):
            kv[index].fill_(index % 251)  # no loop variable may keep a chunk alive
        torch.cuda.synchronize()
        fill_s = time.perf_counter() - started
        start_free = torch.cuda.mem_get_info(device)[0]
        run = Conversion("torch_alloc_first" if alloc_first else "torch_free_first", chunk,
                         start_free)
        stats0 = torch.cuda.memory_stats(device)
        experts: list[torch.Tensor] = []
        n_convert = min(args.convert_gib * GIB // chunk, len(kv) - 1)
        wall = time.perf_counter()
        for step in range(n_convert):
            try:
                if alloc_first:
                    t0 = time.perf_counter()
                    experts.append(torch.empty(chunk, dtype=torch.uint8, device=device))
                    t1 = time.perf_counter()
                    run.sample(torch.cuda.mem_get_info(device)[0])
                    t2 = time.perf_counter()
                    del kv[-1]
                    torch.cuda.empty_cache()
                    t3 = time.perf_counter()
                else:
                    t0 = time.perf_counter()
                    del kv[-1]  # the list held the last reference
                    torch.cuda.empty_cache()
                    t1 = time.perf_counter()
                    run.sample(torch.cuda.mem_get_info(device)[0])
                    t2 = time.perf_counter()
                    experts.append(torch.empty(chunk, dtype=torch.uint8, device=device))
                    t3 = time.perf_counter()
            except torch.OutOfMemoryError as exc:
                run.oom, run.oom_at_chunk = True, step
                run.oom_error = str(exc).split("\n")[0][:300]
                run.sample(torch.cuda.mem_get_info(device)[0])
                break
            run.sample(torch.cuda.mem_get_info(device)[0])
            run.pauses.append((t1 - t0) + (t3 - t2))
            run.converted_bytes += chunk
        run.wall_s = time.perf_counter() - wall
        stats1 = torch.cuda.memory_stats(device)
        run.extra.update({
            "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
            "kv_pool_bytes": kv_bytes, "kv_chunks": len(_chunk_sizes(kv_bytes, chunk)),
            "fill_s": round(fill_s, 4),
            "card_fill_fraction": round(1 - start_free / (args.card_gib * GIB), 5),
            "num_alloc_retries": stats1.get("num_alloc_retries", 0)
            - stats0.get("num_alloc_retries", 0),
            "num_ooms": stats1.get("num_ooms", 0) - stats0.get("num_ooms", 0),
            "reserved_bytes_after": torch.cuda.memory_reserved(device),
            "allocated_bytes_after": torch.cuda.memory_allocated(device),
        })
        del kv, experts
        torch.cuda.empty_cache()
        return run.to_json()
    finally:
        filler.release()


# --- VMM mode ----------------------------------------------------------------------------------


class VmmError(RuntimeError):
    def __init__(self, call: str, code: Any) -> None:
        super().__init__(f"{call} failed with {code}")
        self.call = call
        self.code = code


class Vmm:
    """The few `cuda.bindings.driver` calls the bench needs, each timed by call name."""

    def __init__(self, cu: Any, device_index: int) -> None:
        self.cu = cu
        self.calls: dict[str, list[float]] = {}
        self._check("cuInit", cu.cuInit(0))
        dev = self._check("cuDeviceGet", cu.cuDeviceGet(device_index))
        # Torch's primary context: VMM ranges must live in the context torch launches in.
        ctx = self._check("cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain(dev))
        self._check("cuCtxSetCurrent", cu.cuCtxSetCurrent(ctx))
        prop = cu.CUmemAllocationProp()
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.requestedHandleTypes = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE
        prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = device_index
        prop.win32HandleMetaData = 0
        self.prop = prop
        access = cu.CUmemAccessDesc()
        access.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = device_index
        access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self.access = access
        flag = cu.CUmemAllocationGranularity_flags
        self.granularity = int(self._check("cuMemGetAllocationGranularity",
                                           cu.cuMemGetAllocationGranularity(
                                               prop, flag.CU_MEM_ALLOC_GRANULARITY_MINIMUM)))
        self.recommended = int(self._check("cuMemGetAllocationGranularity",
                                           cu.cuMemGetAllocationGranularity(
                                               prop, flag.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)))

    def _check(self, call: str, result: Any) -> Any:
        if not isinstance(result, tuple):
            result = (result,)
        if result[0] != self.cu.CUresult.CUDA_SUCCESS:
            raise VmmError(call, result[0])
        return result[1] if len(result) == 2 else None

    def is_oom(self, exc: VmmError) -> bool:
        return bool(exc.code == self.cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY)

    def _timed(self, call: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        result = fn()
        self.calls.setdefault(call, []).append(time.perf_counter() - t0)
        return self._check(call, result)

    def ptr(self, address: int) -> Any:
        return self.cu.CUdeviceptr(address)

    def reserve(self, nbytes: int) -> int:
        va = self._check("cuMemAddressReserve",
                         self.cu.cuMemAddressReserve(nbytes, self.granularity, 0, 0))
        return int(va)

    def address_free(self, base: int, nbytes: int) -> None:
        self._check("cuMemAddressFree", self.cu.cuMemAddressFree(self.ptr(base), nbytes))

    def create(self, nbytes: int) -> Any:
        return self._timed("create", lambda: self.cu.cuMemCreate(nbytes, self.prop, 0))

    def map(self, address: int, nbytes: int, handle: Any) -> None:
        self._timed("map", lambda: self.cu.cuMemMap(self.ptr(address), nbytes, 0, handle, 0))

    def set_access(self, address: int, nbytes: int) -> None:
        self._timed("set_access", lambda: self.cu.cuMemSetAccess(
            self.ptr(address), nbytes, [self.access], 1))

    def unmap(self, address: int, nbytes: int) -> None:
        self._timed("unmap", lambda: self.cu.cuMemUnmap(self.ptr(address), nbytes))

    def release(self, handle: Any) -> None:
        self._timed("release", lambda: self.cu.cuMemRelease(handle))

    def call_stats(self) -> dict[str, Any]:
        return {name: {"count": len(v), "mean_us": round(sum(v) / len(v) * 1e6, 2),
                       "p50_us": round((percentile(v, 50) or 0) * 1e6, 2),
                       "p99_us": round((percentile(v, 99) or 0) * 1e6, 2)}
                for name, v in self.calls.items() if v}


class _CudaArray:
    """Lets torch wrap a mapped VA range as a uint8 tensor (for the content check only)."""

    def __init__(self, address: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                         "data": (address, False), "version": 3}


@dataclass
class VmmHooks:
    """What the VMM run needs from torch; replaced by fakes in a CPU self-check."""

    mem_free: Callable[[], int]
    fence: Callable[[], None]
    fill: Callable[[int, int, int], None] | None  # (address, nbytes, value)
    check: Callable[[int, int, int], bool] | None


def run_vmm_core(vmm: Vmm, hooks: VmmHooks, *, mode: str, card_bytes: int, chunk: int,
                 handle_bytes: int, headroom: int, convert_bytes: int) -> dict[str, Any]:
    """Fill, convert, verify, clean up. Every mapping is undone before returning."""
    gran = vmm.granularity
    if handle_bytes % gran or chunk % handle_bytes:
        raise ValueError(f"handle {handle_bytes} must be a multiple of the granularity {gran} "
                         f"and divide the chunk {chunk}")
    free0 = hooks.mem_free()
    kv_bytes = (free0 - headroom) // gran * gran
    sizes = _chunk_sizes(kv_bytes, chunk)
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    n_convert = min(convert_bytes // chunk, len(sizes) - 1)
    kv_base = vmm.reserve(kv_bytes)
    exp_base = vmm.reserve(n_convert * chunk)
    kv_handles: dict[int, list[Any]] = {}  # chunk index -> handles mapped in the KV range
    exp_handles: dict[int, list[Any]] = {}  # expert chunk -> handles mapped in its range
    loose: list[Any] = []  # created but not mapped (alloc-first OOM)
    run = Conversion(mode, chunk, 0)
    try:
        started = time.perf_counter()
        for index, (offset, size) in enumerate(zip(offsets, sizes, strict=True)):
            handles = []
            pieces = [handle_bytes] * (size // handle_bytes)
            pieces += [size % handle_bytes] if size % handle_bytes else []
            for k, piece in enumerate(pieces):
                handle = vmm.create(piece)
                handles.append(handle)
                vmm.map(kv_base + offset + k * handle_bytes, piece, handle)
            kv_handles[index] = handles
            vmm.set_access(kv_base + offset, size)
            if hooks.fill is not None:
                hooks.fill(kv_base + offset, size, index % 251)
        hooks.fence()
        fill_s = time.perf_counter() - started
        vmm.calls.clear()  # report the conversion's calls only
        run.start_free = hooks.mem_free()
        wall = time.perf_counter()
        for step in range(n_convert):
            index = len(sizes) - 1 - step
            kv_addr, exp_addr = kv_base + offsets[index], exp_base + step * chunk
            per_chunk = chunk // handle_bytes
            try:
                if mode == "vmm_alloc_first":
                    t0 = time.perf_counter()
                    new = []
                    try:
                        for _ in range(per_chunk):
                            new.append(vmm.create(handle_bytes))  # noqa: PERF401 - keep what an OOM left
                    except VmmError:
                        loose.extend(new)
                        raise
                    for k, handle in enumerate(new):
                        vmm.map(exp_addr + k * handle_bytes, handle_bytes, handle)
                    exp_handles[step] = new
                    vmm.set_access(exp_addr, chunk)
                    t1 = time.perf_counter()
                    run.sample(hooks.mem_free())
                    t2 = time.perf_counter()
                    hooks.fence()
                    vmm.unmap(kv_addr, chunk)
                    for handle in kv_handles.pop(index):
                        vmm.release(handle)
                    t3 = time.perf_counter()
                else:
                    t0 = time.perf_counter()
                    hooks.fence()  # the last kernel reading these pages must be done
                    vmm.unmap(kv_addr, chunk)
                    handles = kv_handles.pop(index)
                    if mode == "vmm_recreate":
                        for handle in handles:
                            vmm.release(handle)
                    t1 = time.perf_counter()
                    run.sample(hooks.mem_free())
                    t2 = time.perf_counter()
                    if mode == "vmm_recreate":
                        handles = []
                        try:
                            for _ in range(per_chunk):
                                handles.append(vmm.create(handle_bytes))
                        except VmmError:
                            loose.extend(handles)
                            raise
                    for k, handle in enumerate(handles):
                        vmm.map(exp_addr + k * handle_bytes, handle_bytes, handle)
                    exp_handles[step] = handles
                    vmm.set_access(exp_addr, chunk)
                    t3 = time.perf_counter()
            except VmmError as exc:
                if not vmm.is_oom(exc):
                    raise
                run.oom, run.oom_at_chunk = True, step
                run.oom_error = f"{exc} after {len(loose)} of {per_chunk} handles"
                run.sample(hooks.mem_free())
                break
            run.sample(hooks.mem_free())
            run.pauses.append((t1 - t0) + (t3 - t2))
            run.converted_bytes += chunk
        run.wall_s = time.perf_counter() - wall
        content_kept = None
        if mode in ("vmm_remap", "vmm_remap_chunk_handle") and hooks.check is not None:
            hooks.fence()
            content_kept = all(
                hooks.check(exp_base + step * chunk, chunk, (len(sizes) - 1 - step) % 251)
                for step in exp_handles)
        run.extra.update({
            "handle_bytes": handle_bytes, "granularity_bytes": gran,
            "recommended_granularity_bytes": vmm.recommended,
            "kv_pool_bytes": kv_bytes, "kv_chunks": len(sizes), "fill_s": round(fill_s, 4),
            "card_fill_fraction": round(1 - run.start_free / card_bytes, 5),
            "content_kept_by_remap": content_kept, "calls": vmm.call_stats(),
        })
    finally:
        hooks.fence()
        for index, handles in kv_handles.items():
            vmm.unmap(kv_base + offsets[index], sizes[index])
            for handle in handles:
                vmm.release(handle)
        for step, handles in exp_handles.items():
            vmm.unmap(exp_base + step * chunk, chunk)
            for handle in handles:
                vmm.release(handle)
        for handle in loose:
            vmm.release(handle)
        vmm.address_free(kv_base, kv_bytes)
        vmm.address_free(exp_base, n_convert * chunk)
    return run.to_json()


def run_vmm(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    import torch
    from cuda.bindings import driver as cu

    from engine.reference.memory import emulate_card

    device = torch.device("cuda")
    torch.cuda.init()  # type: ignore[no-untyped-call]
    # As in run_torch: load the fill kernel while there is room for its module.
    torch.empty(1 << 20, dtype=torch.uint8, device=device).fill_(1)
    torch.cuda.synchronize()
    index = torch.cuda.current_device()
    vmm = Vmm(cu, index)
    chunk = args.chunk_mib * MIB
    handle = chunk if mode == "vmm_remap_chunk_handle" else vmm.granularity

    def fill(address: int, nbytes: int, value: int) -> None:
        torch.as_tensor(_CudaArray(address, nbytes), device=device).fill_(value)

    def check(address: int, nbytes: int, value: int) -> bool:
        # min/max, not `view == value`: a 64 MiB temporary would not fit on the full card.
        view = torch.as_tensor(_CudaArray(address, nbytes), device=device)
        return int(view.min()) == value == int(view.max())

    hooks = VmmHooks(mem_free=lambda: torch.cuda.mem_get_info(device)[0],
                     fence=torch.cuda.synchronize, fill=fill, check=check)
    filler = emulate_card(args.card_gib * GIB, device)
    try:
        result = run_vmm_core(vmm, hooks, mode=mode, card_bytes=args.card_gib * GIB,
                              chunk=chunk, handle_bytes=handle, headroom=args.headroom_mib * MIB,
                              convert_bytes=args.convert_gib * GIB)
    finally:
        filler.release()
    import cuda.bindings

    result["cuda_bindings"] = getattr(cuda.bindings, "__version__", None)
    return result


# --- driver ------------------------------------------------------------------------------------


def _machine() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version(),
                            "date": time.strftime("%Y-%m-%d", time.gmtime())}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update({"gpu": props.name, "gpu_total_bytes": props.total_memory,
                     "cuda_runtime": torch.version.cuda})
    return info


def child_main(args: argparse.Namespace) -> int:
    mode = args.child
    try:
        if mode.startswith("torch"):
            result = run_torch(args, alloc_first=mode == "torch_alloc_first")
        else:
            result = run_vmm(args, mode)
        result["machine"] = _machine()
    except Exception as exc:  # noqa: BLE001 - the parent reports any failure of a mode
        result = {"mode": mode, "error": f"{type(exc).__name__}: {exc}"}
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def parent_main(args: argparse.Namespace) -> int:
    report: dict[str, Any] = {
        "bench": "gpu_alloc",
        "config": {"card_gib": args.card_gib, "chunk_mib": args.chunk_mib,
                   "convert_gib": args.convert_gib, "headroom_mib": args.headroom_mib},
        "modes": {},
    }
    script = str(Path(__file__).resolve())
    root = str(Path(__file__).resolve().parent.parent)
    for mode in args.modes:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        if mode.startswith("torch"):
            env["PYTORCH_CUDA_ALLOC_CONF"] = _EXPANDABLE  # before torch initialises CUDA
        else:
            env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        cmd = [sys.executable, script, "--child", mode, "--card-gib", str(args.card_gib),
               "--chunk-mib", str(args.chunk_mib), "--convert-gib", str(args.convert_gib),
               "--headroom-mib", str(args.headroom_mib)]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                  timeout=args.timeout_s, check=False)
        except subprocess.TimeoutExpired:
            report["modes"][mode] = {"mode": mode, "error": f"timed out after {args.timeout_s}s"}
            continue
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if lines:
            result = json.loads(lines[-1][len("RESULT "):])
        else:
            result = {"mode": mode, "error": f"exit {proc.returncode}",
                      "stderr_tail": proc.stderr[-2000:]}
        if proc.returncode != 0:
            result["exit_code"] = proc.returncode
            result["stderr_tail"] = proc.stderr[-2000:]
        report.setdefault("machine", result.pop("machine", None))
        result.pop("machine", None)
        report["modes"][mode] = result
    modes = report["modes"]
    report["summary"] = {
        mode: {key: r.get(key) for key in ("ms_per_gib", "pause_p50_ms", "pause_p99_ms",
                                           "transient_bytes", "oom")}
        for mode, r in modes.items()
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--card-gib", type=int, default=16)
    parser.add_argument("--chunk-mib", type=int, default=64)
    parser.add_argument("--convert-gib", type=int, default=4)
    parser.add_argument("--headroom-mib", type=int, default=48,
                        help="free memory left after the KV fill (default: less than a chunk)")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--timeout-s", type=float, default=240.0)
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", choices=MODES, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    return child_main(args) if args.child else parent_main(args)


if __name__ == "__main__":
    sys.exit(main())
