"""PyTorch on CUDA managed (unified) memory: umprov's reservoir (docs/managed-memory.md).

    import umprov_managed
    umprov_managed.enable()          # before the tensors that should be managed
    ...
    umprov_managed.stats()           # bytes on the GPU and spilled to the host

In umprov's image, UMPROV_MANAGED_MEMORY=1 (`umprov deploy --managed-memory`) enables it in
every Python that imports torch: umprov_managed.pth installs ``after_torch_import``.

PyTorch's caching allocator stays the allocator, on device memory (less the headroom): statistics,
``record_stream``, cuDNN, CUDA graphs and expandable segments work as without it. Where it
runs out (after its own out-of-memory path gave its cache back), it takes a free block of the
device's reservoir instead of raising: a ``torch.cuda.MemPool(..., use_on_oom=True)`` whose
segments are managed memory kept on the host and mapped for the GPU (libumprov_managed.so),
allocated up front as address space (host pages come at first touch). PyTorch takes only free
blocks from such a pool, and only on the stream they were made on: the device's current
stream when its reservoir is made (at CUDA's start for the current device, or LOCAL_RANK's
under torchrun, and at ``torch.cuda.set_device``); an allocation on another stream past the
GPU's memory raises out-of-memory as it would without it.

UMPROV_MANAGED_RESERVOIR (bytes, or with k/m/g) sizes each device's reservoir; by default
half of the host's available memory (less UMPROV_MANAGED_HOST_RESERVE, default 2g) shared
among the node's processes (LOCAL_WORLD_SIZE): the other half is the optimizer's host step's.
UMPROV_MANAGED_BUDGET caps the device memory PyTorch itself takes (a process memory fraction
with the reservoir counted in), so the reservoir is used sooner (tests, umprov verify).
The reservoir counts in ``torch.cuda.memory_reserved`` as any pool's segments do.
UMPROV_MANAGED_HEADROOM (default 512m, 0: none) is device memory the caching allocator leaves
free for CUDA itself (kernels' modules loaded at their first launch, cuBLAS handles): where it
would take more, it turns to the reservoir (libumprov_managed.so guards its cudaMalloc).

Only what torch 2.9 and later both have is used (tests/unit/test_managed_torch_api.py).
"""

from __future__ import annotations

import ctypes
import functools
import importlib.abc
import importlib.util
import os
import sys
import threading
from pathlib import Path
from typing import Any

from umprov_managed_conf import (  # noqa: F401 - ruled_out: the verifier's check reads it here
    SMALL,
    expandable_off,
    fraction_with,
    patch_memory_fraction,
    ruled_out,
    size_of,
    torch_set_fraction,
)

LIBRARY = Path(os.environ.get("UMPROV_MANAGED_LIBRARY",
                              str(Path(__file__).with_name("libumprov_managed.so"))))
STATS = ("bytes", "peak_bytes", "allocations", "failed_advice", "refused",
         "host_budget")  # the library's counters, in its order
MIN_RESERVOIR = 256 << 20  # smaller is not worth a reservoir (a host short of memory)
GUARDED = "libc10_cuda.so"  # the caching allocator's library: its cudaMalloc keeps the headroom
CONCURRENT_MANAGED_ACCESS = 89  # cudaDevAttrConcurrentManagedAccess

_state: dict[str, Any] = {}  # library, allocator, reservoirs and their sizes by device
_fractions: dict[int, float] = {}  # the job's own memory fractions, by device
_lock = threading.RLock()


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


def _library() -> ctypes.CDLL:
    """The segment library: every segment it makes is kept on the host and mapped for the
    GPU, within the host's available memory less UMPROV_MANAGED_HOST_RESERVE."""
    cudart = _cudart()
    version = ctypes.c_int()
    cudart.cudaRuntimeGetVersion(ctypes.byref(version))

    def address(name: str) -> int | None:
        return ctypes.cast(getattr(cudart, name), ctypes.c_void_p).value

    lib = ctypes.CDLL(str(LIBRARY))
    declare(lib)
    host_reserve = _env_size("UMPROV_MANAGED_HOST_RESERVE", "2g")
    rc = lib.umprov_um_init(address("cudaMallocManaged"), address("cudaFree"),
                            address("cudaMemAdvise"), version.value, -1, host_reserve)
    if rc != 0:
        raise RuntimeError(f"{LIBRARY}: umprov_um_init failed ({rc})")
    return lib


