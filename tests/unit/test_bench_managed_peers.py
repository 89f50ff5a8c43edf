"""bench/managed_peers.py's account of where the allocator's bytes sit (its GPU runs: bench/README),
on CPU torch with the snapshot and the pool's placement stood in for."""

from __future__ import annotations

import contextlib
import os
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


def plan(*argv: str) -> list[dict]:
    args = SimpleNamespace(layers=15, steps=5, model="transformer", only="")
    for key, value in zip(argv[::2], argv[1::2], strict=True):
        setattr(args, key, value)
    return managed_peers.plan(args)


def test_every_optimizer_row_has_gradients_down_beside_torchao():
    names = {r["name"] for r in plan()}
    for optim in ("adamw:fp32", "adamw_fused:fp32", "sgd:fp32", "adamw:bf16"):
        assert {f"pool_grads_down:{optim}", f"torchao:{optim}"} <= names


def test_the_mlp_fits_in_one_block_and_the_transformer_in_two():
    for model, small in (("transformer", 2), ("mlp", 1)):
        runs = plan("model", model, "only", "fit:default,curve:default,torchao:adamw:fp32")
        assert {r["model"] for r in runs} == {model}
        sizes = {r["name"]: r["layers"] for r in runs}
        assert sizes == {"fit:default": small, "curve:default": small, "torchao:adamw:fp32": 15}
        # what fits beside the bench's neighbour (16 GiB left) with room for activations
        assert small * managed_peers.PARAMS_PER_LAYER[model] * 16 < 9 << 30


class Recording:
    """The few torch.nn classes build_model uses, recording their shapes."""

    def __init__(self) -> None:
        self.made: list[tuple] = []
        self.nn = SimpleNamespace(Linear=self.make("Linear"), GELU=self.make("GELU"),
                                  TransformerEncoderLayer=self.make("Encoder"),
                                  Sequential=lambda *parts: list(parts))

    def make(self, kind: str):
        def build(*args, **kwargs):
            self.made.append((kind, *args))
            return kind
        return build


def test_the_models_are_the_issues_transformer_and_an_mlp_of_8192_by_32768():
    fake = Recording()
    assert managed_peers.build_model(fake, {"model": "mlp", "layers": 2}) == [
        ["Linear", "GELU", "Linear"]] * 2
    assert fake.made[:3] == [("Linear", 8192, 32768), ("GELU",), ("Linear", 32768, 8192)]
    fake = Recording()
    assert managed_peers.build_model(fake, {"layers": 3}) == ["Encoder"] * 3  # the default
    assert fake.made[0] == ("Encoder", 4096, 32, 16384)
    layer = torch.nn.TransformerEncoderLayer(4096, 32, 16384, dropout=0.0, batch_first=True,
                                             device="meta")
    assert sum(p.numel() for p in layer.parameters()) == managed_peers.PARAMS_PER_LAYER[
        "transformer"]
    assert managed_peers.PARAMS_PER_LAYER["mlp"] == 2 * 8192 * 32768 + 32768 + 8192


def test_each_model_trains_on_one_seeded_batch_of_its_shape():
    mlp = managed_peers.batch(torch, {"model": "mlp"})
    assert mlp.shape == (2048, 8192) and torch.equal(mlp, managed_peers.batch(torch, {
        "model": "mlp"}))
    assert managed_peers.batch(torch, {}).shape == (2, 512, 4096)


