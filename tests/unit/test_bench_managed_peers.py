"""bench/managed_peers.py's account of where the allocator's bytes sit (its GPU runs: bench/README),
on CPU torch with the snapshot and the pool's placement stood in for."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from tests.conftest import REPO

torch = pytest.importorskip("torch")
if str(REPO / "bench") not in sys.path:
    sys.path.insert(0, str(REPO / "bench"))

import managed_peers  # noqa: E402


def test_where_step_counts_live_and_free_bytes_by_placement(monkeypatch):
    monkeypatch.setattr(managed_peers, "GIB", 1)  # figures in bytes
    placed, spilled, foreign = 0x1000, 0x2000, 0x3000  # torch's, the reservoir's, torch's
    segments = [{"address": placed, "total_size": 300, "allocated_size": 200},
                {"address": spilled, "total_size": 400, "allocated_size": 100},
                {"address": foreign, "total_size": 100, "allocated_size": 100}]
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda: segments)
    model = torch.nn.Linear(4, 4)
    host_side = {model.weight.data_ptr()}  # the weight spilled, the bias placed

    def in_reservoir(where):
        if isinstance(where, int):
            return where == spilled
        return (where is model.weight or where is model.bias) and where.data_ptr() in host_side

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = managed_peers.where_step(torch, SimpleNamespace(in_reservoir=in_reservoir), model,
                                    opt, torch.ones(2, 4))
    for phase in ("after_forward", "after_backward", "after_step"):
        assert seen[phase] == {"live": [300, 100], "free": [100, 300]}  # torch's: placed
    assert seen["params"] == [4 * 4, 16 * 4]  # bias on the device, weight spilled
    assert seen["grads"] == [4 * 4 + 16 * 4, 0]  # not of the reservoir
    assert model.weight.grad is None  # the step's zero_grad ran


def test_allocator_counts_reads_the_slow_paths_and_zero_for_names_a_torch_lacks(monkeypatch):
    monkeypatch.setattr(torch.cuda, "memory_stats",
                        lambda: {"num_alloc_retries": 3, "num_ooms": 0, "num_device_alloc": 7,
                                 "allocated_bytes.all.current": 1 << 20})
    assert managed_peers.allocator_counts(torch) == {
        "num_alloc_retries": 3, "num_ooms": 0, "num_sync_all_streams": 0,
        "num_device_alloc": 7, "num_device_free": 0}
