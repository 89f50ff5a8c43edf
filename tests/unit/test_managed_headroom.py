"""The headroom of umprov's managed-memory library (umprov_headroom_install in
docker/pytorch-cuda/managed/umprov_managed.c): the caching allocator's library gets a cudaMalloc
that refuses a segment leaving less than the headroom free, so CUDA keeps room for what it
allocates itself (modules loaded at a kernel's first launch, cuBLAS handles) once PyTorch has
turned to the reservoir. Here a stand-in CUDA runtime and two stand-in callers, built with gcc
and linked as libc10_cuda.so is (lazy binding, and full RELRO where the slot is read-only):
the one named is guarded, the other untouched. On a GPU: tests/gpu and bench/managed_levers.sh
(tight)."""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import shared_library

MIB = 1 << 20
REFUSED = 2  # cudaErrorMemoryAllocation

RUNTIME = r"""
#include <stddef.h>
#include <stdlib.h>
size_t fake_free;
int fake_mallocs, fake_other_mallocs, fake_info_rc, fake_last_error;
int cudaMalloc(void **p, size_t n) { (void)n; fake_mallocs++; *p = malloc(1); return 0; }
int other_malloc(void **p, size_t n) { (void)n; fake_other_mallocs++; *p = malloc(1); return 0; }
int cudaMemGetInfo(size_t *free_bytes, size_t *total) {
  *free_bytes = fake_free;
  *total = 2 * fake_free;
  fake_last_error = fake_info_rc;
  return fake_info_rc;
}
int cudaGetLastError(void) { int e = fake_last_error; fake_last_error = 0; return e; }
"""
CALLER = r"""
#include <stddef.h>
int cudaMalloc(void **p, size_t n);
int caller_alloc(size_t n) { void *p = NULL; return cudaMalloc(&p, n); }
"""
LINKS = {"lazy": ["-Wl,-z,lazy"], "now": ["-Wl,-z,relro,-z,now"],
         "noplt": ["-fno-plt", "-Wl,-z,relro,-z,now"], "other": []}  # noplt: a GLOB_DAT slot


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in runtime (libfakecudart.so) and three callers linked against it."""
    out = tmp_path_factory.mktemp("headroom")
    shared_library(out, "libfakecudart.so", RUNTIME, ("-Wl,-soname,libfakecudart.so",))
    for name, flags in LINKS.items():
        shared_library(out, f"libcaller_{name}.so", CALLER, tuple(flags),
                       (f"-L{out}", "-lfakecudart", f"-Wl,-rpath,{out}"))
    return out


@pytest.fixture
def process(built: Path, managed_library: Path, tmp_path: Path) -> SimpleNamespace:
    """The runtime, fresh copies of the callers and of the library (a slot pointed stays
    pointed, and the library's state is per load)."""
    runtime = ctypes.CDLL(str(built / "libfakecudart.so"))
    callers = {}
    for name in LINKS:
        shutil.copy(built / f"libcaller_{name}.so", tmp_path)
        callers[name] = ctypes.CDLL(str(tmp_path / f"libcaller_{name}.so"))
    for caller in callers.values():
        caller.caller_alloc.argtypes = [ctypes.c_size_t]
    copy = tmp_path / "libumprov_managed.so"
    shutil.copy(managed_library, copy)
    lib = ctypes.CDLL(str(copy))
    lib.umprov_headroom_install.argtypes = [ctypes.c_char_p] + [ctypes.c_void_p] * 3 + [
        ctypes.c_longlong]
    lib.umprov_headroom_refused.restype = ctypes.c_longlong
    free = ctypes.c_size_t.in_dll(runtime, "fake_free")
    counts = {name: ctypes.c_int.in_dll(runtime, f"fake_{name}")
              for name in ("mallocs", "other_mallocs", "info_rc", "last_error")}
    for count in counts.values():
        count.value = 0

    def address(name: str) -> int | None:
        return ctypes.cast(getattr(runtime, name), ctypes.c_void_p).value

    def install(name: str, headroom: int, real: str = "cudaMalloc") -> int:
        return lib.umprov_headroom_install(f"{tmp_path}/libcaller_{name}.so".encode(),
                                           address(real), address("cudaMemGetInfo"),
                                           address("cudaGetLastError"), headroom)

    return SimpleNamespace(lib=lib, callers=callers, free=free, mallocs=counts["mallocs"],
                           counts=counts, install=install)


@pytest.mark.parametrize("link", ["lazy", "now", "noplt"])
def test_the_named_library_keeps_the_headroom_and_no_other(process: SimpleNamespace,
                                                           link: str) -> None:
    process.free.value = 1024 * MIB
    assert process.install(link, 512 * MIB) == 1
    guarded, other = process.callers[link], process.callers["other"]
    assert guarded.caller_alloc(256 * MIB) == 0  # leaves 768 MiB
    assert guarded.caller_alloc(512 * MIB) == 0  # leaves exactly the headroom
    assert process.mallocs.value == 2
    assert guarded.caller_alloc(512 * MIB + 1) == REFUSED
    process.free.value = 256 * MIB  # less than the headroom free: even a byte is refused
    assert guarded.caller_alloc(1) == REFUSED
    assert process.mallocs.value == 2  # refused before the runtime was asked
    assert process.lib.umprov_headroom_refused() == 2
    assert other.caller_alloc(200 * MIB) == 0  # cuBLAS, NCCL: the rest is theirs
    assert process.mallocs.value == 3


def mappings(path: Path) -> list[tuple[int, int, str]]:
    """The process's mappings of ``path``: (start, end, permissions), neighbours of the same
    permissions merged (mprotect may split a mapping and leave it split)."""
    merged: list[tuple[int, int, str]] = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) < 6 or fields[5] != str(path):
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        if merged and merged[-1][1] == start and merged[-1][2] == fields[1]:
            merged[-1] = (merged[-1][0], end, fields[1])
        else:
            merged.append((start, end, fields[1]))
    return merged