def _keep_headroom(lib: ctypes.CDLL) -> None:
    """The caching allocator's cudaMalloc leaves the headroom free (once the reservoir is
    there to turn to: without one it would only run out of memory sooner)."""
    if not _state.get("headroom"):
        return
    cudart = _cudart()
    pointed = lib.umprov_headroom_install(
        GUARDED.encode(), *(ctypes.cast(getattr(cudart, name), ctypes.c_void_p).value
                            for name in ("cudaMalloc", "cudaMemGetInfo", "cudaGetLastError")),
        _state["headroom"])
    if pointed <= 0:  # the reservoir works on; CUDA may find the device full
        _state["headroom"] = 0
        print(f"umprov managed memory: no headroom kept for CUDA: {GUARDED}'s cudaMalloc "
              f"{'not found' if pointed == 0 else 'could not be pointed'}", file=sys.stderr)


def declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """The library's functions as C declares them (umprov_managed.c)."""
    lib.umprov_um_init.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] + [ctypes.c_longlong] * 2
    lib.umprov_um_malloc.restype = ctypes.c_void_p
    lib.umprov_um_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.umprov_um_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int,
                                   ctypes.c_void_p]
    lib.umprov_um_free.restype = None
    lib.umprov_um_owns.argtypes = [ctypes.c_void_p]
    lib.umprov_um_owns.restype = ctypes.c_int
    lib.umprov_um_stats.argtypes = [ctypes.POINTER(ctypes.c_longlong)]
    lib.umprov_um_stats.restype = None
    lib.umprov_headroom_install.argtypes = [ctypes.c_char_p] + [ctypes.c_void_p] * 3 + [
        ctypes.c_longlong]
    lib.umprov_headroom_install.restype = ctypes.c_int
    lib.umprov_headroom_set.argtypes = [ctypes.c_longlong]
    lib.umprov_headroom_set.restype = None
    lib.umprov_headroom_refused.argtypes = []
    lib.umprov_headroom_refused.restype = ctypes.c_longlong
    return lib


def enable(budget: int | None = None, reservoir: int | None = None) -> None:
    """A reservoir of managed memory behind PyTorch's allocator on each device this process
    uses (from now on, or from CUDA's start when it has not started). ``budget``: the device
    bytes PyTorch itself may take; ``reservoir``: each reservoir's bytes."""
    import torch

    if _state:
        return
    if not torch.backends.cuda.is_built():  # not is_available(): that starts CUDA at import
        raise RuntimeError("this torch is built without CUDA")
    why = ruled_out()
    if why:
        raise RuntimeError(why)
    if budget is None:
        env_budget = os.environ.get("UMPROV_MANAGED_BUDGET", "")
        budget = _env_size("UMPROV_MANAGED_BUDGET", env_budget) if env_budget else -1
    env_size = os.environ.get("UMPROV_MANAGED_RESERVOIR", "")
    if reservoir is None and env_size:
        reservoir = _env_size("UMPROV_MANAGED_RESERVOIR", env_size)
    headroom = _env_size("UMPROV_MANAGED_HEADROOM", "512m")
    _state.update(budget=budget, reservoir=reservoir, headroom=headroom, reservoirs={},
                  sizes={}, peak=0)
    _patch_set_device(torch)
    patch_memory_fraction(torch, lambda device: _state.get("sizes", {}).get(device, 0),
                          _fractions)
    if not torch.cuda.is_initialized():
        torch.cuda._lazy_call(lambda: _start_or_say(torch))
        return
    try:
        _start(torch)
    except BaseException:
        _state.clear()  # nothing half made: enable() may be called again
        raise


