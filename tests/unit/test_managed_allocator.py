"""The managed-memory segment library (docker/pytorch-cuda/managed/umprov_managed.c), compiled
here with gcc and driven through ctypes with a stand-in CUDA runtime that records each call:
every segment preferred on the host and accessed by the device that asked, given back at
once when freed, refused past the host's budget; whether an address is in a live segment
(umprov_um_owns), and the table of live segments. PyTorch's caching allocator does the
caching (the reservoir, a torch.cuda.MemPool over these segments): there is no cache here to
test. Then the Python side's reservoir, with torch's calls stood in for. On a GPU: tests/gpu."""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import REPO

MANAGED = REPO / "docker" / "pytorch-cuda" / "managed"
if str(MANAGED) not in sys.path:
    sys.path.insert(0, str(MANAGED))

import umprov_managed  # noqa: E402
from umprov_managed import STATS, declare, size_of  # noqa: E402

MIB = 1 << 20
ADVISE_PREFERRED, ADVISE_ACCESSED_BY, CPU = 3, 5, -1
LOC_DEVICE, LOC_HOST = 1, 2  # cudaMemLocationType (CUDA 13's advice)
PAD = 4096  # the stand-in leaves this much between segments: an address past one is no other's


class Location(ctypes.Structure):  # cudaMemLocation, passed by value from CUDA 13 on
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


MALLOC = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                          ctypes.c_uint)
FREE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
ADVISE12 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                            ctypes.c_int)
ADVISE13 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                            Location)
VERSION = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int))


@pytest.fixture
def library(managed_library: Path) -> Path:
    return managed_library


class Runtime:
    """A CUDA runtime stand-in: host memory for managed memory, every call recorded.
    ``refuse_malloc``: cudaMallocManaged fails; ``advise_rc``: what advice calls return."""

    def __init__(self, *, v13: bool = False) -> None:
        self.calls: list[tuple] = []
        self.refuse_malloc = False
        self.advise_rc = 0
        libc = ctypes.CDLL(None)
        libc.malloc.restype = ctypes.c_void_p
        libc.malloc.argtypes = [ctypes.c_size_t]
        libc.free.argtypes = [ctypes.c_void_p]

        def malloc_managed(out, size, flags):
            self.calls.append(("malloc", size, flags))
            if self.refuse_malloc:
                return 2  # cudaErrorMemoryAllocation
            out[0] = libc.malloc(size + PAD)
            self.calls[-1] = ("malloc", size, flags, out[0])
            return 0

        def free(ptr):
            self.calls.append(("free", ptr))
            libc.free(ptr)
            return 0

        def advise12(ptr, size, advice, device):
            self.calls.append(("advise", ptr, size, advice, device))
            return self.advise_rc

        def advise13(ptr, size, advice, loc):  # recorded as CUDA 12's int device: -1 the host
            self.calls.append(("advise", ptr, size, advice,
                               CPU if loc.type == LOC_HOST else loc.id, (loc.type, loc.id)))
            return self.advise_rc

        def version(out):
            out[0] = 13000 if v13 else 12080
            return 0

        self.cudaMallocManaged, self.cudaFree = MALLOC(malloc_managed), FREE(free)
        self.cudaMemAdvise = ADVISE13(advise13) if v13 else ADVISE12(advise12)
        self.cudaRuntimeGetVersion = VERSION(version)
        self.fns = [self.cudaMallocManaged, self.cudaFree, self.cudaMemAdvise]

    def of(self, ptr: int) -> list[tuple]:
        """The advice calls for the segment at ptr (its size left out)."""
        return [(c[0],) + c[3:] for c in self.calls if c[0] == "advise" and c[1] == ptr]

    def named(self, name: str) -> list[tuple]:
        return [c for c in self.calls if c[0] == name]


def fresh_copy(library: Path, tmp_path: Path) -> Path:
    """A copy of the library to load: its state is per load."""
    copy = tmp_path / f"alloc-{len(list(tmp_path.iterdir()))}.so"
    shutil.copy(library, copy)
    return copy


