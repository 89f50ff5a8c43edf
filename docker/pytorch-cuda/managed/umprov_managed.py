"""PyTorch on CUDA managed (unified) memory: umprov's pool (docs/managed-memory.md).

    import umprov_managed
    umprov_managed.enable()          # before the tensors that should be managed
    ...
    umprov_managed.stats()           # bytes placed on the GPU and spilled to the host

In umprov's image, UMPROV_MANAGED_MEMORY=1 (`umprov deploy --managed-memory`) enables it in
every Python that imports torch: umprov_managed.pth installs ``after_torch_import``.

PyTorch's caching allocator stays the allocator: every allocation of the process is routed
into a ``torch.cuda.MemPool`` per device whose segments are managed memory
(libumprov_managed.so), so ``torch.cuda.memory_allocated``, ``record_stream``, cuDNN's
benchmark and CUDA graphs work as without it. A CUDA graph's capture and a
``torch.cuda.use_mem_pool`` block get their own pool, as they would without it.

UMPROV_MANAGED_BUDGET (bytes, or with k/m/g) caps the device memory segments are placed in;
by default it is what the GPU has free at the first segment, less UMPROV_MANAGED_RESERVE
(default 1g) for what allocates outside PyTorch (CUDA's own context, NCCL, cuDNN). Spilled
segments are bounded by the host's available memory less UMPROV_MANAGED_HOST_RESERVE
(default 2g); past it PyTorch raises out-of-memory.

Only what torch 2.9 and later both have is used (tests/unit/test_managed_torch_api.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.abc
import importlib.util
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

LIBRARY = Path(os.environ.get("UMPROV_MANAGED_LIBRARY",
                              str(Path(__file__).with_name("libumprov_managed.so"))))
STATS = ("budget", "placed", "spilled", "peak_placed", "peak_spilled", "allocations",
         "failed_advice", "refused", "host_budget")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}

_state: dict[str, Any] = {}  # library, allocator, pools by device, routed devices
_lock = threading.RLock()


def size_of(text: str) -> int:
    """'2g', '512m', '1073741824' as bytes; ValueError otherwise."""
    text = text.strip().lower().rstrip("ib").rstrip("b")
    unit = text[-1:] if text[-1:] in _UNITS else ""
    number = float(text[: len(text) - len(unit)])
    if number < 0:
        raise ValueError(text)
    return int(number * _UNITS[unit])


def async_backend() -> str | None:
    """The allocator setting that rules the pool out, or None: cudaMallocAsync has no
    memory pools of PyTorch's (and replacing it would trip torch's backend assertion)."""
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        value = os.environ.get(name, "")
        if "cudamallocasync" in value.replace(" ", "").lower():
            return f"{name}={value}"
    return None


@functools.cache
def _cudart() -> ctypes.CDLL:
    """The libcudart torch loaded: one CUDA runtime and context in the process."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "libcudart.so" in line:
                return ctypes.CDLL(line.split()[-1])
    raise RuntimeError("torch has loaded no CUDA runtime (a CPU build of torch?)")


def _env_size(name: str, default: str) -> int:
    value = os.environ.get(name, "") or default
    try:
        return size_of(value)
    except ValueError:
        raise RuntimeError(f"{name}={value!r} is not a size (bytes, or with k/m/g)") from None


def _library(budget: int, reserve: int) -> ctypes.CDLL:
    cudart = _cudart()
    version = ctypes.c_int()
    cudart.cudaRuntimeGetVersion(ctypes.byref(version))

    def address(name: str) -> int | None:
        return ctypes.cast(getattr(cudart, name), ctypes.c_void_p).value

    lib = ctypes.CDLL(str(LIBRARY))
    lib.umprov_um_init.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] + [ctypes.c_longlong] * 4
    lib.umprov_um_on_device.argtypes = [ctypes.c_void_p]
    host_reserve = _env_size("UMPROV_MANAGED_HOST_RESERVE", "2g")
    rc = lib.umprov_um_init(address("cudaMallocManaged"), address("cudaFree"),
                            address("cudaMemGetInfo"), address("cudaMemAdvise"),
                            address("cudaMemPrefetchAsync"), version.value, budget, reserve,
                            -1, host_reserve)
    if rc != 0:
        raise RuntimeError(f"{LIBRARY}: umprov_um_init failed ({rc})")
    return lib