def _start_or_say(torch: Any) -> None:
    """At CUDA's start (torch's lazy init), where an error would end the user's job: say why
    in one line and leave PyTorch as it is."""
    try:
        _start(torch)
    except Exception as exc:  # noqa: BLE001 - torch works on; say why it is not managed
        _state.clear()
        print(f"umprov managed memory: not enabled: {exc}", file=sys.stderr)


def _start(torch: Any) -> None:
    """The library, its allocator, the first device's reservoir, the optimizer's host step."""
    with _lock:
        if "allocator" in _state:
            return
        library = _library()
        allocator = torch.cuda.memory.CUDAPluggableAllocator(
            str(LIBRARY), "umprov_um_malloc", "umprov_um_free")
        from umprov_managed_step import install  # the optimizer's step where its state lives

        _state.update(library=library, allocator=allocator)
        _fill(torch, _first_device(torch))
        install(library)
        _keep_headroom(library)


def _first_device(torch: Any) -> int:
    """The device this process works on: the one set_device selects where that call starts
    CUDA (before the device is current), else LOCAL_RANK's under torchrun, else the current
    one. One context, not one a GPU."""
    if "selecting" in _state:
        return _state["selecting"]
    rank = os.environ.get("LOCAL_RANK", "")
    count = torch.cuda.device_count()
    return int(rank) if rank.isdigit() and int(rank) < count else torch.cuda.current_device()


def _default_size(meminfo_path: str = "/proc/meminfo") -> int:
    """Half the host's available memory less its reserve and the reservoirs made already
    (address space: their host pages come at first touch), shared by the node's processes."""
    with open(meminfo_path) as meminfo:
        kib = next(int(ln.split()[1]) for ln in meminfo if ln.startswith("MemAvailable:"))
    spare = (kib << 10) - _env_size("UMPROV_MANAGED_HOST_RESERVE", "2g")
    spare -= sum(_state.get("sizes", {}).values())
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    return spare // 2 // (int(local) if local.isdigit() and int(local) > 0 else 1)


def _fill(torch: Any, device: int) -> None:
    """``device``'s reservoir: a use_on_oom pool of managed memory, one large free block and
    SMALL small ones, made on the device's current stream; then the budget, if one is set."""
    with _lock:
        if device in _state["reservoirs"]:
            return
        size = _state["reservoir"] if _state["reservoir"] is not None else _default_size()
        if size < MIN_RESERVOIR:
            raise RuntimeError(f"a reservoir of {size >> 20} MiB is too small to be of use "
                               "(UMPROV_MANAGED_RESERVOIR, or the host's available memory)")
        size += SMALL << 20
        _check_concurrent_access(device)  # these refuse before anything is made
        fraction = _budget_fraction(torch, device, size)
        cap = torch_set_fraction(torch)
        if device in _fractions:  # the job's own cap is of device memory: not the reservoir's
            cap(1.0, device)
        with torch.cuda.device(device):
            pool = _pool_of(torch, size)
            # the host step's copy streams, made while the device has room: CUDA needs
            # device memory for a stream, and PyTorch may have taken it all by the step
            _state.setdefault("streams", {})[device] = (torch.cuda.Stream(), torch.cuda.Stream())
        _state["reservoirs"][device] = pool
        _state["sizes"][device] = size
        if fraction is not None:
            cap(fraction, device)
        elif device in _fractions:
            cap(fraction_with(torch, device, _fractions[device], size), device)


def _check_concurrent_access(device: int) -> None:
    """The GPU reads host-preferred managed memory where it lies only with concurrent managed
    access; without it (WSL, a vGPU without unified memory, GPUs before Pascal) CUDA moves
    every managed allocation to the GPU whole at each launch."""
    value = ctypes.c_int()
    rc = _cudart().cudaDeviceGetAttribute(ctypes.byref(value), CONCURRENT_MANAGED_ACCESS,
                                          device)
    if rc != 0 or value.value != 1:
        seen = f"error {rc}" if rc else "0"
        raise RuntimeError(f"GPU {device} has no concurrent managed access "
                           f"(cudaDevAttrConcurrentManagedAccess: {seen}; WSL, a vGPU without "
                           "unified memory, or a GPU before Pascal): CUDA would move the "
                           "reservoir to the GPU whole")