def allocator(library: Path, tmp_path: Path, *, host_budget: int = -1, host_reserve: int = 0,
              version: int = 12080, init: bool = True) -> tuple[ctypes.CDLL, Runtime]:
    """A fresh copy of the library, declared as the Python side declares it, initialised on
    the stand-in."""
    lib = declare(ctypes.CDLL(str(fresh_copy(library, tmp_path))))
    runtime = Runtime(v13=version >= 13000)
    if init:
        pointers = [ctypes.cast(f, ctypes.c_void_p).value for f in runtime.fns]
        assert lib.umprov_um_init(*pointers, version, host_budget, host_reserve) == 0
    return lib, runtime


def stats(lib: ctypes.CDLL) -> dict[str, int]:
    out = (ctypes.c_longlong * len(STATS))(*([-7] * len(STATS)))  # each one written
    lib.umprov_um_stats(out)
    return dict(zip(STATS, out, strict=True))


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemAvailable in /proc/meminfo")


def test_stats_are_the_six_the_python_side_names(library, tmp_path):
    lib, _ = allocator(library, tmp_path, host_budget=7 * MIB)
    assert STATS == ("bytes", "peak_bytes", "allocations", "failed_advice", "refused",
                     "host_budget")
    assert stats(lib) == dict.fromkeys(STATS, 0) | {"host_budget": 7 * MIB}


@pytest.mark.parametrize("version", [12080, 13000])
def test_the_python_side_initialises_the_library_from_the_runtime_torch_loaded(
        library, tmp_path, monkeypatch, version):
    """_library(): the runtime's own functions, the version that picks the advice call's
    form, and the host reserve, handed over in the order C declares them."""
    runtime = Runtime(v13=version >= 13000)
    monkeypatch.setattr(umprov_managed, "_cudart", lambda: runtime)
    monkeypatch.setattr(umprov_managed, "LIBRARY", fresh_copy(library, tmp_path))
    monkeypatch.setenv("UMPROV_MANAGED_HOST_RESERVE", "0")
    lib = umprov_managed._library()
    p = lib.umprov_um_malloc(MIB, 2, None)
    assert p is not None and runtime.named("malloc") == [("malloc", MIB, 1, p)]
    assert [c[:3] for c in runtime.of(p)] == [("advise", ADVISE_PREFERRED, CPU),
                                             ("advise", ADVISE_ACCESSED_BY, 2)]
    assert stats(lib)["host_budget"] > 0  # the host's: taken at the first segment


def test_every_segment_is_kept_on_the_host_and_mapped_for_the_device_that_asked(
        library, tmp_path):
    lib, rt = allocator(library, tmp_path)
    on_3 = lib.umprov_um_malloc(MIB, 3, 77)
    for_0 = lib.umprov_um_malloc(4 * MIB, 0, 77)
    assert [c[1:3] for c in rt.named("malloc")] == [(MIB, 1), (4 * MIB, 1)]  # attach global
    assert rt.of(on_3) == [("advise", ADVISE_PREFERRED, CPU), ("advise", ADVISE_ACCESSED_BY, 3)]
    assert rt.of(for_0) == [("advise", ADVISE_PREFERRED, CPU), ("advise", ADVISE_ACCESSED_BY, 0)]
    s = stats(lib)
    assert (s["bytes"], s["peak_bytes"], s["allocations"]) == (5 * MIB, 5 * MIB, 2)
    assert (s["refused"], s["failed_advice"]) == (0, 0)


def test_cuda_13_takes_a_location_by_value(library, tmp_path):
    lib, rt = allocator(library, tmp_path, version=13000)
    p = lib.umprov_um_malloc(MIB, 1, 5)
    assert rt.of(p) == [("advise", ADVISE_PREFERRED, CPU, (LOC_HOST, 0)),
                        ("advise", ADVISE_ACCESSED_BY, 1, (LOC_DEVICE, 1))]


def test_a_freed_segment_is_given_back_at_once_and_leaves_the_counts(library, tmp_path):
    lib, rt = allocator(library, tmp_path, host_budget=64 * MIB)
    first = lib.umprov_um_malloc(6 * MIB, 0, None)
    second = lib.umprov_um_malloc(4 * MIB, 0, None)
    lib.umprov_um_free(first, 1, 0, None)  # the size passed is not trusted: the table's is
    assert rt.named("free") == [("free", first)]  # at once: no cache here
    assert (stats(lib)["bytes"], stats(lib)["peak_bytes"]) == (4 * MIB, 10 * MIB)
    lib.umprov_um_free(second, 0, 0, None)
    assert rt.named("free") == [("free", first), ("free", second)]
    assert (stats(lib)["bytes"], stats(lib)["allocations"]) == (0, 2)


