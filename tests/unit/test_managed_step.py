"""The optimizer's host step (docker/pytorch-cuda/managed/umprov_managed_step.py) on CPU torch.

What a GPU is not needed for: the user's own optimizer stepping over host copies of the
parameters (``HostStep._step_on_host``) computes what its own step computes, keeps
``optimizer.state`` keyed by the user's parameters and round-trips ``state_dict()``; which
optimizers and calls it stays out of (``eligible``); the chunks; and the step hooks that run
the host step and hide the parameters from the device step that follows. The copies between
the GPU and the host (streams, pinned slots) are tested on a GPU: tests/gpu."""

from __future__ import annotations

import contextlib
import copy
import ctypes
import itertools
import sys
from types import SimpleNamespace

import pytest

from tests.conftest import REPO, torch_with_dynamo

torch = torch_with_dynamo()  # imports torch._dynamo safely beside ansible-core

MANAGED = REPO / "docker" / "pytorch-cuda" / "managed"
if str(MANAGED) not in sys.path:
    sys.path.insert(0, str(MANAGED))

import umprov_managed_grads as managed_grads  # noqa: E402
import umprov_managed_pinned as pinned_memory  # noqa: E402
import umprov_managed_step as step  # noqa: E402
from torch.optim.optimizer import (  # noqa: E402
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

# The host step never calls the scheduler's wrapped optimizer.step: the scheduler says so.
pytestmark = pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)`")

# (class, its defaults, the second group's own settings): two groups with different lr
OPTIMIZERS = {
    "AdamW": (torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1}, {"lr": 3e-2}),
    "Adam-amsgrad": (torch.optim.Adam, {"lr": 1e-2, "amsgrad": True, "betas": (0.8, 0.99)},
                     {"lr": 2e-2, "weight_decay": 0.01}),
    "SGD-momentum": (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-3},
                     {"lr": 0.1, "nesterov": True, "dampening": 0.0}),
    "RMSprop": (torch.optim.RMSprop, {"lr": 1e-2, "momentum": 0.5, "centered": True},
                {"lr": 5e-3}),
    "Adagrad": (torch.optim.Adagrad, {"lr": 0.1, "lr_decay": 0.01}, {"lr": 0.2}),
}
SHAPES = [(4, 3), (4,), (2, 4), (2,), (5,)]


def parameters(seed: int = 0) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=gen)) for shape in SHAPES]


def optimizer(kind: str, params: list[torch.Tensor]) -> torch.optim.Optimizer:
    cls, defaults, second = OPTIMIZERS[kind]
    return cls([{"params": params[:2]}, {"params": params[2:], **second}], **defaults)


def scheduler(opt: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    return torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)


def grads(i: int) -> list[torch.Tensor | None]:
    """Step i's gradients; in odd steps the last parameter has none (it is not stepped)."""
    gen = torch.Generator().manual_seed(100 + i)
    out: list[torch.Tensor | None] = [torch.randn(shape, generator=gen) for shape in SHAPES]
    if i % 2:
        out[-1] = None
    return out


def host_step(opt: torch.optim.Optimizer, fused: bool) -> step.HostStep:
    """A HostStep without its CUDA streams and pinned memory (object.__new__): its masters are
    plain host copies of the user's parameters, which stand for the GPU's."""
    host = object.__new__(step.HostStep)
    host.opt = opt
    host.step_fn = getattr(type(opt).step, "__wrapped__", type(opt).step)
    host.masters = {p: p.detach().clone() for g in opt.param_groups for p in g["params"]}
    host.versions = {}
    host.fused = fused
    host.master_pins, host.slot_pins, host.uploaded = [], [], None
    host.device = torch.device("cpu")
    return host


def step_on_host(host: step.HostStep, params: list[torch.Tensor],
                 gs: list[torch.Tensor | None]) -> None:
    """What HostStep.step does, less the copies' streams: gradients down to the masters, the
    inner step chunk by chunk, the masters up to the parameters."""
    stepped = [p for p, g in zip(params, gs, strict=True) if g is not None]
    for p, g in zip(params, gs, strict=True):
        if g is not None:
            host.masters[p].grad = g.clone()
    # chunks that cut across the two groups, as CHUNK does in a large model
    for chunk in (stepped[:3], stepped[3:]):
        if chunk:
            host._step_on_host(chunk)
    with torch.no_grad():
        for p in stepped:
            p.copy_(host.masters[p])
            host.masters[p].grad = None


def reference_step(opt: torch.optim.Optimizer, params: list[torch.Tensor],
                   gs: list[torch.Tensor | None]) -> None:
    for p, g in zip(params, gs, strict=True):
        p.grad = None if g is None else g.clone()
    opt.step()


def same(a: torch.Tensor, b: torch.Tensor, exact: bool) -> None:
    if exact:
        assert torch.equal(a, b), (a, b)
    else:  # a fused CPU kernel against the single-tensor loop: rounding apart
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def same_state(ref: torch.optim.Optimizer, ref_params: list, opt: torch.optim.Optimizer,
               params: list, exact: bool) -> None:
    for p_ref, p in zip(ref_params, params, strict=True):
        assert set(opt.state[p]) == set(ref.state[p_ref])
        for key, value in ref.state[p_ref].items():
            mine = opt.state[p][key]
            assert mine.device.type == "cpu"
            same(mine.float(), value.float(), exact)


FUSED = "cpu" in step._get_fused_kernels_supported_devices()


@pytest.mark.parametrize("fused", [False, pytest.param(True, marks=pytest.mark.skipif(
    not FUSED, reason="this torch has no fused CPU kernels"))], ids=["loop", "fused"])
@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_the_host_step_is_the_optimizers_own_step(kind, fused):
    exact = not fused
    ref_params, params = parameters(), parameters()
    ref, opt = optimizer(kind, ref_params), optimizer(kind, params)
    ref_sched, sched = scheduler(ref), scheduler(opt)
    host = host_step(opt, fused)
    groups = opt.param_groups
    group_dicts = [dict(g) for g in groups]
    for i in range(5):
        reference_step(ref, ref_params, grads(i))
        step_on_host(host, params, grads(i))
        ref_sched.step()
        sched.step()
        assert opt.param_groups is groups  # the user's groups are back after each chunk
        for p_ref, p in zip(ref_params, params, strict=True):
            same(p, p_ref, exact)
    # the schedule reached the host step: lr halved twice, each group its own
    assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in ref.param_groups]
    assert opt.param_groups[1]["lr"] == OPTIMIZERS[kind][2]["lr"] * 0.25
    # the host step's settings (foreach off, fused) stay out of the user's groups
    assert [{k: v for k, v in g.items() if k != "lr"} for g in opt.param_groups] == \
        [{k: v for k, v in g.items() if k != "lr"} for g in group_dicts]
    # the state is keyed by the user's parameters, never by the host copies
    assert {id(p) for p in opt.state} == {id(p) for p in params}
    assert not {id(m) for m in host.masters.values()} & {id(p) for p in opt.state}
    same_state(ref, ref_params, opt, params, exact)


@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_state_dict_round_trips_into_a_fresh_optimizer(kind):
    ref_params, params = parameters(), parameters()
    ref, opt = optimizer(kind, ref_params), optimizer(kind, params)
    ref_sched, sched = scheduler(ref), scheduler(opt)
    host = host_step(opt, False)
    for i in range(3):
        reference_step(ref, ref_params, grads(i))
        step_on_host(host, params, grads(i))
        ref_sched.step()
        sched.step()
    saved, saved_sched = copy.deepcopy(opt.state_dict()), copy.deepcopy(sched.state_dict())
    expected = ref.state_dict()
    assert saved["param_groups"] == expected["param_groups"]
    assert sorted(saved["state"]) == sorted(expected["state"]) == list(range(len(SHAPES)))
    for index, state in expected["state"].items():
        for key, value in state.items():
            assert torch.equal(saved["state"][index][key], value), (index, key)

    # a fresh process: the model's parameters as they are, a new optimizer and scheduler
    fresh_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    fresh = optimizer(kind, fresh_params)
    fresh_sched = scheduler(fresh)
    fresh.load_state_dict(saved)
    fresh_sched.load_state_dict(saved_sched)
    fresh_host = host_step(fresh, False)
    for i in range(3, 7):
        reference_step(ref, ref_params, grads(i))
        step_on_host(fresh_host, fresh_params, grads(i))
        ref_sched.step()
        fresh_sched.step()
    for p_ref, p in zip(ref_params, fresh_params, strict=True):
        assert torch.equal(p, p_ref)
    assert [g["lr"] for g in fresh.param_groups] == [g["lr"] for g in ref.param_groups]
    same_state(ref, ref_params, fresh, fresh_params, exact=True)


def test_the_inner_step_sees_the_masters_and_gives_the_users_groups_back_when_it_fails():
    params = parameters()
    opt = optimizer("AdamW", params)
    host = host_step(opt, True)
    groups, state = opt.param_groups, opt.state
    seen = {}

    def failing_step(o):
        seen["groups"] = [([id(p) for p in g["params"]], g["lr"], g["foreach"], g["fused"])
                          for g in o.param_groups]
        seen["state"] = {id(p): v for p, v in o.state.items()}
        seen["grad"] = torch.is_grad_enabled()
        raise RuntimeError("the step failed")

    opt.state[params[3]]["marker"] = 1
    host.step_fn = failing_step
    with pytest.raises(RuntimeError, match="the step failed"):
        host._step_on_host([params[0], params[3]])
    masters = host.masters
    assert seen["groups"] == [([id(masters[params[0]])], 1e-2, False, True),
                              ([id(masters[params[3]])], 3e-2, False, True)]
    assert seen["state"] == {id(masters[params[0]]): {}, id(masters[params[3]]): {"marker": 1}}
    assert seen["grad"] is False
    assert opt.param_groups is groups and opt.state is state
    assert groups[0]["foreach"] is None and groups[0]["fused"] is None


# eligible(): a stand-in for a CUDA parameter, as this torch has no CUDA


class CudaParam:
    """What eligible() reads of a parameter, on a CUDA device."""

    def __init__(self, dtype: torch.dtype = torch.float32, grad: torch.Tensor | None = None,
                 index: int = 0):
        self.device = torch.device("cuda", index)
        self._like = torch.empty(0, dtype=dtype)
        self.grad = torch.zeros(4, 4) if grad is None else grad

    def is_complex(self) -> bool:
        return self._like.is_complex()

    def is_floating_point(self) -> bool:
        return self._like.is_floating_point()


def on_cuda(opt: torch.optim.Optimizer, **param: object) -> torch.optim.Optimizer:
    """The optimizer with its parameters swapped for stand-ins on CUDA."""
    for group in opt.param_groups:
        group["params"] = [CudaParam(**param) for _ in group["params"]]  # type: ignore[arg-type]
    return opt


class AdamW(torch.optim.AdamW):  # the user's own: its name, not torch's
    pass


class MyAdam(torch.optim.Adam):
    pass


@pytest.mark.parametrize("kind", step.KINDS)
def test_eligible_takes_torchs_own_optimizers_of_each_kind(kind):
    opt = on_cuda(getattr(torch.optim, kind)(parameters()))
    assert step.eligible(opt, (opt,), {})


def test_eligible_reads_the_arguments_as_the_step_hooks_get_them():
    """The hook's args hold the optimizer itself; a closure comes after it, or as a keyword."""
    seen = []
    probe = on_cuda(torch.optim.SGD(parameters(), lr=0.1))  # what eligible() reads of opt
    handle = register_optimizer_step_pre_hook(lambda opt, args, kwargs: seen.append(
        (args[0] is opt, step.eligible(probe, args, kwargs))))
    try:
        params = parameters()
        for p in params:
            p.grad = torch.zeros_like(p)
        opt = torch.optim.SGD(params, lr=0.1)
        opt.step()
        opt.step(lambda: None)
        opt.step(closure=lambda: None)
    finally:
        handle.remove()
    assert seen == [(True, True), (True, False), (True, False)]


def test_eligible_refuses_what_a_host_step_would_change():
    def fresh(**kwargs: object) -> torch.optim.Optimizer:
        return on_cuda(torch.optim.AdamW(parameters(), lr=1e-3, **kwargs))

    opt = fresh()
    assert step.eligible(opt, (opt,), {})  # each case below differs from this in one thing
    assert not step.eligible(opt, (opt, lambda: 0.0), {})  # a closure
    assert not step.eligible(opt, (opt,), {"closure": lambda: 0.0})
    scale = torch.ones(())
    assert not step.eligible(opt, (opt,), {"grad_scale": scale, "found_inf": scale})  # GradScaler
    opt = fresh()
    opt.param_groups[0]["capturable"] = True
    assert not step.eligible(opt, (opt,), {})
    opt = fresh(differentiable=True)
    assert not step.eligible(opt, (opt,), {})
    opt = fresh()
    opt.param_groups[0]["lr"] = torch.tensor(1e-3)  # a tensor lr on the host is fine
    assert step.eligible(opt, (opt,), {})
    opt.param_groups[0]["lr"] = torch.empty((), device="meta")  # on a device: not the host's
    assert not step.eligible(opt, (opt,), {})
    opt = on_cuda(torch.optim.AdamW(parameters()), dtype=torch.complex64)
    assert not step.eligible(opt, (opt,), {})
    opt = on_cuda(torch.optim.SGD(parameters()), dtype=torch.int64)
    assert not step.eligible(opt, (opt,), {})
    opt = on_cuda(torch.optim.SGD(parameters()), grad=torch.zeros(4, 4).to_sparse())
    assert not step.eligible(opt, (opt,), {})
    opt = on_cuda(torch.optim.SGD(parameters()), grad=torch.zeros(4, 4).t()[:, :2])
    assert not step.eligible(opt, (opt,), {})
    opt = fresh()
    opt.param_groups[0]["params"][2] = parameters()[2]  # one parameter on the host
    assert not step.eligible(opt, (opt,), {})
    opt = torch.optim.AdamW(parameters())  # all on the host: the CPU steps them anyway
    assert not step.eligible(opt, (opt,), {})
    opt = fresh()
    opt.param_groups[0]["params"][1] = CudaParam(index=1)  # one process, two GPUs
    assert not step.eligible(opt, (opt,), {})


def test_eligible_refuses_gradscalers_step_and_an_optimizers_own_hooks():
    """GradScaler sets grad_scale and found_inf on the optimizer (not as arguments) for a
    fused step; an optimizer's own step hooks run after the global pre-hook that would have
    stepped on the host already."""
    opt = on_cuda(torch.optim.AdamW(parameters(), fused=True))
    opt.grad_scale, opt.found_inf = torch.ones(()), torch.zeros(())
    assert not step.eligible(opt, (opt,), {})
    del opt.grad_scale, opt.found_inf
    assert step.eligible(opt, (opt,), {})
    for register in (opt.register_step_pre_hook, opt.register_step_post_hook):
        handle = register(lambda o, a, k: None)
        assert not step.eligible(opt, (opt,), {})
        handle.remove()
        assert step.eligible(opt, (opt,), {})


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.LBFGS(ps),  # its step couples every parameter
    lambda ps: torch.optim.SparseAdam(ps),
    lambda ps: AdamW(ps),  # named as torch's, but the user's class
    lambda ps: MyAdam(ps),
], ids=["LBFGS", "SparseAdam", "users-AdamW", "users-subclass"])
def test_eligible_refuses_other_optimizers(make):
    opt = on_cuda(make(parameters()))
    assert not step.eligible(opt, (opt,), {})


# _chunks


def test_chunks_hold_chunk_bytes_in_order_without_an_empty_one():
    """The real CHUNK (256 MiB) over meta tensors: no memory behind them."""
    mib = 1 << 20

    def of(n_mib: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.empty(n_mib * mib // torch.empty(0, dtype=dtype).element_size(),
                           dtype=dtype, device="meta")

    a, b, c, d, e, f = of(100), of(156, torch.bfloat16), of(1), of(300), of(200), of(56)
    chunks = step._chunks([a, b, c, d, e, f])
    assert [[id(t) for t in chunk] for chunk in chunks] == \
        [[id(a), id(b)], [id(c)], [id(d)], [id(e), id(f)]]  # 100+156 = 256: one chunk


@pytest.mark.parametrize("seed", range(20))
def test_chunks_split_greedily_by_bytes(monkeypatch, seed):
    import random

    monkeypatch.setattr(step, "CHUNK", 4 * step.ALIGN)
    rng = random.Random(seed)  # noqa: S311 - test data
    dtypes = [torch.float32, torch.float16, torch.float64, torch.uint8]
    params = [torch.empty(rng.choice([1, 10, 100, 250, 400, 1200]), dtype=rng.choice(dtypes),
                          device="meta") for _ in range(rng.randint(1, 40))]
    chunks = step._chunks(params)

    def nbytes(chunk: list) -> int:  # slot room: each gradient rounded up to ALIGN
        return sum(-(-p.numel() * p.element_size() // step.ALIGN) * step.ALIGN for p in chunk)

    assert [id(p) for chunk in chunks for p in chunk] == [id(p) for p in params]
    assert all(chunks)  # never an empty one
    for chunk in chunks:
        assert nbytes(chunk) <= step.CHUNK or len(chunk) == 1  # only one past CHUNK alone
    for this, after in itertools.pairwise(chunks):  # each as full as the next one allows
        assert nbytes(this) + nbytes(after[:1]) > step.CHUNK


# the step hooks, on CPU: eligible() and the pool's spilling stood in for


@pytest.fixture
def hooks(monkeypatch):
    """The module's global hooks for this test, a HostStep without CUDA (its step as
    HostStep.step does it, less the streams), and switches for eligible() and _spilling()."""
    switch = SimpleNamespace(eligible=True, spilling=False, host_steps=0, groups_seen=[],
                             early=[])

    def init(self, opt, early=None):
        switch.early.append(early)
        self.opt = opt
        self.step_fn = getattr(type(opt).step, "__wrapped__", type(opt).step)
        self.masters, self.versions, self.fused, self.grads_down = {}, {}, False, None
        self.master_pins, self.slot_pins, self.uploaded = [], [], None

    def host_step_cpu(self):
        switch.host_steps += 1
        switch.groups_seen.append([len(g["params"]) for g in self.opt.param_groups])
        params = [p for g in self.opt.param_groups for p in g["params"] if p.grad is not None]
        for p in params:
            self.masters.setdefault(p, p.detach().clone()).grad = p.grad.detach().clone()
        for chunk in step._chunks(params):
            self._step_on_host(chunk)
        with torch.no_grad():
            for p in params:
                p.copy_(self.masters[p])
                self.masters[p].grad = None

    monkeypatch.setattr(step.HostStep, "__init__", init)
    monkeypatch.setattr(step.HostStep, "step", host_step_cpu)
    monkeypatch.setattr(step, "eligible", lambda opt, args, kwargs: switch.eligible)
    monkeypatch.setattr(managed_grads, "spilling", lambda: switch.spilling)
    monkeypatch.delenv("UMPROV_MANAGED_HOST_STEP", raising=False)
    handles = [register_optimizer_step_pre_hook(step._before_step),
               register_optimizer_step_post_hook(step._after_step)]
    yield switch
    for handle in handles:
        handle.remove()


def watched(opt: torch.optim.Optimizer) -> list:
    """What the device step sees: the parameters of each group, from the optimizer's own
    hooks (they run after the global pre-hook and before the global post-hook)."""
    seen: list = []
    opt.register_step_pre_hook(lambda o, a, k: seen.append(
        ("pre", [len(g["params"]) for g in o.param_groups], [g["lr"] for g in o.param_groups])))
    opt.register_step_post_hook(lambda o, a, k: seen.append(
        ("post", [len(g["params"]) for g in o.param_groups], [g["lr"] for g in o.param_groups])))
    return seen


def train(opt, params, sched, steps, start=0, closure=False):
    for i in range(start, start + steps):
        for p, g in zip(params, grads(i), strict=True):
            p.grad = None if g is None else g.clone()
        if closure:
            opt.step(lambda: None)
        else:
            opt.step()
        sched.step()


def test_a_job_that_does_not_spill_steps_as_written(hooks):
    ref_params, params = parameters(), parameters()
    ref, opt = optimizer("AdamW", ref_params), optimizer("AdamW", params)
    seen = watched(opt)
    train(ref, ref_params, scheduler(ref), 3)
    train(opt, params, scheduler(opt), 3)
    assert hooks.host_steps == 0 and "_umprov_host" not in opt.__dict__
    assert seen[0] == ("pre", [2, 3], [1e-2, 3e-2])  # the device step had every parameter
    for p_ref, p in zip(ref_params, params, strict=True):
        assert torch.equal(p, p_ref)


def test_once_the_pool_spills_the_host_steps_and_the_device_step_sees_no_parameters(hooks):
    ref_params, params = parameters(), parameters()
    ref, opt = optimizer("Adam-amsgrad", ref_params), optimizer("Adam-amsgrad", params)
    groups = opt.param_groups
    group_ids = [id(g) for g in groups]
    train(ref, ref_params, scheduler(ref), 5)  # not spilling: the reference steps as written
    assert hooks.host_steps == 0
    seen = watched(opt)
    hooks.spilling = True
    sched = scheduler(opt)
    train(opt, params, sched, 2)
    assert hooks.host_steps == 2
    assert hooks.groups_seen == [[2, 3], [2, 3]]  # the host step had every parameter
    # the device step's groups are empty, their settings (the scheduled lr) kept
    assert seen == [("pre", [0, 0], [1e-2, 2e-2]), ("post", [0, 0], [1e-2, 2e-2]),
                    ("pre", [0, 0], [1e-2, 2e-2]), ("post", [0, 0], [1e-2, 2e-2])]
    assert opt.param_groups is groups and [id(g) for g in opt.param_groups] == group_ids
    assert "_umprov_groups" not in opt.__dict__
    hooks.spilling = False  # once on the host, it stays there
    train(opt, params, sched, 3, start=2)
    assert hooks.host_steps == 5
    assert seen[-2:] == [("pre", [0, 0], [2.5e-3, 5e-3]), ("post", [0, 0], [2.5e-3, 5e-3])]
    for p_ref, p in zip(ref_params, params, strict=True):
        assert torch.equal(p, p_ref)  # stepped once a step: not again on the "device"
    assert {id(p) for p in opt.state} == {id(p) for p in params}
    assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in ref.param_groups]


def test_a_call_the_host_step_would_change_runs_on_the_device(hooks):
    params = parameters()
    opt = optimizer("SGD-momentum", params)
    seen = watched(opt)
    hooks.spilling = True
    train(opt, params, scheduler(opt), 1)
    assert hooks.host_steps == 1 and "_umprov_host" in opt.__dict__
    hooks.eligible = False  # a closure, say: the device step gets its parameters back
    before = [p.detach().clone() for p in params]
    train(opt, params, scheduler(opt), 1, start=1, closure=True)
    assert hooks.host_steps == 1 and "_umprov_host" not in opt.__dict__  # state went back
    assert seen[-2:] == [("pre", [2, 3], [0.05, 0.1]), ("post", [2, 3], [0.05, 0.1])]
    assert not all(torch.equal(a, b) for a, b in zip(before, params, strict=True))


def test_an_ineligible_optimizer_never_gets_a_host_step(hooks):
    params = parameters()
    opt = optimizer("RMSprop", params)
    hooks.spilling, hooks.eligible = True, False
    seen = watched(opt)
    train(opt, params, scheduler(opt), 2)
    assert hooks.host_steps == 0 and "_umprov_host" not in opt.__dict__
    assert seen[0][1] == [2, 3]


def test_host_step_1_steps_on_the_host_before_anything_spills(hooks, monkeypatch):
    monkeypatch.setenv("UMPROV_MANAGED_HOST_STEP", "1")
    params = parameters()
    opt = optimizer("Adagrad", params)
    train(opt, params, scheduler(opt), 2)
    assert hooks.host_steps == 2


def test_install_registers_the_hooks_once(monkeypatch):
    registered = []
    monkeypatch.setattr(step, "register_optimizer_step_pre_hook",
                        lambda hook: registered.append(("pre", hook)))
    monkeypatch.setattr(step, "register_optimizer_step_post_hook",
                        lambda hook: registered.append(("post", hook)))
    monkeypatch.setattr(step, "_lib", None)
    monkeypatch.setenv("UMPROV_MANAGED_HOST_STEP", "0")
    step.install("lib")
    step.install("lib")
    assert registered == [("pre", step._before_step), ("post", step._after_step)]
    assert step._lib == "lib"


def test_host_step_0_steps_on_the_device(hooks, monkeypatch):
    monkeypatch.setenv("UMPROV_MANAGED_HOST_STEP", "0")
    hooks.spilling = True
    params = [torch.nn.Parameter(torch.zeros(3))]
    opt = torch.optim.SGD(params, lr=0.1)
    params[0].grad = torch.ones(3)
    opt.step()
    assert hooks.host_steps == 0 and "_umprov_host" not in opt.__dict__
    assert torch.equal(params[0].detach(), torch.full((3,), -0.1))


def test_spilling_is_live_bytes_in_the_reservoir_read_at_most_once_a_recheck(monkeypatch):
    live, clock = [0], [100.0]
    monkeypatch.setattr(step._managed(), "spilled", lambda: live[0])
    monkeypatch.setattr(managed_grads, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setattr(managed_grads, "_seen", {"at": -managed_grads.RECHECK, "spilling": False})
    assert not managed_grads.spilling()
    live[0] = 4096
    assert not managed_grads.spilling()  # read a moment ago: not read again yet
    clock[0] += managed_grads.RECHECK
    assert managed_grads.spilling()


def test_masters_are_read_again_where_a_parameter_changed_outside_the_optimizer(monkeypatch):
    """_masters_for: one host block a dtype, the parameters' values, and a parameter changed
    since the last step (a checkpoint loaded into the model) read again."""
    monkeypatch.setattr(pinned_memory, "pinned", lambda numel, dtype, *args, **kwargs: torch.empty(
        numel, dtype=dtype))
    params = parameters()
    half = torch.nn.Parameter(torch.randn(3).half())
    opt = torch.optim.SGD(params + [half], lr=0.1)
    host = host_step(opt, False)
    host.masters = {}
    host._masters_for(params + [half])
    for p in params + [half]:
        assert torch.equal(host.masters[p], p) and host.masters[p].dtype == p.dtype
    storages = {host.masters[p].untyped_storage().data_ptr() for p in params}
    assert len(storages) == 1  # the float32 ones share one block
    host.versions = {p: p._version for p in params + [half]}
    with torch.no_grad():
        params[1].fill_(7.0)  # loaded from a checkpoint
        host.masters[params[0]].add_(1.0)  # stepped on the host, not yet gone up
    stepped = host.masters[params[0]].clone()
    host._masters_for(params + [half])
    assert torch.equal(host.masters[params[1]], torch.full((4,), 7.0))
    assert torch.equal(host.masters[params[0]], stepped)  # unchanged on the device: kept


def test_a_host_view_is_the_same_memory():
    t = torch.arange(6, dtype=torch.float32).view(2, 3)
    view = pinned_memory.host_view(t)
    assert view.shape == t.shape and view.dtype == t.dtype
    view[1, 2] = 42.0
    assert t[1, 2] == 42.0


# gradients down during backward (GradsDown), on CPU: the "mapped" view is the host tensor
# itself, as kernels see pinned mapped memory; streams stood in for


class FakeStream:
    def __init__(self, name: str, log: list) -> None:
        self.name, self.log = name, log

    def wait_stream(self, other: FakeStream) -> None:
        self.log.append((self.name, "waits", other.name))

    def wait_event(self, event: FakeEvent) -> None:
        self.log.append((self.name, "waits for", event.name))


class FakeEvent:
    """torch.cuda.Event on CPU: named by the stream it was recorded on, and when."""

    def __init__(self) -> None:
        self.name = ""

    def record(self, stream: FakeStream) -> None:
        self.name = f"{stream.name} {sum(1 for e in stream.log if e[1] == 'recorded')}"
        stream.log.append((stream.name, "recorded"))

    def __hash__(self) -> int:
        return hash(self.name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FakeStream) and other.name == self.name


@pytest.fixture
def cpu_streams(monkeypatch):
    """torch.cuda's streams as FakeStreams ("user", "down"), what waited on what logged."""
    log: list = []
    user = FakeStream("user", log)
    monkeypatch.setattr(step.torch.cuda, "current_stream", lambda device=None: user)
    monkeypatch.setattr(step.torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(step.torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, s: log.append(("stream use",
                                                                                  s.name)))
    return SimpleNamespace(log=log, down=FakeStream("down", log))


def grads_down(params: list[torch.Tensor], down: FakeStream,
               made: list | None = None) -> managed_grads.GradsDown:
    """GradsDown whose homes are host tensors, their "mapped" view the tensor itself;
    ``made``: the parameters a home was made for."""
    def home(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if made is not None:
            made.append(p)
        host = torch.zeros_like(p)
        return host, host

    return managed_grads.GradsDown(params, down, home)


def test_a_home_is_made_at_a_gradients_first_arrival_on_the_device_only(cpu_streams,
                                                                         monkeypatch):
    """One that backward put in the reservoir is read there by the step: pinning memory for
    it too would hold it twice on the host."""
    made: list = []
    spilled, placed = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))
    monkeypatch.setattr(managed_grads, "in_reservoir", lambda t: t.shape == spilled.shape)
    monkeypatch.setattr(managed_grads.GradsDown, "_reservoir_short", lambda self, device: False)
    down = grads_down([spilled, placed], cpu_streams.down, made)
    assert made == []  # nothing at attach
    for _ in range(2):
        (spilled.sum() + placed.sum()).backward()
        placed.grad = None
        spilled.grad = None
    assert made == [placed] and set(down.alias) == {placed}


def test_host_memory_that_cannot_be_mapped_leaves_gradients_to_the_step(cpu_streams):
    p = torch.nn.Parameter(torch.ones(4))
    down = managed_grads.GradsDown([p], cpu_streams.down, lambda p: None)
    p.sum().backward()
    assert not down.handles and down.host_of(p) is None
    assert torch.equal(p.grad, torch.ones(4)) and not cpu_streams.log


def test_a_gradient_goes_down_as_backward_makes_it_and_grad_becomes_the_host_view(cpu_streams):
    params = [torch.nn.Parameter(torch.randn(3, 2)), torch.nn.Parameter(torch.randn(2))]
    ref = [p.detach().clone().requires_grad_() for p in params]
    down = grads_down(params, cpu_streams.down)
    for ps in (ref, params):
        ((ps[0].sum(0) * ps[1]).square().sum()).backward()
    for p, r in zip(params, ref, strict=True):
        assert p.grad.data_ptr() == down.host[p].data_ptr()  # .grad is the host memory
        assert torch.equal(down.host_of(p), r.grad)
    # each copy after the kernels that made it; the user's stream waits for all at the end
    assert cpu_streams.log.count(("down", "waits", "user")) == 2
    assert cpu_streams.log[-1] == ("user", "waits", "down") and not down.streams


def test_accumulation_adds_into_the_host_view_in_place_and_copies_nothing(cpu_streams):
    p = torch.nn.Parameter(torch.ones(4))
    down = grads_down([p], cpu_streams.down)
    (p * 2.0).sum().backward()
    copies = cpu_streams.log.count(("down", "recorded"))
    (p * 3.0).sum().backward()
    assert torch.equal(down.host_of(p), torch.full((4,), 5.0))
    assert cpu_streams.log.count(("down", "recorded")) == copies == 1
    torch.nn.utils.clip_grad_norm_([p], 1.0)  # code between backward and step: in place
    assert torch.allclose(down.host[p].norm(), torch.tensor(1.0))


def test_copied_gradients_go_back_to_the_pool_behind_their_copies_within_the_lag(
        cpu_streams, monkeypatch):
    """A device gradient is kept until its stream waits for its copy, at most LAG bytes of
    them (not record_stream: as measured, docs/managed-memory.md)."""
    monkeypatch.setattr(managed_grads, "LAG", 2 * 4 * 4)  # two gradients of 4 floats
    params = [torch.nn.Parameter(torch.ones(4)) for _ in range(4)]
    down = grads_down(params, cpu_streams.down)
    seen: list[tuple[int, int]] = []
    for p in params:  # the hook runs first: what it leaves behind is seen by the next ones
        p.register_post_accumulate_grad_hook(
            lambda p: seen.append((len(down.copying), down.copying_bytes)))
    loss = params[0] * 1.0
    for p in params[1:]:
        loss = loss * p
    loss.sum().backward()
    assert all(n <= 2 and nbytes <= managed_grads.LAG for n, nbytes in seen) and max(seen)[0] == 2
    waits = [e for e in cpu_streams.log if e[1] == "waits for"]
    assert waits == [("user", "waits for", "down 0"), ("user", "waits for", "down 1")]
    assert ("stream use", "down") not in cpu_streams.log
    assert not down.copying and down.copying_bytes == 0  # after backward: all let go


@pytest.fixture(autouse=True)
def _no_room_held() -> None:
    """The room held back is the process's (one guard): none at each test's start."""
    managed_grads._held["on"] = False


def room_held() -> bool:
    return managed_grads._held["on"]


def test_room_for_the_first_gradients_is_held_back_from_forward_until_backward(
        cpu_streams, monkeypatch):
    """After a backward that sent gradients down, LAG and the largest gradient are held back
    from the next forward; its backward's first gradient gives them back (run L: with the
    headroom, the first gradients spilled and none of the later ones found a block)."""
    held: list = []
    monkeypatch.setattr(managed_grads, "_managed", lambda: SimpleNamespace(
        hold_back=held.append, in_reservoir=lambda t: False))
    model = torch.nn.Linear(4, 3)
    down = grads_down(list(model.parameters()), cpu_streams.down)
    model(torch.ones(2, 4)).sum().backward()
    assert held[-1] == managed_grads.LAG + model.weight.numel() * 4 and room_held()
    held.clear()
    model.zero_grad(set_to_none=True)
    model(torch.ones(2, 4)).sum().backward()
    assert held[0] == 0  # the first arrival gives it back, the end holds it again
    assert held[-1] == managed_grads.LAG + 12 * 4 and room_held()
    held.clear()
    model(torch.ones(2, 4)).sum().backward()  # accumulating in the host views: nothing new
    assert held == [0] and not room_held()
    model.zero_grad(set_to_none=True)
    model(torch.ones(2, 4)).sum().backward()
    held.clear()
    down.release([])  # as the host step's first step does: the others' gradients only
    down.release([model.bias])
    assert held == [] and room_held()  # the weight still goes down: the room stays held
    down.release()
    assert held == [0] and not room_held()
    down.release()
    assert held == [0]  # given back once


def test_a_gradient_replaced_after_backward_is_not_the_host_ones(cpu_streams):
    p = torch.nn.Parameter(torch.ones(4))
    down = grads_down([p], cpu_streams.down)
    p.sum().backward()
    p.grad = p.grad * 2  # a new tensor: the step must copy it down itself
    assert down.host_of(p) is None
    p.grad = None
    assert down.host_of(p) is None


def test_detached_hooks_leave_gradients_where_backward_puts_them(cpu_streams):
    p = torch.nn.Parameter(torch.ones(4))
    down = grads_down([p], cpu_streams.down)
    down.detach()
    p.sum().backward()
    assert down.host_of(p) is None and not cpu_streams.log


@pytest.fixture
def watching(cpu_streams, monkeypatch):
    """The forward hook install() registers, over CPU modules: homes are host tensors, the
    copy streams FakeStreams; switches for spilling and for what is in the reservoir."""
    switch = SimpleNamespace(spilling=False, in_reservoir=set(), wanted=True, full=False,
                             short=False, room=1 << 40, rooms_read=0)

    def device_room(device: int) -> int:
        switch.rooms_read += 1
        return switch.room

    monkeypatch.setattr(step, "_early", {"hook": None, "grads": None})
    monkeypatch.setattr(step, "_watchable", lambda p: isinstance(p, torch.nn.Parameter)
                        and not torch.nn.parameter.is_lazy(p) and p.requires_grad)
    monkeypatch.setattr(managed_grads, "wanted", lambda: switch.wanted)
    monkeypatch.setattr(managed_grads, "spilling", lambda: switch.spilling)
    monkeypatch.setattr(managed_grads.GradsDown, "_nearly_full", lambda self, device: switch.full)
    monkeypatch.setattr(managed_grads.GradsDown, "_reservoir_short",
                        lambda self, device: switch.short)
    monkeypatch.setattr(managed_grads, "in_reservoir", lambda t: id(t) in switch.in_reservoir)
    monkeypatch.setattr(step, "_managed", lambda: SimpleNamespace(
        copy_streams=lambda device: (cpu_streams.down, FakeStream("up", cpu_streams.log)),
        device_room=device_room))

    def home(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        host = torch.zeros_like(p)
        return host, host

    monkeypatch.setattr(pinned_memory, "pinned_home", home)
    step._early["hook"] = torch.nn.modules.module.register_module_forward_pre_hook(
        step._before_forward)
    yield switch
    step._stop_watching()


def two_layers() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1))


def test_parameters_are_watched_from_the_first_forward_and_nothing_goes_down_unspilled(
        watching):
    model = two_layers()
    with torch.no_grad():
        model(torch.ones(2, 4))  # inference: nothing watched
    assert step._early["grads"] is None and step._early["hook"] is not None
    model(torch.ones(2, 4)).sum().backward()
    early = step._early["grads"]
    assert set(early.handles) == set(model.parameters())
    assert step._early["hook"] is None  # backward has begun: every module was seen
    assert not early.host and all(early.host_of(p) is None for p in model.parameters())


def backward_landing_in_reservoir(watching, model: torch.nn.Module, lands) -> None:
    """One backward of ``model`` in which the gradients of the parameters ``lands`` picks are
    made in the reservoir."""
    real = managed_grads.GradsDown._arrived

    def arrived(self, p):
        if lands(p):
            watching.in_reservoir.add(id(p.grad))
        real(self, p)

    managed_grads.GradsDown._arrived = arrived
    try:
        model(torch.ones(2, 4)).sum().backward()
    finally:
        managed_grads.GradsDown._arrived = real


def test_once_a_gradient_spills_the_next_ones_go_down_in_the_same_backward(watching):
    model = two_layers()
    last_bias = model[1].bias  # the first gradient backward makes
    backward_landing_in_reservoir(watching, model, lambda p: p is last_bias)
    early = step._early["grads"]
    down = {p for p in model.parameters() if early.host_of(p) is not None}
    assert last_bias not in down and down == set(model.parameters()) - {last_bias}
    assert not early.waiting


def test_a_gradient_in_a_reservoir_running_short_goes_down_too(watching):
    """Its block is then free for backward's next spills (run K: 9.25 GiB ran out)."""
    watching.short = True
    model = two_layers()
    backward_landing_in_reservoir(watching, model, lambda p: True)
    early = step._early["grads"]
    assert all(early.host_of(p) is not None for p in model.parameters())


def reading_grads_down(monkeypatch, reading: str, value: int):
    """A GradsDown whose one reading of the pool (``reading``, per device) gives ``value``; the
    devices read, logged; the test's own clock (a busy machine must not pass a recheck)."""
    reads: list[int] = []
    monkeypatch.setattr(managed_grads, "_managed", lambda: SimpleNamespace(
        **{reading: lambda device: reads.append(device) or value}))
    clock = [100.0]
    monkeypatch.setattr(managed_grads, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    return managed_grads.GradsDown([], FakeStream("down", [])), reads, clock


def over_a_recheck(read, recheck: float, reads: list[int], clock: list[float]) -> list:
    """``read`` of GPU 1 now, half ``recheck`` later and past it: each answer with the devices
    read so far."""
    seen = []
    for later in (0.0, recheck / 2, recheck):
        clock[0] += later
        seen.append((read(torch.device("cuda", 1)), list(reads)))
    return seen


@pytest.mark.parametrize(("room", "short"), [(1 << 30, True), (3 << 30, False)])
def test_reservoir_short_is_under_2_gib_free_read_now_and_then_held_between(monkeypatch, room,
                                                                            short):
    down, reads, clock = reading_grads_down(monkeypatch, "reservoir_room", room)
    assert over_a_recheck(down._reservoir_short, managed_grads.RESERVOIR_RECHECK, reads,
                          clock) == [(short, [1]), (short, [1]), (short, [1, 1])]  # it holds


def test_a_job_seen_spilling_sends_every_gradient_down_from_the_first_backward(watching):
    watching.spilling = True  # activations spilled in forward
    model = two_layers()
    model(torch.ones(2, 4)).sum().backward()
    early = step._early["grads"]
    assert all(early.host_of(p) is not None for p in model.parameters())


def test_a_gpu_nearly_full_sends_gradients_down_before_any_spills(watching):
    watching.full = True  # forward's activations took what the device had
    model = two_layers()
    model(torch.ones(2, 4)).sum().backward()
    early = step._early["grads"]
    assert all(early.host_of(p) is not None for p in model.parameters())


@pytest.mark.parametrize(("room", "total", "full"), [
    (1 << 30, 80 << 30, True), (3 << 30, 80 << 30, True), (5 << 30, 80 << 30, False),
    (1 << 30, 16 << 30, True), (3 << 30, 16 << 30, False)])
def test_nearly_full_is_under_2_gib_or_a_twentieth_of_the_gpu_of_room_read_now_and_then(
        monkeypatch, room, total, full):
    monkeypatch.setattr(step.torch.cuda, "get_device_properties",
                        lambda device: SimpleNamespace(total_memory=total))
    down, reads, clock = reading_grads_down(monkeypatch, "device_room", room)
    assert over_a_recheck(down._nearly_full, managed_grads.ROOM_RECHECK, reads, clock) == [
        (full, [1]), (False, [1]), (full, [1, 1])]  # not read again within ROOM_RECHECK


def test_the_first_step_hands_the_watched_parameters_to_its_host_step(watching, hooks):
    model = two_layers()
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, 4)).sum().backward()
    early = step._early["grads"]
    hooks.spilling = True
    opt.step()
    assert hooks.early == [early] and step._early["grads"] is None


def test_a_first_step_without_a_host_step_lets_the_watched_parameters_go(watching, hooks):
    model = two_layers()
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, 4)).sum().backward()
    early = step._early["grads"]
    opt.step()  # not spilling: the device step, as written
    assert hooks.early == [] and not early.handles and step._early["grads"] is None


@pytest.mark.parametrize(("room", "host_step"), [(10 << 30, False), (100, True)])
def test_gradients_down_without_a_spill_step_on_the_host_where_the_state_has_no_room(
        watching, hooks, room, host_step):
    """Nothing spilled because gradients went down: the first step is the host's where the
    optimizer's new state would not fit in the device's room (it would spill instead)."""
    watching.full, watching.room = True, room
    model = two_layers()
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, 4)).sum().backward()
    opt.step()  # hooks.spilling: False
    assert (hooks.host_steps == 1) is host_step and watching.rooms_read == 1


def test_what_a_first_device_step_would_make_is_what_has_to_fit(monkeypatch):
    """Its state, the unfused step's temporaries and the gradients that come back from the
    host: 4-float parameters, 16 bytes each."""
    rooms: list[int] = []
    monkeypatch.setattr(step, "_managed", lambda: SimpleNamespace(
        device_room=lambda device: rooms[-1]))
    p, q = torch.nn.Parameter(torch.ones(4)), torch.nn.Parameter(torch.ones(4))
    p.grad, q.grad = torch.ones(4), None  # q has no gradient: no state this step
    nothing_down = SimpleNamespace(host_of=lambda p: None)
    p_down = SimpleNamespace(host_of=lambda t: t if t is p else None)
    for opt, early, need in (
            (torch.optim.AdamW([p, q]), nothing_down, 48),  # 2 moments + 1 temporary
            (torch.optim.AdamW([p, q], fused=True), nothing_down, 32),
            (torch.optim.AdamW([p, q]), p_down, 64),  # and p's gradient back from the host
            (torch.optim.SGD([p, q], lr=0.1, momentum=0.9), nothing_down, 32),
            (torch.optim.Adadelta([p, q]), nothing_down, 64)):
        rooms.append(need - 1)
        assert step._state_would_spill(opt, early), (opt, need)
        rooms.append(need)
        assert not step._state_would_spill(opt, early), (opt, need)
    rooms.append(0)
    assert not step._state_would_spill(torch.optim.SGD([p], lr=0.1), nothing_down)  # no state
    adam = torch.optim.AdamW([p])
    adam.step()
    assert not step._state_would_spill(adam, nothing_down)  # made already


@pytest.mark.parametrize(("kind", "group", "copies"), [
    ("SGD", {"momentum": 0}, 0), ("SGD", {"momentum": 0.9}, 1), ("Adam", {}, 2),
    ("AdamW", {"amsgrad": True}, 3), ("RMSprop", {"momentum": 0.9, "centered": True}, 3),
    ("RMSprop", {"momentum": 0, "centered": False}, 1), ("Adagrad", {}, 1),
    ("Adadelta", {}, 2), ("NAdam", {}, 2)])
def test_state_copies_are_the_tensors_each_kind_keeps_per_parameter(kind, group, copies):
    assert step._state_copies(kind, group) == copies


def test_gradients_sent_down_come_back_to_the_device_for_a_device_step(watching, hooks):
    """The GPU was nearly full in backward, yet nothing spilled: the step is the device's, and
    it (and a zero_grad that keeps tensors) gets device gradients, not host views."""
    watching.full = True
    model, ref = two_layers(), two_layers()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for m in (model, ref):
        m(torch.ones(2, 4)).sum().backward()
    early = step._early["grads"]
    views = {p: p.grad for p in model.parameters()}
    assert all(early.host_of(p) is not None for p in model.parameters())
    opt.step()
    for p, r in zip(model.parameters(), ref.parameters(), strict=True):
        assert p.grad.data_ptr() != views[p].data_ptr() and early.host_of(p) is None
        assert torch.allclose(p.detach(), r.detach() - 0.1 * r.grad)


def test_each_optimizer_keeps_its_own_parameters_and_the_others_come_back(watching,
                                                                         monkeypatch):
    """Two models, two optimizers (a GAN): the first optimizer's host step keeps only its own
    parameters' gradients going down; the other model's come back to the device."""
    watching.full = True
    monkeypatch.setattr(step, "_get_fused_kernels_supported_devices", lambda: [])
    gen, disc = two_layers(), two_layers()
    (gen(torch.ones(2, 4)).sum() + disc(torch.ones(2, 4)).sum()).backward()
    early = step._take_early()
    assert set(early.handles) == {*gen.parameters(), *disc.parameters()}
    host = step.HostStep(torch.optim.AdamW(disc.parameters()), early)
    assert host.grads_down is early and not early.waiting
    assert set(early.handles) == set(disc.parameters())
    for p in gen.parameters():
        assert early.host_of(p) is None and p.grad is not None  # a copy of its own
    assert all(early.host_of(p) is not None for p in disc.parameters())


def test_lazy_modules_and_functional_calls_are_not_watched(watching):
    lazy = torch.nn.Sequential(torch.nn.LazyLinear(3), torch.nn.Linear(3, 1))
    lazy(torch.ones(2, 4)).sum().backward()  # its first forward makes its weight
    early = step._early["grads"]
    assert set(early.handles) == {lazy[1].weight, lazy[1].bias}
    model = two_layers()
    params = {k: v.detach().clone().requires_grad_() for k, v in model.named_parameters()}
    for _ in range(3):
        torch.func.functional_call(model, params, (torch.ones(2, 4),)).sum().backward()
    assert set(early.handles) == {lazy[1].weight, lazy[1].bias}


def test_a_gradient_larger_than_the_lag_still_overlaps_backward(cpu_streams, monkeypatch):
    """Its stream does not wait for its copy at once: it is let go when the next one comes."""
    monkeypatch.setattr(managed_grads, "LAG", 4)  # bytes: every gradient here is larger
    params = [torch.nn.Parameter(torch.ones(4)) for _ in range(3)]
    down = grads_down(params, cpu_streams.down)
    seen: list[int] = []
    for p in params:
        p.register_post_accumulate_grad_hook(lambda p: seen.append(len(down.copying)))
    (params[0] * params[1] * params[2]).sum().backward()
    assert seen == [1, 1, 1]


def test_distributed_started_after_the_first_forward_keeps_gradients_where_they_are(watching):
    model = two_layers()
    loss = model(torch.ones(2, 4)).sum()
    watching.full, watching.wanted = True, False  # init_process_group between the two
    loss.backward()
    early = step._early["grads"]
    assert all(early.host_of(p) is None for p in model.parameters())


def test_without_gradients_down_the_forward_hook_goes_at_once(watching):
    watching.wanted = False
    model = two_layers()
    model(torch.ones(2, 4)).sum().backward()
    assert step._early["hook"] is None and step._early["grads"] is None


def test_grads_go_down_unless_switched_off_and_never_distributed(monkeypatch):
    monkeypatch.delenv("UMPROV_MANAGED_GRADS_DOWN", raising=False)
    monkeypatch.setattr(step.torch.distributed, "is_initialized", lambda: False)
    assert managed_grads.wanted()  # the default since run J: at torchao's step
    monkeypatch.setenv("UMPROV_MANAGED_GRADS_DOWN", "0")
    assert not managed_grads.wanted()
    monkeypatch.setenv("UMPROV_MANAGED_GRADS_DOWN", "1")
    assert managed_grads.wanted()
    monkeypatch.setattr(step.torch.distributed, "is_initialized", lambda: True)
    assert not managed_grads.wanted()


@pytest.fixture
def page_locks(monkeypatch):
    """A stand-in CUDA runtime that counts page-locked addresses."""
    locked: dict[int, int] = {}

    def register(pointer, nbytes, flags) -> int:  # noqa: ANN001 - ctypes values
        locked[pointer.value] = nbytes.value
        return 0

    def unregister(pointer) -> int:  # noqa: ANN001
        assert locked.pop(pointer.value, None) is not None, "unlocked twice, or never locked"
        return 0

    runtime = SimpleNamespace(cudaHostRegister=register, cudaHostUnregister=unregister,
                              cudaHostGetDevicePointer=lambda *a: 1)  # not mapped: an error
    monkeypatch.setattr(pinned_memory, "_cudart", lambda: runtime)
    return locked


def test_host_memory_is_unlocked_when_a_host_step_is_left_or_its_slots_replaced(page_locks):
    params = parameters()
    host = host_step(torch.optim.SGD(params, lr=0.1), False)
    host.masters, host.slots, host.grads_down = {}, [], None
    host._masters_for(params)
    assert len(page_locks) == 1  # one block a dtype
    host._size_slots(params)
    assert len(page_locks) == 1 + step.SLOTS
    first = {s.data_ptr() for s in host.slots}
    host._size_slots(params)  # big enough: kept
    assert {s.data_ptr() for s in host.slots} == first
    big = [torch.nn.Parameter(torch.empty(step.CHUNK // 4 + 1))]
    host._masters_for(big)  # a parameter stepped for the first time: its master after the slots
    host._size_slots(big)  # larger slots: the old ones unlocked, every master kept
    assert len(page_locks) == 2 + step.SLOTS and not first & set(page_locks)
    assert all(any(at <= m.data_ptr() < at + n for at, n in page_locks.items())
               for m in host.masters.values())
    host.leave = step.HostStep.leave.__get__(host)
    host.state_to_device = lambda: None
    host.leave()
    assert page_locks == {}


def test_host_memory_not_mapped_for_the_gpu_is_unlocked_at_once(page_locks):
    pins: list = []
    flat = pinned_memory.pinned(1024, torch.float32, torch.device("cuda", 0), pins=pins, mapped=True)
    assert len(page_locks) == 1 and len(pins) == 1
    assert pinned_memory.device_view(flat, torch.device("cuda", 0), pins) is None
    assert page_locks == {}
    owner = type("Owner", (), {})()
    pinned_memory.pinned(16, torch.float32, torch.device("cuda", 0), owner)
    assert len(page_locks) == 1
    del owner  # with its owner
    assert page_locks == {}


def test_a_pinned_home_the_gpu_cannot_address_is_none_and_unlocked_at_once(page_locks):
    assert pinned_memory.pinned_home(torch.nn.Parameter(torch.ones(8))) is None
    assert page_locks == {}


def test_locked_host_memory_has_whole_pages_of_its_own(page_locks):
    """Small tensors share pages with their neighbours, and a page cannot be locked twice."""
    owner = type("Owner", (), {})()
    flats = [pinned_memory.pinned(3, torch.float32, torch.device("cuda", 0), owner) for _ in range(4)]
    assert len(page_locks) == 4
    assert all(at % pinned_memory.PAGE == 0 and n % pinned_memory.PAGE == 0 for at, n in page_locks.items())
    pages = sorted(page_locks.items())
    assert all(a + n <= b for (a, n), (b, _) in zip(pages, pages[1:], strict=False))
    assert all(f.numel() == 3 and f.data_ptr() in page_locks for f in flats)


def test_host_memory_is_touched_by_torchs_threads_before_it_is_locked(page_locks, monkeypatch):
    """cudaHostRegister would fault each missing page in by itself, in one thread."""
    seen: list[bytes] = []
    real_empty, real_register = torch.empty, pinned_memory._cudart().cudaHostRegister

    def dirty_empty(*args, **kwargs):  # what the allocator hands out may hold old bytes
        return real_empty(*args, **kwargs).fill_(0xAB)

    def register(pointer, nbytes, flags) -> int:  # noqa: ANN001 - ctypes values
        seen.append(ctypes.string_at(pointer.value, nbytes.value))
        return real_register(pointer, nbytes, flags)

    monkeypatch.setattr(torch, "empty", dirty_empty)
    monkeypatch.setattr(pinned_memory._cudart(), "cudaHostRegister", register)
    owner = type("Owner", (), {})()
    flat = pinned_memory.pinned(5000, torch.float32, torch.device("cuda", 0), owner)
    assert len(seen) == 1 and len(seen[0]) % pinned_memory.PAGE == 0
    assert seen[0] == bytes(len(seen[0])) and not flat.any()
