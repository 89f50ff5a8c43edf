"""PyTorch's allocator settings beside the reservoir (docker/pytorch-cuda/managed/
umprov_managed_conf.py), with torch's calls stood in for: the settings that rule it out, expandable
segments off while it is made, and the job's own memory fraction kept of device memory."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from tests.conftest import REPO

MANAGED = REPO / "docker" / "pytorch-cuda" / "managed"
if str(MANAGED) not in sys.path:
    sys.path.insert(0, str(MANAGED))

import umprov_managed_conf as conf  # noqa: E402

GIB = 1 << 30


@pytest.fixture(autouse=True)
def no_settings(monkeypatch):
    for name in conf.ALLOC_CONF:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(("name", "value", "why"), [
    ("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync",
     "PYTORCH_CUDA_ALLOC_CONF backend:cudaMallocAsync selects"),
    ("PYTORCH_ALLOC_CONF", "backend: cudaMallocAsync", "PYTORCH_ALLOC_CONF backend:cuda"),
    ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True,max_split_size_mb:512",
     "PYTORCH_CUDA_ALLOC_CONF max_split_size_mb:512 keeps PyTorch from splitting"),
    ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", None),
    ("PYTORCH_CUDA_ALLOC_CONF", "backend:native", None), ("PYTORCH_ALLOC_CONF", "", None)])
def test_allocator_settings_the_reservoir_cannot_run_with_are_named(monkeypatch, name, value,
                                                                    why):
    monkeypatch.setenv(name, value)
    found = conf.ruled_out()
    assert (found is None) if why is None else found.startswith(why)


def fake_torch(log: list) -> SimpleNamespace:
    fraction = {"set_per_process_memory_fraction": lambda f, d=None: log.append(("set", f, d)),
                "get_per_process_memory_fraction": lambda d=None: 0.5}
    cuda = SimpleNamespace(
        init=lambda: log.append(("init",)),
        get_device_properties=lambda d: SimpleNamespace(total_memory=80 * GIB),
        memory=SimpleNamespace(_set_allocator_settings=lambda s: log.append(("settings", s)),
                               **fraction),
        _utils=SimpleNamespace(_get_device_index=lambda d, optional=False: 0 if d is None
                               else int(d)),
        **fraction)
    return SimpleNamespace(cuda=cuda)


def test_expandable_segments_go_off_and_on_with_every_other_setting_given_again(monkeypatch):
    log: list = []
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "roundup_power2_divisions:[256:1,512:2]")
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "Expandable_Segments: True")
    with pytest.raises(RuntimeError), conf.expandable_off(fake_torch(log)):
        log.append(("made",))
        raise RuntimeError("refused")  # the settings come back all the same
    both = "roundup_power2_divisions:[256:1,512:2],Expandable_Segments: True"
    assert log == [("settings", "roundup_power2_divisions:[256:1,512:2],Expandable_Segments: "
                                "False"), ("made",), ("settings", both)]


def test_without_expandable_segments_no_setting_is_touched(monkeypatch):
    log: list = []
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")
    with conf.expandable_off(fake_torch(log)):
        log.append(("made",))
    assert log == [("made",)]


def test_the_jobs_memory_fraction_is_of_device_memory_and_reads_back_as_set(capsys):
    log: list = []
    torch, wanted = fake_torch(log), {}
    sizes = {0: 8 * GIB}
    conf.patch_memory_fraction(torch, lambda d: sizes.get(d, 0), wanted)
    torch.cuda.set_per_process_memory_fraction(0.5)
    assert log[-2:] == [("init",), ("set", 0.5 + 8 / 80, None)]
    assert torch.cuda.memory.get_per_process_memory_fraction() == 0.5 and wanted == {0: 0.5}
    torch.cuda.memory.set_per_process_memory_fraction(0.95, 0)  # past the GPU: capped
    assert log[-1] == ("set", 1.0, 0)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "device memory is capped at 73728 MiB; " in err[0]
    assert err[0].endswith("UMPROV_MANAGED_RESERVOIR=3840m or less keeps the fraction")
    torch.cuda.set_per_process_memory_fraction(0.3, 1)  # no reservoir there
    assert log[-1] == ("set", 0.3, 1) and wanted == {0: 0.95, 1: 0.3}
    assert torch.cuda.get_per_process_memory_fraction(2) == 0.5  # never set: torch's
    sizes[0] = 100 * GIB  # a reservoir larger than the GPU: nothing of it left for device memory
    torch.cuda.set_per_process_memory_fraction(0.5, 0)
    err = capsys.readouterr().err.strip()
    assert "capped at 0 MiB, so the job runs from host memory; " in err
    assert err.endswith("UMPROV_MANAGED_RESERVOIR=40704m or less keeps the fraction")


@pytest.mark.parametrize("fraction", [1, -0.1, 1.5])
def test_a_fraction_torch_refuses_reaches_torch_unchanged(fraction):
    log: list = []
    torch, wanted = fake_torch(log), {}
    conf.patch_memory_fraction(torch, lambda d: 8 * GIB, wanted)
    torch.cuda.set_per_process_memory_fraction(fraction, 0)
    assert log == [("set", fraction, 0)] and wanted == {}


def test_the_fraction_is_patched_once():
    torch = fake_torch([])
    conf.patch_memory_fraction(torch, lambda d: 0, {})
    patched = torch.cuda.set_per_process_memory_fraction
    conf.patch_memory_fraction(torch, lambda d: 0, {})
    assert torch.cuda.set_per_process_memory_fraction is patched
    assert not hasattr(conf.torch_set_fraction(torch), "_umprov_inner")