def test_a_segment_is_freed_once_and_foreign_or_null_pointers_are_ignored(library, tmp_path):
    lib, rt = allocator(library, tmp_path)
    p = lib.umprov_um_malloc(MIB, 0, None)
    lib.umprov_um_free(p, MIB, 0, None)
    lib.umprov_um_free(p, MIB, 0, None)  # twice: CUDA is asked once
    foreign = ctypes.create_string_buffer(64)
    lib.umprov_um_free(ctypes.addressof(foreign), 64, 0, None)
    lib.umprov_um_free(None, 0, 0, None)
    assert rt.named("free") == [("free", p)]
    assert stats(lib)["bytes"] == 0


def test_past_the_host_budget_a_segment_is_refused_and_nothing_is_allocated(library, tmp_path):
    lib, rt = allocator(library, tmp_path, host_budget=6 * MIB)
    first = lib.umprov_um_malloc(5 * MIB, 0, None)
    assert lib.umprov_um_malloc(2 * MIB, 0, None) is None  # 5 + 2 > 6
    assert len(rt.named("malloc")) == 1  # CUDA was not asked
    assert lib.umprov_um_malloc(MIB, 0, None) is not None  # 5 + 1 = 6 still fits
    lib.umprov_um_free(first, 5 * MIB, 0, None)
    assert lib.umprov_um_malloc(2 * MIB, 0, None) is not None  # room again once one is freed
    s = stats(lib)
    assert (s["refused"], s["allocations"], s["host_budget"]) == (1, 3, 6 * MIB)


def test_the_host_budget_is_the_hosts_available_memory_less_its_reserve(library, tmp_path):
    reserve = mem_available() // 2  # far more than the slack below
    lib, _ = allocator(library, tmp_path, host_reserve=reserve)
    assert stats(lib)["host_budget"] == -1  # nothing allocated yet: not taken
    before = mem_available()
    assert lib.umprov_um_malloc(MIB, 0, None) is not None
    after = mem_available()
    slack = 256 * MIB  # other processes of the machine come and go
    host_budget = stats(lib)["host_budget"]
    assert min(before, after) - reserve - slack <= host_budget <= max(before, after) - reserve + slack


def test_a_host_reserve_past_the_hosts_memory_refuses_every_segment(library, tmp_path):
    lib, rt = allocator(library, tmp_path, host_reserve=1 << 60)
    assert lib.umprov_um_malloc(4096, 0, None) is None
    s = stats(lib)
    assert (s["host_budget"], s["refused"], s["bytes"], s["allocations"]) == (0, 1, 0, 0)
    assert not rt.named("malloc")


def test_cuda_refusing_a_segment_is_counted_and_nothing_is_kept(library, tmp_path):
    lib, rt = allocator(library, tmp_path)
    rt.refuse_malloc = True
    assert lib.umprov_um_malloc(MIB, 0, None) is None
    s = stats(lib)
    assert (s["refused"], s["allocations"], s["bytes"]) == (1, 0, 0)
    rt.refuse_malloc = False
    p = lib.umprov_um_malloc(MIB, 0, None)
    assert p is not None and lib.umprov_um_owns(p) == 1
    assert stats(lib)["bytes"] == MIB


def test_failed_advice_is_counted_and_the_segment_stays_good(library, tmp_path):
    lib, rt = allocator(library, tmp_path)
    rt.advise_rc = 1
    assert None not in (lib.umprov_um_malloc(MIB, 0, None), lib.umprov_um_malloc(MIB, 0, None))
    s = stats(lib)
    assert (s["failed_advice"], s["allocations"], s["bytes"]) == (2, 2, 2 * MIB)


def test_nothing_before_init_and_no_empty_segments(library, tmp_path):
    lib, rt = allocator(library, tmp_path, init=False)
    assert lib.umprov_um_malloc(MIB, 0, None) is None
    lib, rt = allocator(library, tmp_path)
    assert lib.umprov_um_malloc(0, 0, None) is None
    assert lib.umprov_um_malloc(-1, 0, None) is None
    assert not rt.named("malloc") and stats(lib)["allocations"] == 0
    assert lib.umprov_um_init(None, None, None, 12080, -1, 0) == -1


