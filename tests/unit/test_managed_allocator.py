"""The managed-memory allocator's own logic (docker/pytorch-cuda/managed/umprov_managed.c),
compiled here with gcc and driven through ctypes with a stand-in CUDA runtime that records each
call: placement within the budget (preferred on the device, prefetched), past it (preferred on
the host, accessed by the device), blocks kept and reused by size and stream, given back when
the device needs their room. On a GPU: bench/managed_alloc.py and tests/gpu."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

MANAGED = REPO / "docker" / "pytorch-cuda" / "managed"
MIB = 1 << 20
ADVISE_PREFERRED, ADVISE_ACCESSED_BY, CPU = 3, 5, -1

MALLOC = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                          ctypes.c_uint)
FREE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
MEMINFO = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_size_t),
                           ctypes.POINTER(ctypes.c_size_t))
ADVISE12 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                            ctypes.c_int)
PREFETCH12 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                              ctypes.c_void_p)


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("no gcc to build the allocator with")
    out = tmp_path_factory.mktemp("managed") / "libumprov_managed.so"
    subprocess.run(["gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-o",
                    str(out), str(MANAGED / "umprov_managed.c"), "-lpthread"], check=True)
    return out


class Runtime:
    """A CUDA runtime stand-in: host memory for managed memory, every call recorded."""

    def __init__(self, free_bytes: int) -> None:
        self.calls: list[tuple] = []
        self.free_bytes = free_bytes
        libc = ctypes.CDLL(None)
        libc.malloc.restype = ctypes.c_void_p
        libc.malloc.argtypes = [ctypes.c_size_t]
        libc.free.argtypes = [ctypes.c_void_p]

        def malloc_managed(out, size, flags):
            out[0] = libc.malloc(size)
            self.calls.append(("malloc", out[0], size, flags))
            return 0

        def free(ptr):
            self.calls.append(("free", ptr))
            libc.free(ptr)
            return 0

        def mem_get_info(free_out, total_out):
            free_out[0], total_out[0] = self.free_bytes, 2 * self.free_bytes
            return 0

        def advise(ptr, size, advice, device):
            self.calls.append(("advise", ptr, advice, device))
            return 0

        def prefetch(ptr, size, device, stream):
            self.calls.append(("prefetch", ptr, device))
            return 0

        self.fns = [MALLOC(malloc_managed), FREE(free), MEMINFO(mem_get_info),
                    ADVISE12(advise), PREFETCH12(prefetch)]

    def of(self, ptr: int) -> list[tuple]:
        return [c[0:1] + c[2:] for c in self.calls if c[0] in ("advise", "prefetch") and
                c[1] == ptr]


def allocator(library: Path, tmp_path: Path, *, free_bytes: int, reserve: int) -> tuple:
    """A fresh copy of the library (its state is per load), initialised on the stand-in."""
    copy = tmp_path / f"alloc-{len(list(tmp_path.iterdir()))}.so"
    shutil.copy(library, copy)
    lib = ctypes.CDLL(str(copy))
    runtime = Runtime(free_bytes)
    lib.umprov_um_init.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int, ctypes.c_longlong,
                                                           ctypes.c_longlong]
    pointers = [ctypes.cast(f, ctypes.c_void_p).value for f in runtime.fns]
    assert lib.umprov_um_init(*pointers, 12080, -1, reserve) == 0
    lib.umprov_um_malloc.restype = ctypes.c_void_p
    lib.umprov_um_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.umprov_um_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int,
                                   ctypes.c_void_p]
    return lib, runtime


def stats(lib: ctypes.CDLL) -> dict[str, int]:
    sys.path.insert(0, str(MANAGED))
    from umprov_managed import STATS

    out = (ctypes.c_longlong * len(STATS))()
    lib.umprov_um_stats(out)
    return dict(zip(STATS, out, strict=True))


def test_within_the_budget_on_the_device_past_it_on_the_host(library, tmp_path):
    lib, rt = allocator(library, tmp_path, free_bytes=10 * MIB, reserve=2 * MIB)  # budget 8
    fits = lib.umprov_um_malloc(6 * MIB, 0, None)
    spills = lib.umprov_um_malloc(4 * MIB, 0, None)
    assert rt.of(fits) == [("advise", ADVISE_PREFERRED, 0), ("prefetch", 0)]
    assert rt.of(spills) == [("advise", ADVISE_PREFERRED, CPU), ("advise", ADVISE_ACCESSED_BY, 0)]
    s = stats(lib)
    assert (s["budget"], s["placed"], s["spilled"]) == (8 * MIB, 6 * MIB, 4 * MIB)


def test_a_freed_block_serves_the_same_size_on_the_same_stream_only(library, tmp_path):
    lib, rt = allocator(library, tmp_path, free_bytes=100 * MIB, reserve=0)
    first = lib.umprov_um_malloc(MIB, 0, 7)
    lib.umprov_um_free(first, MIB, 0, 7)
    assert not [c for c in rt.calls if c[0] == "free"]  # kept, not given back
    assert lib.umprov_um_malloc(MIB, 0, 7) == first  # same size, same stream: reused
    other_stream = lib.umprov_um_malloc(MIB, 0, 8)
    assert other_stream != first
    lib.umprov_um_free(first, MIB, 0, 7)
    assert lib.umprov_um_malloc(2 * MIB, 0, 7) != first  # another size: a new block
    s = stats(lib)
    assert (s["allocations"], s["reused"], s["kept"]) == (3, 1, MIB)


def test_kept_device_blocks_make_room_before_anything_spills(library, tmp_path):
    lib, rt = allocator(library, tmp_path, free_bytes=8 * MIB, reserve=0)
    kept = lib.umprov_um_malloc(6 * MIB, 0, None)
    lib.umprov_um_free(kept, 6 * MIB, 0, None)
    new = lib.umprov_um_malloc(4 * MIB, 0, None)  # 6 kept + 4 > 8: the kept block goes first
    assert ("free", kept) in rt.calls
    assert rt.of(new)[0] == ("advise", ADVISE_PREFERRED, 0)
    assert stats(lib)["placed"] == 4 * MIB
    lib.umprov_um_free(new, 4 * MIB, 0, None)
    lib.umprov_um_empty_cache()
    assert ("free", new) in rt.calls and stats(lib)["placed"] == 0


def test_thousands_of_live_blocks_are_found_again_whatever_the_order_of_frees(library,
                                                                             tmp_path):
    """Live blocks sit in a hash table (the table grows and its probe chains shift back on
    every free): each of 3,000 blocks freed in a shuffled order is found, kept and given back
    exactly once; a pointer the allocator never gave is ignored."""
    import random

    lib, rt = allocator(library, tmp_path, free_bytes=1 << 40, reserve=0)
    sizes = {lib.umprov_um_malloc(64 + i, 0, None): 64 + i for i in range(3000)}
    assert len(sizes) == 3000 and None not in sizes
    order = list(sizes)
    random.Random(5).shuffle(order)  # noqa: S311 - a fixed order, not a secret
    for ptr in order[:1500]:
        lib.umprov_um_free(ptr, sizes[ptr], 0, None)
    lib.umprov_um_free(12345, 8, 0, None)  # not ours
    assert stats(lib)["kept"] == sum(sizes[p] for p in order[:1500])
    for ptr in order[1500:]:
        lib.umprov_um_free(ptr, sizes[ptr], 0, None)
    lib.umprov_um_empty_cache()
    freed = [c[1] for c in rt.calls if c[0] == "free"]
    assert sorted(freed) == sorted(sizes) and 12345 not in freed
    s = stats(lib)
    assert (s["placed"], s["spilled"], s["kept"]) == (0, 0, 0)


def test_the_python_side_reads_sizes_as_people_write_them():
    sys.path.insert(0, str(MANAGED))
    from umprov_managed import size_of

    assert size_of("1g") == 1 << 30 and size_of("512m") == 512 * MIB
    assert size_of("2GiB") == 2 << 30 and size_of("1048576") == MIB
    with pytest.raises(ValueError):
        size_of("lots")
