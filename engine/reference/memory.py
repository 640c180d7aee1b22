"""Device memory for the reference engine's pools: one owner, exact accounting, small cards.

The ladder's promise is that no instant of a transition exceeds the budget, so the engine must
be able to say exactly how many bytes its pools hold at any moment. Every pool allocation goes
through `DeviceMemory`, which keeps the live tensors (so nothing it counts can be freed behind
its back) and their byte counts per tag.

Two ways to get a small card:
- CPU: `capacity_bytes` caps the sum of live allocations and raises `torch.OutOfMemoryError`,
  the exception a real CUDA OOM raises, so callers handle one type.
- CUDA: `emulate_card` takes the rest of the GPU with a driver allocation outside torch:
  `mem_get_info`, `cudaMalloc` and the CUDA context then all see a card of the target size,
  and OOM comes from the driver through torch's normal retry path. A cap on torch's own
  reservations would leave everything outside torch unconstrained, so on CUDA `DeviceMemory`
  never caps itself.
"""

from __future__ import annotations

import ctypes
import gc
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch

__all__ = ["DeviceMemory", "Filler", "emulate_card", "enable_expandable_segments"]

_EXPANDABLE = "expandable_segments:True"


def enable_expandable_segments() -> None:
    """Let `empty_cache()` hand back freed 20 MiB pages even inside a live segment.

    Without it a freed chunk next to a live one pins its whole `cudaMalloc` segment, and a
    near-full card OOMs with GiBs reserved but unallocated.
    """
    if not torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        # Read once when the caching allocator starts; an explicit user setting wins.
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", _EXPANDABLE)
    else:
        torch.cuda.memory._set_allocator_settings(_EXPANDABLE)


@dataclass(frozen=True, slots=True)
class _Allocation:
    tensor: torch.Tensor
    nbytes: int
    tag: str


class DeviceMemory:
    """Owns every allocation the pools make and counts them exactly."""

    def __init__(
        self, device: torch.device | str = "cpu", *, capacity_bytes: int | None = None
    ) -> None:
        self.device = torch.device(device)
        if capacity_bytes is not None:
            if self.device.type == "cuda":
                raise ValueError(
                    "capacity_bytes caps only emulated (CPU) memory; on CUDA use "
                    "emulate_card() so the driver, not torch, enforces the size"
                )
            if capacity_bytes < 0:
                raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        # Keyed by storage address: a view the caller made of an allocation frees it too.
        self._live: dict[int, _Allocation] = {}
        self._allocated_bytes = 0
        self._peak_bytes = 0

    @property
    def allocated_bytes(self) -> int:
        """Sum of the sizes of the live allocations, to the byte."""
        return self._allocated_bytes

    @property
    def peak_bytes(self) -> int:
        """Largest `allocated_bytes` since construction or the last `reset_peak()`."""
        return self._peak_bytes

    @property
    def free_bytes(self) -> int | None:
        """Room left under `capacity_bytes`; None when uncapped (the driver decides)."""
        if self.capacity_bytes is None:
            return None
        return self.capacity_bytes - self._allocated_bytes

    def reset_peak(self) -> None:
        self._peak_bytes = self._allocated_bytes

    def bytes_by_tag(self) -> dict[str, int]:
        totals: defaultdict[str, int] = defaultdict(int)
        for allocation in self._live.values():
            totals[allocation.tag] += allocation.nbytes
        return dict(totals)

    def alloc(self, nbytes: int, *, tag: str) -> torch.Tensor:
        """A flat uint8 tensor of exactly `nbytes`; callers `.view(dtype).view(shape)` it."""
        if nbytes <= 0:
            # A zero-byte storage has no unique address to key the allocation by.
            raise ValueError(f"{tag}: allocation size must be > 0 bytes, got {nbytes}")
        free = self.free_bytes
        if free is not None and nbytes > free:
            raise torch.OutOfMemoryError(
                f"CPU out of memory (emulated card of {self.capacity_bytes} bytes). "
                f"Tried to allocate {nbytes} bytes; {free} bytes free."
            )
        tensor = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        self._live[tensor.untyped_storage().data_ptr()] = _Allocation(tensor, nbytes, tag)
        self._allocated_bytes += nbytes
        self._peak_bytes = max(self._peak_bytes, self._allocated_bytes)
        return tensor

    def free(self, tensor: torch.Tensor) -> None:
        """Forget an allocation; its bytes are released once the caller drops its views."""
        allocation = self._live.pop(tensor.untyped_storage().data_ptr(), None)
        if allocation is None:
            raise ValueError("tensor was not allocated by this DeviceMemory (or freed twice)")
        self._allocated_bytes -= allocation.nbytes

    def release_to_driver(self) -> None:
        """Give torch's cached free blocks back to the driver so another pool can map them.

        `del` alone returns a block to torch's cache only; memory allocated outside
        torch, and a differently sized torch request, cannot use it. Synchronizes the device.
        """
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


# --- CUDA card emulation -------------------------------------------------------------------


