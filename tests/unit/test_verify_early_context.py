"""The agent's children retain their GPU's primary CUDA context while torch imports, once the
CUDA gate is open (umprov/verify/agent/early_context.py); a stand-in driver built with gcc."""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

import pytest

from tests.conftest import shared_library
from umprov.verify.agent import early_context

DRIVER = r"""
static int initialised, retained, last_device = -1;
int cuInit(unsigned flags) { initialised = flags == 0; return 0; }
int cuDeviceGet(int *device, int ordinal) {
    if (!initialised) return 3;            /* CUDA_ERROR_NOT_INITIALIZED */
    if (ordinal < 0 || ordinal >= 2) return 101;  /* CUDA_ERROR_INVALID_DEVICE */
    *device = 100 + ordinal; return 0;
}
int cuDevicePrimaryCtxRetain(void **context, int device) {
    retained++; last_device = device; *context = (void *)0x1; return 0;
}
int stand_in_retained(void) { return retained; }
int stand_in_last_device(void) { return last_device; }
"""


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_library(tmp_path_factory.mktemp("driver"), "libcuda.so.1", DRIVER)


def test_the_devices_primary_context_is_retained_through_the_driver(driver: Path) -> None:
    assert early_context.retain_primary_context(1, str(driver))
    lib = ctypes.CDLL(str(driver))
    assert lib.stand_in_retained() == 1 and lib.stand_in_last_device() == 101


def test_no_such_device_or_no_driver_retains_nothing(driver: Path, tmp_path: Path) -> None:
    lib = ctypes.CDLL(str(driver))
    before = lib.stand_in_retained()
    assert not early_context.retain_primary_context(2, str(driver))  # a guess too high
    assert lib.stand_in_retained() == before
    assert not early_context.retain_primary_context(0, str(tmp_path / "libcuda.so.1"))


def test_the_context_waits_for_the_cuda_gate(monkeypatch, tmp_path: Path) -> None:
    """The monitor child lists the GPU's processes first: the agent's own are not foreign."""
    retained = threading.Event()
    monkeypatch.setattr(early_context, "retain_primary_context",
                        lambda ordinal: retained.set() or True)
    gate = tmp_path / "cuda.gate"
    thread = early_context.start_early_context(0, str(gate), limit=30)
    assert not retained.wait(0.2)  # gate closed: nothing yet
    gate.touch()
    assert retained.wait(5)
    thread.join(5)
    assert not thread.is_alive()


@pytest.mark.parametrize(("before", "after"), [(None, "LAZY"), ("EAGER", "EAGER")])
def test_module_loading_is_set_as_torch_sets_it_before_the_driver_starts(
        monkeypatch, tmp_path: Path, before: str | None, after: str) -> None:
    """The driver reads it at cuInit, and torch would setenv it later, beside the thread."""
    if before is None:
        monkeypatch.delenv("CUDA_MODULE_LOADING", raising=False)
    else:
        monkeypatch.setenv("CUDA_MODULE_LOADING", before)
    monkeypatch.setattr(early_context, "retain_primary_context", lambda ordinal: True)
    early_context.start_early_context(0, None).join(5)
    assert os.environ["CUDA_MODULE_LOADING"] == after


def test_a_gate_that_never_opens_leaves_the_context_to_torch(monkeypatch, tmp_path: Path) -> None:
    calls: list[int] = []
    monkeypatch.setattr(early_context, "retain_primary_context", calls.append)
    thread = early_context.start_early_context(0, str(tmp_path / "never.gate"), limit=0.1)
    thread.join(5)
    assert not thread.is_alive() and calls == []
    early_context.start_early_context(3, None).join(5)  # no gate: at once
    assert calls == [3]