def test_owns_the_addresses_inside_live_segments_only(library, tmp_path):
    lib, _ = allocator(library, tmp_path)
    big = lib.umprov_um_malloc(MIB, 0, None)
    small = lib.umprov_um_malloc(3000, 0, None)
    for at in (big, big + 1, big + MIB // 2, big + MIB - 1, small, small + 2999):
        assert lib.umprov_um_owns(at) == 1, at
    for at in (big + MIB, small + 3000, big - 1, None):  # one past the end: PAD, nobody's
        assert lib.umprov_um_owns(at) == 0, at
    foreign = ctypes.create_string_buffer(64)
    assert lib.umprov_um_owns(ctypes.addressof(foreign)) == 0
    lib.umprov_um_free(big, MIB, 0, None)
    assert lib.umprov_um_owns(big + 10) == 0  # freed: no longer ours
    assert lib.umprov_um_owns(small + 10) == 1


def test_thousands_of_live_segments_are_found_again_whatever_the_order_of_frees(library,
                                                                               tmp_path):
    """Live segments sit in a hash table (it grows, and its probe chains shift back on every
    free): each of 3,000 segments freed in a shuffled order is found and given back exactly
    once, its bytes leaving the count; a pointer the allocator never gave is ignored."""
    lib, rt = allocator(library, tmp_path, host_budget=1 << 40)
    sizes = {}
    for i in range(3000):
        ptr = lib.umprov_um_malloc(64 + i, 0, None)
        assert ptr is not None
        sizes[ptr] = 64 + i
    assert len(sizes) == 3000 and stats(lib)["bytes"] == sum(sizes.values())
    order = list(sizes)
    random.Random(5).shuffle(order)  # noqa: S311 - a fixed order, not a secret
    for n, ptr in enumerate(order[:1500], 1):
        lib.umprov_um_free(ptr, sizes[ptr], 0, None)
        assert rt.calls[-1] == ("free", ptr)
        assert len(rt.named("free")) == n
    foreign = ctypes.create_string_buffer(64)
    lib.umprov_um_free(ctypes.addressof(foreign), 64, 0, None)  # not ours
    assert len(rt.named("free")) == 1500
    left = order[1500:]
    assert stats(lib)["bytes"] == sum(sizes[p] for p in left)
    assert not any(lib.umprov_um_owns(ptr) for ptr in order[:1500])
    assert all(lib.umprov_um_owns(ptr + sizes[ptr] - 1) for ptr in left)
    for ptr in left:
        lib.umprov_um_free(ptr, sizes[ptr], 0, None)
    freed = Counter(c[1] for c in rt.named("free"))
    assert freed == Counter(list(sizes)) and set(freed.values()) == {1}
    s = stats(lib)
    assert (s["bytes"], s["allocations"], s["refused"]) == (0, 3000, 0)


def test_the_python_side_reads_sizes_as_people_write_them():
    assert size_of("1g") == 1 << 30 and size_of("512m") == 512 * MIB
    assert size_of("2GiB") == 2 << 30 and size_of("1048576") == MIB
    assert size_of(" 64k ") == 64 << 10 and size_of("1.5g") == 3 << 29
    for bad in ("lots", "", "-1g", "inf", "nan", "1e400", "1e300t"):
        with pytest.raises(ValueError):
            size_of(bad)


# the reservoir behind torch's caching allocator, with torch's calls stood in for


class Pool:
    """torch.cuda.MemPool: its segments as snapshot() lists them."""

    def __init__(self, allocator: object, use_on_oom: bool = False) -> None:
        self.use_on_oom, self.segments = use_on_oom, []

    def snapshot(self) -> list[dict]:
        return self.segments


@pytest.fixture
def reservoir(monkeypatch):
    """umprov_managed's state as _start leaves it, and a stand-in torch whose calls are
    logged: the device selected, tensors made (in which pool), the memory fraction set."""
    log: list[tuple] = []
    in_pool: list = []

    @contextlib.contextmanager
    def device(index: int):
        log.append(("device", index))
        yield

    @contextlib.contextmanager
    def use_mem_pool(pool: Pool, device: object = None):
        in_pool.append(pool)
        yield
        in_pool.pop()

    def empty(size: int, **kwargs: object) -> int:
        if size > fake.refuse_past:
            raise fake.OutOfMemoryError("CUDA out of memory")
        log.append(("empty", size, in_pool[-1].use_on_oom if in_pool else None))
        return size

    def device_index(device: object, optional: bool = False) -> int:
        return 0 if device is None and optional else int(device)  # type: ignore[arg-type]

    cuda = SimpleNamespace(
        device=device, MemPool=Pool, Stream=lambda: "stream", use_mem_pool=use_mem_pool,
        device_count=lambda: 2, current_device=lambda: 0, init=lambda: log.append(("init",)),
        set_device=lambda d: log.append(("set_device", d)),
        get_device_properties=lambda d: SimpleNamespace(total_memory=80 << 30),
        set_per_process_memory_fraction=lambda f, d=None: log.append(("fraction", f, d)),
        memory=SimpleNamespace(_set_allocator_settings=lambda s: log.append(("settings", s))),
        _utils=SimpleNamespace(_get_device_index=device_index))
    fake = SimpleNamespace(cuda=cuda, empty=empty, uint8="uint8", refuse_past=1 << 50,
                           OutOfMemoryError=type("OutOfMemoryError", (RuntimeError,), {}))
    state = {"allocator": SimpleNamespace(allocator=lambda: None), "budget": -1,
             "reservoir": 4 << 30, "reservoirs": {}, "sizes": {}, "peak": 0}
    monkeypatch.setattr(umprov_managed, "_state", state)
    monkeypatch.setattr(umprov_managed, "_fractions", {})
    attributes: dict = {"rc": 0, "concurrent": 1, "asked": []}

    def get_attribute(out, attribute, device) -> int:  # noqa: ANN001 - ctypes values
        attributes["asked"].append((attribute, device))
        ctypes.cast(out, ctypes.POINTER(ctypes.c_int))[0] = attributes["concurrent"]
        return attributes["rc"]

    monkeypatch.setattr(umprov_managed, "_cudart", lambda: SimpleNamespace(
        cudaDeviceGetAttribute=get_attribute))
    return SimpleNamespace(log=log, torch=fake, state=state, managed=umprov_managed,
                           attributes=attributes)


def test_a_reservoir_is_one_large_free_block_and_small_ones_of_a_use_on_oom_pool(reservoir):
    reservoir.managed._fill(reservoir.torch, 1)
    log, small = reservoir.log, reservoir.managed.SMALL
    assert log[0] == ("device", 1) and log[1] == ("empty", 4 << 30, True)
    assert log[2:] == [("empty", MIB, True)] * small  # all freed again: free blocks
    assert reservoir.state["sizes"] == {1: (4 << 30) + small * MIB}
    reservoir.managed._fill(reservoir.torch, 1)  # once a device
    assert len(log) == 2 + small and not any(e[0] == "fraction" for e in log)


def test_a_budget_caps_torchs_own_memory_with_the_reservoir_counted_in(reservoir):
    reservoir.state["budget"] = 8 << 30
    reservoir.managed._fill(reservoir.torch, 0)
    want = (8 << 30) + reservoir.state["sizes"][0]
    assert reservoir.log[-1] == ("fraction", want / (80 << 30), 0)


def test_a_budget_past_the_gpu_with_the_reservoir_names_the_reservoir_that_fits(reservoir):
    reservoir.state["budget"] = 78 << 30  # 80 GiB GPU, 4 GiB reservoir + 256 MiB of blocks
    with pytest.raises(RuntimeError, match=r"UMPROV_MANAGED_BUDGET=.* MiB \(PyTorch counts the "
                       r"reservoir in\): set UMPROV_MANAGED_RESERVOIR=1792m or less$"):
        reservoir.managed._fill(reservoir.torch, 0)
    reservoir.state["budget"] = (80 << 30) - 400 * MIB  # no reservoir worth having beside it
    with pytest.raises(RuntimeError, match="lower UMPROV_MANAGED_BUDGET$"):
        reservoir.managed._fill(reservoir.torch, 0)


def test_a_reservoir_the_host_refuses_or_too_small_to_use_is_one_line(reservoir):
    reservoir.torch.refuse_past = 1 << 30
    with pytest.raises(RuntimeError, match="host refused a reservoir of 4096 MiB"):
        reservoir.managed._fill(reservoir.torch, 0)
    reservoir.state["reservoir"] = 128 * MIB
    with pytest.raises(RuntimeError, match="128 MiB is too small"):
        reservoir.managed._fill(reservoir.torch, 0)
    assert reservoir.state["reservoirs"] == {}


def test_the_default_reservoir_is_half_the_hosts_spare_memory_per_local_process(
        reservoir, tmp_path, monkeypatch):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 999 kB\nMemAvailable: 68157440 kB\n")  # 65 GiB
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("UMPROV_MANAGED_HOST_RESERVE", raising=False)
    assert reservoir.managed._default_size(str(meminfo)) == 63 << 29  # (65 - 2) / 2 GiB
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv("UMPROV_MANAGED_HOST_RESERVE", "1g")
    assert reservoir.managed._default_size(str(meminfo)) == 8 << 30
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    reservoir.state["sizes"] = {0: 31 << 30}  # a later device's: half of what the first left
    assert reservoir.managed._default_size(str(meminfo)) == 33 << 29  # (65 - 1 - 31) / 2 GiB


@pytest.mark.parametrize(("rank", "device"), [(None, 0), ("1", 1), ("5", 0), ("x", 0)])
def test_the_first_reservoir_is_local_ranks_device_else_the_current_one(
        reservoir, monkeypatch, rank, device):
    if rank is None:
        monkeypatch.delenv("LOCAL_RANK", raising=False)
    else:
        monkeypatch.setenv("LOCAL_RANK", rank)
    assert reservoir.managed._first_device(reservoir.torch) == device


def test_set_device_that_starts_cuda_makes_the_selected_devices_reservoir_first(reservoir):
    """torch's set_device starts CUDA before it selects: the reservoir (and the context)
    must be the selected device's, not the current one's."""
    seen = []
    reservoir.torch.cuda.set_device = lambda d: seen.append(
        reservoir.managed._first_device(reservoir.torch))
    reservoir.managed._patch_set_device(reservoir.torch)
    reservoir.torch.cuda.set_device(1)
    assert seen == [1] and "selecting" not in reservoir.state
    assert reservoir.managed._first_device(reservoir.torch) == 0


def test_set_device_makes_that_devices_reservoir_or_says_why_not(reservoir, capsys):
    reservoir.managed._patch_set_device(reservoir.torch)
    reservoir.torch.cuda.set_device(1)
    assert reservoir.log[0] == ("set_device", 1) and 1 in reservoir.state["reservoirs"]
    reservoir.torch.refuse_past = 1 << 30
    reservoir.torch.cuda.set_device(0)  # the job goes on, without one there
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["umprov managed memory: not on GPU 0: the host refused a reservoir of "
                   "4096 MiB (UMPROV_MANAGED_RESERVOIR, UMPROV_MANAGED_HOST_RESERVE)"]


def test_spilled_is_the_live_bytes_in_the_reservoirs_and_keeps_its_peak(reservoir):
    pool = Pool(None, use_on_oom=True)
    reservoir.state["reservoirs"] = {0: pool}
    pool.segments = [{"allocated_size": 3 * MIB}, {"allocated_size": 0}]
    assert reservoir.managed.spilled() == 3 * MIB
    pool.segments = [{"allocated_size": MIB}]
    assert reservoir.managed.spilled() == MIB and reservoir.state["peak"] == 3 * MIB


def test_expandable_segments_are_off_while_the_reservoir_is_made_and_on_again(
        reservoir, monkeypatch):
    """PyTorch refuses expandable segments in a pool of its own allocator (the MemPool's
    TORCH_CHECK): the reservoir is made with them off; the device's own memory keeps them."""
    conf = "garbage_collection_threshold:0.8, expandable_segments:True"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", conf)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    reservoir.managed._fill(reservoir.torch, 0)
    log = reservoir.log  # torch's setter resets what it is not given: it is given all of it
    assert log[1] == ("settings", "garbage_collection_threshold:0.8, expandable_segments:False")
    assert log[-1] == ("settings", conf)
    assert [e for e in log[2:-1] if e[0] == "empty"] == log[2:-1]
    reservoir.torch.refuse_past = 1 << 30  # refused: the setting comes back all the same
    reservoir.state["reservoirs"].clear()
    with pytest.raises(RuntimeError, match="host refused"):
        reservoir.managed._fill(reservoir.torch, 0)
    assert log[-1] == ("settings", conf)


def test_a_fraction_the_job_set_before_a_device_had_a_reservoir_is_kept_of_device_memory(
        reservoir):
    reservoir.managed._fractions[1] = 0.25  # set for GPU 1 before set_device(1)
    reservoir.managed._fill(reservoir.torch, 1)
    fractions = [e for e in reservoir.log if e[0] == "fraction"]
    size = reservoir.state["sizes"][1]
    assert fractions == [("fraction", 1.0, 1), ("fraction", 0.25 + size / (80 << 30), 1)]
    first = reservoir.log.index(("fraction", 1.0, 1))
    assert first < reservoir.log.index(("empty", 4 << 30, True))  # lifted while it is made


@pytest.mark.parametrize(("rc", "concurrent", "seen"), [(0, 0, ": 0;"), (101, 1, "error 101")])
def test_a_gpu_without_concurrent_managed_access_gets_no_reservoir(reservoir, rc, concurrent,
                                                                   seen):
    """There CUDA would move the reservoir to the GPU whole, at every launch."""
    reservoir.attributes.update(rc=rc, concurrent=concurrent)
    with pytest.raises(RuntimeError, match=f"GPU 1 has no concurrent managed access.*{seen}"):
        reservoir.managed._fill(reservoir.torch, 1)
    assert reservoir.attributes["asked"] == [(89, 1)]
    assert reservoir.log == [] and reservoir.state["reservoirs"] == {}


def test_a_budget_past_the_gpu_is_refused_before_a_reservoir_is_made(reservoir):
    reservoir.state["budget"] = 78 << 30
    with pytest.raises(RuntimeError):
        reservoir.managed._fill(reservoir.torch, 0)
    assert not [e for e in reservoir.log if e[0] == "empty"]
    assert reservoir.state["reservoirs"] == {} and reservoir.state["sizes"] == {}


def test_set_device_to_none_selected_makes_no_reservoir(reservoir):
    reservoir.managed._patch_set_device(reservoir.torch)
    reservoir.torch.cuda.set_device(-1)
    assert reservoir.log == [("set_device", -1)] and reservoir.state["reservoirs"] == {}


def torch_stub(initialized: bool, built: bool = True) -> SimpleNamespace:
    calls: list = []
    fraction = {"set_per_process_memory_fraction": lambda f, d=None: None,
                "get_per_process_memory_fraction": lambda d=None: 1.0}
    cuda = SimpleNamespace(is_initialized=lambda: initialized, set_device=lambda d: None,
                           _lazy_call=calls.append, memory=SimpleNamespace(**fraction),
                           **fraction)
    return SimpleNamespace(cuda=cuda, backends=SimpleNamespace(
        cuda=SimpleNamespace(is_built=lambda: built)), calls=calls)


def test_enable_never_starts_cuda_itself_and_leaves_nothing_half_made(monkeypatch):
    """At import (the .pth hook) enable() only asks whether torch has CUDA at all: starting
    CUDA then would break a fork before the job's own start. A start that fails leaves
    nothing behind, so enable() can be called again."""
    monkeypatch.setattr(umprov_managed, "_state", {})
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    fake = torch_stub(initialized=False)
    monkeypatch.setitem(sys.modules, "torch", fake)
    umprov_managed.enable()
    assert len(fake.calls) == 1 and umprov_managed._state["reservoirs"] == {}
    monkeypatch.setattr(umprov_managed, "_state", {})
    monkeypatch.setitem(sys.modules, "torch", torch_stub(initialized=True))

    def failing(torch: object) -> None:
        umprov_managed._state["library"] = "half made"
        raise RuntimeError("no libcudart")

    monkeypatch.setattr(umprov_managed, "_start", failing)
    with pytest.raises(RuntimeError, match="no libcudart"):
        umprov_managed.enable()
    assert umprov_managed._state == {} and not umprov_managed.enabled()
    monkeypatch.setitem(sys.modules, "torch", torch_stub(initialized=False, built=False))
    with pytest.raises(RuntimeError, match="built without CUDA"):
        umprov_managed.enable()


@pytest.mark.parametrize("name", ["UMPROV_MANAGED_BUDGET", "UMPROV_MANAGED_HEADROOM"])
def test_a_size_that_is_not_a_size_names_its_variable(monkeypatch, name):
    monkeypatch.setattr(umprov_managed, "_state", {})
    monkeypatch.setitem(sys.modules, "torch", torch_stub(initialized=False))
    monkeypatch.setenv(name, "lots")
    with pytest.raises(RuntimeError, match=f"{name}='lots' is not a size"):
        umprov_managed.enable()
    assert umprov_managed._state == {}


@pytest.mark.parametrize(("value", "headroom"), [(None, 512 * MIB), ("0", 0), ("1g", 1 << 30)])
def test_the_headroom_left_to_cuda_is_512_mib_unless_set(monkeypatch, value, headroom):
    monkeypatch.setattr(umprov_managed, "_state", {})
    monkeypatch.setitem(sys.modules, "torch", torch_stub(initialized=False))
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    if value is None:
        monkeypatch.delenv("UMPROV_MANAGED_HEADROOM", raising=False)
    else:
        monkeypatch.setenv("UMPROV_MANAGED_HEADROOM", value)
    umprov_managed.enable()
    assert umprov_managed._state["headroom"] == headroom


PROBE = """
import importlib.util, sys
sys.path[:0] = [{fake!r}, {managed!r}]
import umprov_managed
umprov_managed.enable = lambda: print("enabled")
umprov_managed.after_torch_import()
print("probe", importlib.util.find_spec("torch") is not None)  # as transformers does first
import torch
print("imported", torch.MARK, any(isinstance(f, umprov_managed._AfterTorch)
                                  for f in sys.meta_path))
"""


def test_the_import_hook_enables_at_the_import_not_at_a_lookup_before_it(tmp_path):
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("MARK = 1\n")
    script = PROBE.format(fake=str(tmp_path), managed=str(MANAGED))
    env = {**os.environ, "UMPROV_MANAGED_MEMORY": "1"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == ["probe True", "enabled", "imported 1 False"]


@pytest.mark.parametrize(("budget", "fraction", "headroom", "room"), [
    (-1, None, 0, 2 << 30),  # driver's free 1 GiB + 1 GiB cached free on the device
    (12 << 30, None, 0, 1 << 30),  # the budget is spent: the cached free block only
    (-1, 0.2, 0, 2 << 30),  # the job's 16 GiB cap leaves 2: the driver's 1 GiB is less
    (-1, 0.18, 0, (1 << 30) + int(0.18 * (80 << 30)) - (14 << 30)),
    (-1, None, 512 * MIB, (1 << 30) + 512 * MIB),  # CUDA's headroom is not PyTorch's room
    (-1, None, 2 << 30, 1 << 30)])  # less free than the headroom: the cached block only
def test_device_room_is_what_torch_can_still_take_on_the_device_reservoir_aside(
        reservoir, monkeypatch, budget, fraction, headroom, room):
    import torch

    reservoir.state.update(budget=budget, sizes={0: 4 << 30}, headroom=headroom)
    if fraction is not None:
        umprov_managed._fractions[0] = fraction
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (1 << 30, 80 << 30))
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device: {
        "reserved_bytes.all.current": (14 << 30) + (4 << 30),  # device + the reservoir
        "allocated_bytes.all.current": 13 << 30})
    assert umprov_managed.device_room(0) == room


def test_spilled_and_reservoir_room_read_the_reservoirs_live_segments(reservoir):
    segments = {0: [{"allocated_size": 3 << 30}, {"allocated_size": 0}],
                1: [{"allocated_size": 1 << 30}]}
    reservoir.state.update(sizes={0: 4 << 30, 1: 8 << 30}, reservoirs={
        d: SimpleNamespace(snapshot=lambda d=d: segments[d]) for d in segments})
    assert umprov_managed.spilled() == 4 << 30 and reservoir.state["peak"] == 4 << 30
    assert umprov_managed.reservoir_room(0) == 1 << 30
    assert umprov_managed.reservoir_room(1) == 7 << 30
    assert umprov_managed.reservoir_room(2) == 0  # no reservoir: no room there