def enable(budget: int | None = None, reserve: int | None = None) -> None:
    """Route every CUDA allocation of this process into managed-memory pools (from now on, or
    from CUDA's start when it has not started)."""
    import torch

    if _state:
        return
    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device is available to torch")
    setting = async_backend()
    if setting:
        raise RuntimeError(f"{setting} selects CUDA's own pool allocator, which takes no "
                           "memory pool: PyTorch runs on it, without managed memory")
    env_budget = os.environ.get("UMPROV_MANAGED_BUDGET", "")
    budget = budget if budget is not None else size_of(env_budget) if env_budget else -1
    reserve = reserve if reserve is not None else _env_size("UMPROV_MANAGED_RESERVE", "1g")
    _state.update(budget=budget, reserve=reserve, pools={}, routed=set())
    _patch_other_pools(torch)
    if torch.cuda.is_initialized():
        _start(torch)
    else:
        torch.cuda._lazy_call(lambda: _start_or_say(torch))


def _start_or_say(torch: Any) -> None:
    """At CUDA's start (torch's lazy init), where an error would end the user's job: say why
    in one line and leave PyTorch as it is."""
    try:
        _start(torch)
    except Exception as exc:  # noqa: BLE001 - torch works on; say why it is not managed
        for device in list(_state.get("routed", ())):
            _unroute(torch, device)
        _state.clear()
        print(f"umprov managed memory: not enabled: {exc}", file=sys.stderr)


def _start(torch: Any) -> None:
    """The library, its allocator, every device routed, the optimizer's host step."""
    with _lock:
        if "allocator" in _state:
            return
        library = _library(_state["budget"], _state["reserve"])
        allocator = torch.cuda.memory.CUDAPluggableAllocator(
            str(LIBRARY), "umprov_um_malloc", "umprov_um_free")
        from umprov_managed_step import install  # the optimizer's step where its state lives

        _state.update(library=library, allocator=allocator)
        for device in range(torch.cuda.device_count()):
            _route(torch, device)
        install(library)


def _route(torch: Any, device: int) -> None:
    """Every allocation on ``device``, from any thread or stream, into its managed pool."""
    pools = _state["pools"]
    if device not in pools:
        # the pool belongs to the current device: select it without creating its context
        previous = torch.cuda._maybe_exchange_device(device)
        try:
            pools[device] = torch.cuda.MemPool(_state["allocator"].allocator())
        finally:
            torch.cuda._exchange_device(previous)
    torch._C._cuda_beginAllocateToPool(device, pools[device].id)
    _state["routed"].add(device)


def _unroute(torch: Any, device: int) -> None:
    """Routing off; the reference routing took on the pool given back (as torch's own
    use_mem_pool does), so a retired pool can become freeable."""
    pool = _state["pools"][device]
    torch._C._cuda_endAllocateToPool(device, pool.id)
    torch._C._cuda_releasePool(device, pool.id)
    _state["routed"].discard(device)


def settle() -> None:
    """Blocks freed after ``record_stream`` back into the pool, and retired pools' free
    segments given back. While routing is on, the caching allocator counts it as a capture
    underway: such blocks wait for a moment with no capture, and it never releases cached
    segments before raising out-of-memory. Here routing is off for that moment: empty_cache
    waits for their streams, frees them, and releases what no live pool holds. Once a step
    (umprov_managed_step's pre-step hook)."""
    import torch

    with _lock:
        routed = sorted(_state.get("routed", ()))
        if routed and torch.cuda.is_current_stream_capturing():
            return  # an armed settle stays armed for the next forward
        armed = _state.pop("settle_hook", None)
        if armed is not None:
            armed.remove()
        if not routed:
            return
        for device in routed:
            _unroute(torch, device)
        try:
            torch.cuda.empty_cache()
        finally:
            for device in routed:
                _route(torch, device)