def _pool_of(torch: Any, size: int) -> Any:
    """A use_on_oom pool of the current device holding ``size`` bytes as free blocks: one
    large one and SMALL of 1 MiB. Made with expandable segments off: PyTorch refuses them in
    a pool of its own allocator, and its out-of-memory path only takes free blocks there."""
    pool = torch.cuda.MemPool(_state["allocator"].allocator(), use_on_oom=True)
    try:
        with expandable_off(torch), torch.cuda.use_mem_pool(pool):
            held = [torch.empty(size - (SMALL << 20), dtype=torch.uint8, device="cuda")]
            held += [torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
                     for _ in range(SMALL)]
    except torch.OutOfMemoryError:
        raise RuntimeError(f"the host refused a reservoir of {(size >> 20) - SMALL} MiB "
                           "(UMPROV_MANAGED_RESERVOIR, UMPROV_MANAGED_HOST_RESERVE)") from None
    del held
    return pool


def _budget_fraction(torch: Any, device: int, size: int) -> float | None:
    """The memory fraction that caps PyTorch's own device memory at the budget (None: no
    budget). The fraction counts every segment, so the reservoir's address space is in it."""
    if _state["budget"] < 0:
        return None
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = (_state["budget"] + size) / total
    if fraction > 1:
        room = total - _state["budget"] - (SMALL << 20)
        fix = (f"set UMPROV_MANAGED_RESERVOIR={room >> 20}m or less" if room >= MIN_RESERVOIR
               else "lower UMPROV_MANAGED_BUDGET")
        raise RuntimeError(f"UMPROV_MANAGED_BUDGET={_state['budget']} with a reservoir of "
                           f"{size >> 20} MiB is more than the GPU's {total >> 20} MiB "
                           f"(PyTorch counts the reservoir in): {fix}")
    return fraction


def _patch_set_device(torch: Any) -> None:
    """The device a script selects gets its reservoir then (DDP's set_device(local_rank)).
    Once: a second call changes nothing."""
    select = torch.cuda.set_device
    if hasattr(select, "_umprov_select"):
        return

    @functools.wraps(select)
    def set_device(device: Any) -> None:
        index = torch.cuda._utils._get_device_index(device)
        if index < 0:  # torch selects nothing
            select(device)
            return
        _state["selecting"] = index  # where set_device is CUDA's start: _first_device
        try:
            select(device)
        finally:
            _state.pop("selecting", None)
        if "allocator" in _state:
            try:
                _fill(torch, index)
            except RuntimeError as exc:
                print(f"umprov managed memory: not on GPU {index}: {exc}", file=sys.stderr)

    set_device._umprov_select = select  # type: ignore[attr-defined]
    torch.cuda.set_device = set_device


def enabled() -> bool:
    return "allocator" in _state


def in_reservoir(where: Any) -> bool:
    """Whether the tensor's memory (or the address) is in a reservoir, on the host; else it
    is PyTorch's device memory (or not PyTorch's)."""
    lib = _state.get("library")
    address = where if isinstance(where, int) else where.data_ptr()
    return lib is not None and bool(lib.umprov_um_owns(address))


def copy_streams(device: int) -> tuple[Any, Any]:
    """Two streams of ``device`` for the host step's copies down and up: the ones made with
    its reservoir, else new ones."""
    import torch

    made = _state.get("streams", {}).get(device)
    return made if made is not None else (torch.cuda.Stream(device), torch.cuda.Stream(device))


def reservoir(device: int) -> Any:
    """``device``'s reservoir (a torch.cuda.MemPool), or None."""
    return _state.get("reservoirs", {}).get(device)


def spilled() -> int:
    """Bytes of live tensors in the reservoirs now (on the host); also kept as the peak."""
    live = sum(_live(pool) for pool in list(_state.get("reservoirs", {}).values()))
    _state["peak"] = max(_state.get("peak", 0), live)
    return live