@pytest.mark.parametrize("link", ["lazy", "now", "noplt"])
def test_the_library_keeps_its_pages_protections(process: SimpleNamespace, tmp_path: Path,
                                                 link: str) -> None:
    """A slot under RELRO is read-only again after the store; a page the loader left
    writable (lazy binding's GOT, .data beside it) stays writable."""
    path = tmp_path / f"libcaller_{link}.so"
    before = mappings(path)
    assert before and (link == "lazy" or any(p.startswith("r--") for _, _, p in before))
    assert process.install(link, 512 * MIB) == 1
    assert mappings(path) == before


def test_a_second_install_changes_the_headroom_and_no_headroom_passes_everything(
        process: SimpleNamespace) -> None:
    process.free.value = 1024 * MIB
    assert process.install("lazy", 512 * MIB) == 1
    assert process.callers["lazy"].caller_alloc(768 * MIB) == REFUSED
    assert process.install("lazy", 0) == 1  # the slot is guarded_malloc already: still one
    assert process.callers["lazy"].caller_alloc(1024 * MIB) == 0


@pytest.mark.parametrize("link", ["lazy", "now", "noplt"])
def test_a_slot_bound_already_keeps_its_function(process: SimpleNamespace, link: str) -> None:
    """Bound at load (Python loads libraries RTLD_NOW, as it loads torch's), the slot's own
    function stays the one called (an interposer's too), not the runtime's given."""
    process.free.value = 1024 * MIB
    assert process.install(link, 0, real="other_malloc") == 1
    assert process.callers[link].caller_alloc(MIB) == 0
    assert (process.counts["mallocs"].value, process.counts["other_mallocs"].value) == (1, 0)


def test_a_failed_free_memory_reading_passes_and_leaves_no_error_behind(
        process: SimpleNamespace) -> None:
    process.free.value = 0
    process.counts["info_rc"].value = 999  # cudaMemGetInfo fails: the call goes through
    assert process.install("lazy", 512 * MIB) == 1
    assert process.callers["lazy"].caller_alloc(MIB) == 0
    assert process.mallocs.value == 1 and process.counts["last_error"].value == 0


def test_no_library_of_that_name_points_nothing(process: SimpleNamespace) -> None:
    install = process.lib.umprov_headroom_install
    assert install(b"libc10_cuda.so", 1, 1, 1, 512 * MIB) == 0
    assert install(b"libc10_cuda.so", None, 1, 1, 512 * MIB) == -1
    assert install(b"libc10_cuda.so", 1, 1, None, 512 * MIB) == -1
    assert install(b"libc10_cuda.so", 1, 1, 1, -1) == -1
    assert process.callers["lazy"].caller_alloc(1) == 0