class _CudaAllocator:
    """Raw device allocations through the driver (libcuda) or, failing that, libcudart."""

    def __init__(self, device_index: int) -> None:
        self.device_index = device_index
        self.backend: str
        try:
            self._lib = _load_library("libcuda.so", ("libcuda.so.1", "libcuda.so"))
            self.backend = "driver"
            self._init_driver()
        except OSError:
            self._lib = _load_library(
                "libcudart.so",
                ("libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"),
            )
            self.backend = "runtime"
            self._init_runtime()

    def _init_driver(self) -> None:
        lib = self._lib
        lib.cuInit.argtypes = [ctypes.c_uint]
        lib.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        lib.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
        lib.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
        lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
        lib.cuMemFree_v2.argtypes = [ctypes.c_uint64]
        lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        for name in ("cuInit", "cuDeviceGet", "cuCtxGetCurrent", "cuDevicePrimaryCtxRetain",
                     "cuCtxSetCurrent", "cuMemAlloc_v2", "cuMemFree_v2", "cuGetErrorName"):
            getattr(lib, name).restype = ctypes.c_int
        self._check(lib.cuInit(0), "cuInit")

    def _init_runtime(self) -> None:
        lib = self._lib
        lib.cudaSetDevice.argtypes = [ctypes.c_int]
        lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        lib.cudaFree.argtypes = [ctypes.c_void_p]
        lib.cudaGetErrorString.argtypes = [ctypes.c_int]
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        for name in ("cudaSetDevice", "cudaMalloc", "cudaFree"):
            getattr(lib, name).restype = ctypes.c_int

    def _check(self, code: int, call: str) -> None:
        if code == 0:
            return
        if self.backend == "driver":
            name = ctypes.c_char_p()
            self._lib.cuGetErrorName(code, ctypes.byref(name))
            text = (name.value or b"?").decode()
        else:
            text = (self._lib.cudaGetErrorString(code) or b"?").decode()
        raise RuntimeError(f"{call} failed with {text} ({code})")

    def _make_context_current(self) -> None:
        # Torch's runtime calls leave the primary context current on its thread only; the
        # driver API needs one here too, and it must be that same primary context.
        ctx = ctypes.c_void_p()
        self._check(self._lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
        if ctx.value:
            return
        dev = ctypes.c_int()
        self._check(self._lib.cuDeviceGet(ctypes.byref(dev), self.device_index), "cuDeviceGet")
        self._check(self._lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev.value),
                    "cuDevicePrimaryCtxRetain")
        self._check(self._lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def malloc(self, nbytes: int) -> int:
        if self.backend == "driver":
            self._make_context_current()
            ptr = ctypes.c_uint64()
            self._check(self._lib.cuMemAlloc_v2(ctypes.byref(ptr), nbytes), "cuMemAlloc_v2")
            return int(ptr.value)
        self._check(self._lib.cudaSetDevice(self.device_index), "cudaSetDevice")
        vptr = ctypes.c_void_p()
        self._check(self._lib.cudaMalloc(ctypes.byref(vptr), nbytes), "cudaMalloc")
        return int(vptr.value or 0)

    def free(self, ptr: int) -> None:
        if self.backend == "driver":
            self._make_context_current()
            self._check(self._lib.cuMemFree_v2(ptr), "cuMemFree_v2")
        else:
            self._check(self._lib.cudaSetDevice(self.device_index), "cudaSetDevice")
            self._check(self._lib.cudaFree(ctypes.c_void_p(ptr)), "cudaFree")


def _load_library(stem: str, names: tuple[str, ...]) -> ctypes.CDLL:
    # Prefer the copy this process already mapped (torch's own cudart, the driver torch uses).
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        maps = ""
    loaded = [line.split()[-1] for line in maps.splitlines() if stem in line.rsplit("/", 1)[-1]]
    errors: list[str] = []
    for name in [*dict.fromkeys(loaded), *names]:
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            errors.append(f"{name}: {exc}")
    raise OSError(f"cannot load {stem}: " + "; ".join(errors))


@dataclass(slots=True)
class Filler:
    """A driver allocation that makes the GPU look like a card of `total_bytes`.

    `get_device_properties().total_memory` still reports the real card: code that sizes pools
    from the device total must be given `total_bytes` instead.
    """

    device_index: int
    total_bytes: int
    nbytes: int
    free_bytes_after: int
    backend: str
    _ptr: int = field(repr=False)
    _allocator: _CudaAllocator = field(repr=False)
    _released: bool = field(default=False, repr=False)

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        """Give the filler back to the driver; calling it again does nothing."""
        if self._released:
            return
        self._allocator.free(self._ptr)
        self._released = True

    def __enter__(self) -> Filler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def emulate_card(total_bytes: int, device: torch.device | str | int = "cuda") -> Filler:
    """Fill the GPU outside torch so that this process sees a card of `total_bytes`.

    Whatever is already used on the device (this process's context and tensors, other
    processes) counts against `total_bytes`, as it would on a real card of that size. Load
    everything that must live outside the emulated budget before calling this.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("emulate_card needs a CUDA device")
    dev = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    if dev.type != "cuda":
        raise ValueError(f"emulate_card needs a CUDA device, got {dev}")
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    torch.cuda.init()  # type: ignore[no-untyped-call]
    with torch.cuda.device(index):
        # Make sure the context exists before measuring: it is part of "used".
        torch.empty(1, device=f"cuda:{index}")
        # Blocks cached by torch are invisible to allocations outside it: hand
        # them back first or the filler would count them as used for good.
        gc.collect()
        torch.cuda.empty_cache()
        free_now, device_total = torch.cuda.mem_get_info(index)
        used = device_total - free_now
        filler_bytes = free_now - (total_bytes - used)
        if total_bytes > device_total:
            raise ValueError(f"cannot emulate {total_bytes} bytes on a {device_total}-byte card")
        if filler_bytes <= 0:
            raise ValueError(
                f"cannot emulate a {total_bytes}-byte card: {used} bytes are already used"
            )
        allocator = _CudaAllocator(index)
        ptr = allocator.malloc(filler_bytes)
        free_after, _ = torch.cuda.mem_get_info(index)
    return Filler(index, total_bytes, filler_bytes, free_after, allocator.backend, ptr, allocator)