def reservoir_room(device: int) -> int:
    """Bytes ``device``'s reservoir has free (its size less its live tensors): about a
    millisecond to read, as ``spilled``."""
    pool = reservoir(device)
    return 0 if pool is None else _state["sizes"][device] - _live(pool)


def _live(pool: Any) -> int:
    """Bytes of live tensors in a reservoir (its segment snapshot)."""
    return sum(seg["allocated_size"] for seg in pool.snapshot())


def device_room(device: int) -> int:
    """Bytes PyTorch can still place in ``device``'s own memory, the reservoir aside: what the
    driver has free less the headroom, under the budget and the job's own memory fraction,
    plus PyTorch's cached free blocks there (the reservoir's segments count in its reserved
    bytes: taken out)."""
    import torch

    free, total = torch.cuda.mem_get_info(device)
    free -= _state.get("headroom", 0) + _state.get("held_back", 0)
    stats = torch.cuda.memory_stats(device)
    reserved = stats.get("reserved_bytes.all.current", 0) - _state.get("sizes", {}).get(device, 0)
    allocated = stats.get("allocated_bytes.all.current", 0)  # the reservoir's live bytes too
    caps = [cap for cap in (_state.get("budget", -1),
                            int(_fractions[device] * total) if device in _fractions else -1)
            if cap >= 0]
    more = min([free] + [cap - reserved for cap in caps])
    return max(0, more) + max(0, reserved - allocated)


def empty_cache() -> None:
    """Give back PyTorch's cached device segments (torch.cuda.empty_cache); the reservoirs
    stay."""
    import torch

    torch.cuda.empty_cache()


def hold_back(extra: int) -> None:
    """``extra`` bytes of the device left free beyond the headroom (0: the headroom alone):
    gradients down's room for backward's first gradients, held while forward runs
    (umprov_managed_grads.py). Nothing where no headroom is kept."""
    lib, headroom = _state.get("library"), _state.get("headroom", 0)
    if lib is not None and headroom:
        lib.umprov_headroom_set(headroom + max(0, extra))
        _state["held_back"] = max(0, extra)


def stats() -> dict[str, int]:
    """Bytes of live tensors on the GPU (PyTorch's own memory) and in the reservoirs (spilled
    to the host), the spilled peak as seen at each optimizer step and here, the reservoirs'
    bytes, the budget (-1: none), the library's host budget, segments it refused and advice
    calls the driver refused, the headroom and the device segments it refused."""
    import torch

    lib = _state.get("library")
    out = (ctypes.c_longlong * len(STATS))()
    if lib is not None:
        lib.umprov_um_stats(out)
    counts = dict(zip(STATS, out, strict=True))
    now = spilled()
    devices = list(_state.get("reservoirs", {}))
    allocated = sum(torch.cuda.memory_allocated(d) for d in devices)
    return {"placed": allocated - now, "spilled": now, "peak_spilled": _state.get("peak", 0),
            "reservoir": sum(_state.get("sizes", {}).values()),
            "budget": _state.get("budget", -1), "host_budget": counts["host_budget"],
            "refused": counts["refused"], "failed_advice": counts["failed_advice"],
            "headroom": _state.get("headroom", 0), "held_back": _state.get("held_back", 0),
            "headroom_refused": lib.umprov_headroom_refused() if lib is not None else 0}


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Runs ``enable`` once torch's own module has run (before any CUDA tensor can exist).
    It stays on sys.meta_path until then: a lookup that is not the import
    (``importlib.util.find_spec("torch")``, as transformers does first) gets a spec whose
    module is never run."""

    searching: set[int] = set()  # threads in the lookup below, which comes back through here

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        thread = threading.get_ident()
        if name != "torch" or thread in self.searching:
            return None
        self.searching.add(thread)
        try:
            spec = importlib.util.find_spec("torch")
        finally:
            self.searching.discard(thread)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            if self in sys.meta_path:
                sys.meta_path.remove(self)
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
