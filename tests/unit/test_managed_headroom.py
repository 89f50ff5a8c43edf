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
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

MIB = 1 << 20
REFUSED = 2  # cudaErrorMemoryAllocation

RUNTIME = r"""
#include <stddef.h>
#include <stdlib.h>
size_t fake_free;
int fake_mallocs;
int cudaMalloc(void **p, size_t n) { (void)n; fake_mallocs++; *p = malloc(1); return 0; }
int cudaMemGetInfo(size_t *free_bytes, size_t *total) {
  *free_bytes = fake_free;
  *total = 2 * fake_free;
  return 0;
}
"""
CALLER = r"""
#include <stddef.h>
int cudaMalloc(void **p, size_t n);
int caller_alloc(size_t n) { void *p = NULL; return cudaMalloc(&p, n); }
"""
LINKS = {"lazy": ["-Wl,-z,lazy"], "now": ["-Wl,-z,relro,-z,now"], "other": []}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in runtime (libfakecudart.so) and three callers linked against it."""
    if shutil.which("gcc") is None:
        pytest.skip("no gcc to build the stand-ins with")
    out = tmp_path_factory.mktemp("headroom")
    (out / "runtime.c").write_text(RUNTIME)
    (out / "caller.c").write_text(CALLER)
    gcc = ["gcc", "-O2", "-shared", "-fPIC"]
    subprocess.run(gcc + ["-Wl,-soname,libfakecudart.so", "-o", str(out / "libfakecudart.so"),
                          str(out / "runtime.c")], check=True)
    for name, flags in LINKS.items():
        subprocess.run(gcc + flags + ["-o", str(out / f"libcaller_{name}.so"),
                                      str(out / "caller.c"), f"-L{out}", "-lfakecudart",
                                      f"-Wl,-rpath,{out}"], check=True)
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
    lib.umprov_headroom_install.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p,
                                            ctypes.c_longlong]
    lib.umprov_headroom_refused.restype = ctypes.c_longlong
    free = ctypes.c_size_t.in_dll(runtime, "fake_free")
    mallocs = ctypes.c_int.in_dll(runtime, "fake_mallocs")
    mallocs.value = 0

    def address(name: str) -> int | None:
        return ctypes.cast(getattr(runtime, name), ctypes.c_void_p).value

    def install(name: str, headroom: int) -> int:
        return lib.umprov_headroom_install(f"{tmp_path}/libcaller_{name}.so".encode(),
                                           address("cudaMalloc"), address("cudaMemGetInfo"),
                                           headroom)

    return SimpleNamespace(lib=lib, callers=callers, free=free, mallocs=mallocs,
                           install=install)


@pytest.mark.parametrize("link", ["lazy", "now"])
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


@pytest.mark.parametrize("link", ["lazy", "now"])
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


def test_no_library_of_that_name_points_nothing(process: SimpleNamespace) -> None:
    assert process.lib.umprov_headroom_install(b"libc10_cuda.so", 1, 1, 512 * MIB) == 0
    assert process.lib.umprov_headroom_install(b"libc10_cuda.so", None, 1, 512 * MIB) == -1
    assert process.lib.umprov_headroom_install(b"libc10_cuda.so", 1, 1, -1) == -1
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
                             cudaRuntimeGetVersion=version)
    copy = tmp_path / "python-side.so"
    shutil.copy(managed_library, copy)
    monkeypatch.setattr(umprov_managed, "_cudart", lambda: cudart)
    monkeypatch.setattr(umprov_managed, "LIBRARY", copy)
    monkeypatch.setattr(umprov_managed, "_state", {})
    monkeypatch.setenv("UMPROV_MANAGED_HOST_RESERVE", "0")
    return SimpleNamespace(module=umprov_managed, version=version)


def test_the_python_side_guards_the_caching_allocators_library(
        python_side: SimpleNamespace, process: SimpleNamespace, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    module = python_side.module
    monkeypatch.setattr(module, "GUARDED", f"{tmp_path}/libcaller_now.so")
    module._state["headroom"] = 512 * MIB
    lib = module._library()
    process.free.value = 1024 * MIB
    assert process.callers["now"].caller_alloc(768 * MIB) == REFUSED
    assert process.callers["lazy"].caller_alloc(768 * MIB) == 0
    assert lib.umprov_headroom_refused() == 1 and module._state["headroom"] == 512 * MIB


def test_without_the_caching_allocators_library_no_headroom_is_counted(
        python_side: SimpleNamespace, capsys: pytest.CaptureFixture[str]) -> None:
    module = python_side.module
    module._state["headroom"] = 512 * MIB
    module._library()  # no libc10_cuda.so in this process
    assert module._state["headroom"] == 0  # device_room counts none
    assert capsys.readouterr().err == ("umprov managed memory: no headroom kept for CUDA: "
                                       "libc10_cuda.so's cudaMalloc not found\n")