@pytest.fixture
def python_side(process: SimpleNamespace, built: Path, managed_library: Path, tmp_path: Path,
                monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """umprov_managed with the stand-in runtime as the one torch loaded, a fresh copy of the
    library, and the lazy caller as the caching allocator's library."""
    import sys

    from tests.conftest import REPO

    managed = str(REPO / "docker" / "pytorch-cuda" / "managed")
    if managed not in sys.path:
        monkeypatch.syspath_prepend(managed)
    import umprov_managed

    runtime = ctypes.CDLL(str(built / "libfakecudart.so"))
    version = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int))(
        lambda out: (out.__setitem__(0, 12080), 0)[1])
    cudart = SimpleNamespace(cudaMallocManaged=runtime.cudaMalloc, cudaFree=runtime.cudaMalloc,
                             cudaMemAdvise=runtime.cudaMalloc, cudaMalloc=runtime.cudaMalloc,
                             cudaMemGetInfo=runtime.cudaMemGetInfo,
                             cudaGetLastError=runtime.cudaGetLastError,
                             cudaRuntimeGetVersion=version)
    copy = tmp_path / "python-side.so"
    shutil.copy(managed_library, copy)
    monkeypatch.setattr(umprov_managed, "_cudart", lambda: cudart)
    monkeypatch.setattr(umprov_managed, "LIBRARY", copy)
    monkeypatch.setattr(umprov_managed, "_state", {})
    monkeypatch.setenv("UMPROV_MANAGED_HOST_RESERVE", "0")
    return SimpleNamespace(module=umprov_managed, version=version)


@pytest.fixture
def guarded(python_side: SimpleNamespace, tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """umprov_managed keeping a 512 MiB headroom for the "now" caller (the caching allocator's
    library here)."""
    module = python_side.module
    monkeypatch.setattr(module, "GUARDED", f"{tmp_path}/libcaller_now.so")
    module._state["headroom"] = 512 * MIB
    lib = module._state["library"] = module._library()
    module._keep_headroom(lib)
    return SimpleNamespace(module=module, lib=lib)


def test_the_python_side_guards_the_caching_allocators_library(
        guarded: SimpleNamespace, process: SimpleNamespace) -> None:
    process.free.value = 1024 * MIB
    assert process.callers["now"].caller_alloc(768 * MIB) == REFUSED
    assert process.callers["lazy"].caller_alloc(768 * MIB) == 0
    assert guarded.lib.umprov_headroom_refused() == 1
    assert guarded.module._state["headroom"] == 512 * MIB


def test_room_held_back_while_forward_runs_adds_to_the_headroom_until_given_back(
        guarded: SimpleNamespace, process: SimpleNamespace) -> None:
    module = guarded.module
    process.free.value = 1024 * MIB
    alloc = process.callers["now"].caller_alloc
    assert alloc(256 * MIB) == 0  # 768 MiB left: above the headroom
    module.hold_back(512 * MIB)
    assert alloc(256 * MIB) == REFUSED and module.stats()["held_back"] == 512 * MIB
    module.hold_back(0)
    assert alloc(256 * MIB) == 0 and module._state["headroom"] == 512 * MIB


def test_no_room_is_held_back_where_no_headroom_is_kept(python_side: SimpleNamespace) -> None:
    module = python_side.module
    module._state.update(headroom=0, library=module._library())
    module.hold_back(512 * MIB)
    assert "held_back" not in module._state and module.stats()["held_back"] == 0


def test_without_the_caching_allocators_library_no_headroom_is_counted(
        python_side: SimpleNamespace, capsys: pytest.CaptureFixture[str]) -> None:
    module = python_side.module
    module._state["headroom"] = 512 * MIB
    module._keep_headroom(module._library())  # no libc10_cuda.so in this process
    assert module._state["headroom"] == 0  # device_room counts none
    assert capsys.readouterr().err == ("umprov managed memory: no headroom kept for CUDA: "
                                       "libc10_cuda.so's cudaMalloc not found\n")



def test_no_headroom_where_the_reservoir_could_not_be_made(
        python_side: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a reservoir to turn to, a guarded cudaMalloc would only run out of memory
    512 MiB sooner than PyTorch does: the guard comes last, once the reservoir is there."""
    module = python_side.module
    module._state.update(headroom=512 * MIB)
    kept: list = []
    monkeypatch.setattr(module, "_keep_headroom", kept.append)
    monkeypatch.setattr(module, "_library", lambda: "library")
    monkeypatch.setattr(module, "_first_device", lambda torch: 0)
    torch = SimpleNamespace(cuda=SimpleNamespace(memory=SimpleNamespace(
        CUDAPluggableAllocator=lambda *args: "allocator")))

    def refused(torch: object, device: int) -> None:
        raise RuntimeError("GPU 0 has no concurrent managed access")

    monkeypatch.setattr(module, "_fill", refused)
    with pytest.raises(RuntimeError, match="concurrent"):
        module._start(torch)
    assert kept == []
    module._state.clear()  # as enable() and the import hook do on a failed start
    module._state.update(headroom=512 * MIB)
    import umprov_managed_step

    monkeypatch.setattr(module, "_fill", lambda torch, device: None)
    monkeypatch.setattr(umprov_managed_step, "install", lambda library: None)
    module._start(torch)
    assert kept == ["library"]