def repool(device: int) -> None:
    """A fresh pool for ``device``'s allocations from now on; the old one is retired: what it
    still holds stays where it is, its free segments are given back (now, and at each settle
    as its blocks are freed), so nothing allocated later lands in a segment placed before (a
    gradient that spilled in the first step, say)."""
    import torch

    with _lock:
        if device not in _state.get("routed", ()):
            return
        _unroute(torch, device)
        try:  # torch's MemPool gives its reference back and empties its cache, unrouted
            del _state["pools"][device]
        finally:
            _route(torch, device)
        if "settle_hook" not in _state:
            _state["settle_hook"] = torch.nn.modules.module.register_module_forward_pre_hook(
                _settle_before_forward)


def _settle_before_forward(module: Any, args: Any) -> None:
    """Once, at the next module's forward after a repool: what the retired pool let go since
    (the gradients zero_grad freed) is given back before the new pool's first allocation
    takes the device's budget; otherwise those allocations spill and the new pool caches
    them spilled for good."""
    import torch

    if not torch.compiler.is_compiling():
        settle()  # removes this hook


@contextlib.contextmanager
def _set_aside(torch: Any, device: int | None) -> Iterator[None]:
    """Our routing off for a block that routes to a pool of its own (the caching allocator
    takes the first routing that matches, and ours matches everything)."""
    with _lock:
        device = torch.cuda.current_device() if device is None else device
        ours = device in _state.get("routed", ())
        if ours:
            _unroute(torch, device)
    try:
        yield
    finally:
        if ours:
            with _lock:
                _route(torch, device)


def _patch_other_pools(torch: Any) -> None:
    """CUDA graph captures (torch.compile's reduce-overhead) and use_mem_pool keep their own
    pools: a graph's memory must stay the graph's, a user's pool the user's."""
    graph = torch.cuda.graphs.CUDAGraph
    begin, end = graph.capture_begin, graph.capture_end

    def capture_begin(self: Any, *args: Any, **kwargs: Any) -> None:
        stack = contextlib.ExitStack()
        stack.enter_context(_set_aside(torch, None))
        try:
            begin(self, *args, **kwargs)
        except BaseException:
            stack.close()
            raise
        self._umprov_aside = stack

    def capture_end(self: Any) -> None:
        try:
            end(self)
        finally:
            stack = self.__dict__.pop("_umprov_aside", None)
            if stack is not None:
                stack.close()

    graph.capture_begin, graph.capture_end = capture_begin, capture_end
    use = torch.cuda.memory.use_mem_pool

    @contextlib.contextmanager
    def use_mem_pool(pool: Any, device: Any = None) -> Iterator[None]:
        index = None if device is None else torch.cuda._utils._get_device_index(device)
        with _set_aside(torch, index), use(pool, device):
            yield

    torch.cuda.memory.use_mem_pool = torch.cuda.use_mem_pool = use_mem_pool


def enabled() -> bool:
    return "allocator" in _state


def on_device(where: Any) -> int:
    """1: the tensor's memory (or the address) is in a segment placed on the GPU; 0: spilled
    to the host; -1: not managed memory of this pool."""
    lib = _state.get("library")
    address = where if isinstance(where, int) else where.data_ptr()
    return -1 if lib is None else int(lib.umprov_um_on_device(address))


def empty_cache() -> None:
    """Give back cached segments (PyTorch's torch.cuda.empty_cache does the same)."""
    import torch

    torch.cuda.empty_cache()


def stats() -> dict[str, int]:
    """The pool's segments: its budgets, bytes on the device and on the host (now and at their
    peak), segments allocated, advice calls the driver refused, segments refused."""
    lib = _state.get("library")
    out = (ctypes.c_longlong * len(STATS))()
    if lib is not None:
        lib.umprov_um_stats(out)
    return dict(zip(STATS, out, strict=True))


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Runs ``enable`` once torch's own module has run (before any CUDA tensor can exist)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            try:
                enable()
            except Exception as exc:  # noqa: BLE001 - torch works on; say why it is not managed
                print(f"umprov managed memory: not enabled: {exc}", file=sys.stderr)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def after_torch_import() -> None:
    """With UMPROV_MANAGED_MEMORY=1: enable the pool as soon as torch is imported."""
    if (os.environ.get("UMPROV_MANAGED_MEMORY") == "1" and "torch" not in sys.modules
            and not any(isinstance(f, _AfterTorch) for f in sys.meta_path)):
        sys.meta_path.insert(0, _AfterTorch())