def test_the_table_gives_each_row_against_the_best_peer_and_its_set_up_beside_its_first_step():
    """torchao pins its host copies when the optimizer is made, the pool in its first step:
    only set-up and first step together compare."""
    results = [
        {"name": "torchao:adamw:fp32", "how": "torchao", "step_s": [2.4, 1.0, 1.2, 1.1],
         "setup_s": 9.5},
        {"name": "pool_grads_down:adamw:fp32", "how": "pool_grads_down",
         "step_s": [12.4, 1.1, 1.1, 1.2], "setup_s": 3.0,
         "pool": {"peak_spilled": 2 * managed_peers.GIB}},
        {"name": "fsdp2:adamw:fp32", "how": "fsdp2", "oom": "CUDA out of memory"},
    ]
    lines = managed_peers.table(results, 55.0)
    assert lines[1].endswith("| set-up + first step s")
    assert lines[2].startswith("torchao:adamw:fp32 | 1.1 | 1.00 |") and lines[2].endswith(
        "| 9.5 + 2.4")
    assert lines[3].startswith("pool_grads_down:adamw:fp32 | 1.1 | 1.00 |")
    assert lines[3].endswith("| 2.0 | 3.0 + 12.4")
    assert lines[4].startswith("fsdp2:adamw:fp32 | out of memory |") and lines[4].endswith("| ")


def test_weights_out_moves_the_first_quarter_of_the_layers_weights_into_the_reservoir(
        monkeypatch):
    pools: list = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "use_mem_pool",
                        lambda pool: pools.append(pool) or contextlib.nullcontext())
    reservoir = object()
    managed = SimpleNamespace(reservoir=lambda device: reservoir)
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(5)])
    before = [(p.data_ptr(), p.detach().clone()) for p in model.parameters()]
    moved = managed_peers.weights_out(torch, managed, model)
    assert pools == [reservoir]
    first_two = list(model[0].parameters()) + list(model[1].parameters())  # ceil(5 / 4)
    assert [id(p) for p in moved] == [id(p) for p in first_two]
    for p, (ptr, value) in zip(model.parameters(), before, strict=True):
        assert torch.equal(p, value) and (p.data_ptr() != ptr) == any(p is m for m in moved)


def test_gradients_down_are_on_for_the_product_and_the_weights_out_experiment():
    assert set(managed_peers.GRADS_DOWN) == {"pool_grads_down", "pool_weights_out"}
    assert "pool_weights_out:adamw:fp32" in {r["name"] for r in plan()}


def test_the_deepspeed_row_is_zero_offload_of_adamw_driven_through_its_engine(monkeypatch):
    seen: dict = {}

    class Engine:
        def backward(self, loss):
            seen.setdefault("calls", []).append(("backward", loss))

        def step(self):
            seen.setdefault("calls", []).append(("step",))

    def initialize(model, model_parameters, config):
        seen.update(model=model, config=config)
        return Engine(), None, None, None

    monkeypatch.setitem(sys.modules, "deepspeed", SimpleNamespace(initialize=initialize))
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    model = SimpleNamespace(parameters=lambda: [])
    opt = managed_peers.optimizer(None, model, {"how": "deepspeed", "optim": "adamw"})
    zero = seen["config"]["zero_optimization"]
    assert zero["stage"] == 2 and zero["offload_optimizer"] == {"device": "cpu",
                                                                 "pin_memory": True}
    assert seen["config"]["optimizer"]["type"] == "AdamW" and os.environ["WORLD_SIZE"] == "1"
    assert "bf16" not in seen["config"]  # fp32 unless the row says bf16: DeepSpeed's own then
    managed_peers.optimizer(None, model, {"how": "deepspeed", "optim": "adamw", "dtype": "bf16"})
    assert seen["config"]["bf16"] == {"enabled": True}
    opt.engine.backward("loss")  # the loop calls the engine's own
    opt.step()
    opt.zero_grad(set_to_none=True)
    assert seen["calls"] == [("backward", "loss"), ("step",)]
    monkeypatch.setenv("UMPROV_BENCH_DS_TORCH_ADAM", "1")  # its Adam op did not build
    managed_peers.optimizer(None, model, {"how": "deepspeed", "optim": "adamw"})
    assert seen["config"]["optimizer"]["params"]["torch_adam"] is True
    with pytest.raises(ValueError, match="AdamW only"):
        managed_peers.optimizer(None, model, {"how": "deepspeed", "optim": "sgd"})
    names = {r["name"] for r in plan()}
    assert "deepspeed:adamw:fp32" in names and "deepspeed:adamw:bf16" in names
