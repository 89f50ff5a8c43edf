"""``managed.oversubscription``: a training step whose working set is many times the device
memory it may use, under umprov's managed-memory allocator (the image's ``umprov_managed``).

One child per GPU, in full mode, started with the others on the parent's guess of the GPU
count. Once torch, its optimizer and the CUDA context are up it builds the model and takes
the first step (the warm-up: allocations, host pages, cuBLAS, the optimizer's state), holding
the host-link lock and this GPU's lock, as every timed check of the other children does: it
runs between their timed windows, never in one. Then it waits at a gate the parent opens when
that GPU's per-GPU child has finished (no other child of the agent times anything on the GPU
meanwhile) and times the remaining steps; the gate file carries that child's pinned
host-to-device rate, the PCIe floor's denominator.

PyTorch's own device memory is capped at BUDGET bytes, its reservoir of managed memory on the
host behind it; the model is SHARDS identical linear layers trained with Adam, weights,
gradients and both moments OVERSUB times the budget, so the first layers' weights sit on the
GPU and the rest of the working set on the host, read and written over PCIe. Every layer
starts equal and sees the same data, so after the steps every layer must be bit-identical
whether its memory was on the GPU or the host.

Safety: the budget caps device memory; the managed memory asked for (the reservoir) is never
more than the GPU has free (managed oversubscription of a shared GPU can hang it) nor more
than half of the host's available memory. Nothing here runs where ``umprov_managed`` is
missing (NGC and other images): the check is skipped, saying so.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import time
from typing import Any

from .early_context import start_early_context
from .profiles import select_profile
from .runner import Emitter, HostLinkLock, MiB, device_lock, out_of_memory, wait_for_gate
from .schema import record

CHECK = "managed.oversubscription"
BUDGET = 64 * MiB  # device bytes the allocator may place the step's tensors in
SHARDS = 8  # identical layers; the first ones fit the budget, the others spill
OVERSUB = 8  # working set (weights, gradients, two Adam moments) / budget
RESERVOIR_X = 2  # the reservoir of managed memory behind the budget / the working set
STEPS = 3  # the first warms up (allocations, host pages); the others are timed
BATCH = 64
HEADROOM = 512 * MiB  # device memory left free beside the managed buffers (CUDA context)


def gate_path(workdir: str, dev: int) -> str:
    return os.path.join(workdir, f"oversub{dev}.gate")


def open_oversub_gate(path: str, h2d_gbps: float | None) -> None:
    """Open the gate, with the pinned rate the per-GPU child measured (None: none)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump({"h2d_gbps": h2d_gbps}, fh)
    os.replace(tmp, path)


def host_available() -> int | None:
    """MemAvailable in bytes (None where /proc/meminfo does not say)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def ruled_out(managed: Any) -> str | None:
    """Why the container's allocator settings leave the pool off, or None; an image made
    before ``ruled_out`` knows only the cudaMallocAsync backend."""
    if hasattr(managed, "ruled_out"):
        return managed.ruled_out()
    setting = getattr(managed, "async_backend", lambda: None)()
    return setting and f"{setting} selects CUDA's own pool allocator, which takes no pool"


def layer_size(budget: int) -> int:
    """The side of each square fp32 layer: SHARDS layers of 4 tensors each (weight, gradient,
    two moments) make OVERSUB x ``budget``; a multiple of 256 for cuBLAS."""
    per_tensor = OVERSUB * budget / (SHARDS * 4)
    return max(256, int(math.sqrt(per_tensor / 4)) // 256 * 256)


def pool_present() -> bool:
    """Whether ``umprov_managed`` can be imported, without importing it (nor torch)."""
    return "umprov_managed" in sys.modules or importlib.util.find_spec("umprov_managed") is not None


def child_oversub(em: Emitter, opts: dict, dev: int) -> None:
    em.start(CHECK, f"gpu{dev}")
    # no context made for an image without the pool: the check skips there
    early = start_early_context(dev, opts.get("cuda_gate")) if pool_present() else None
    import torch

    target = f"gpu{dev}"
    try:
        import umprov_managed
    except ImportError:
        em.record(record("gpu", target, CHECK, "skip", detail="skipped: umprov's managed-memory "
                         "allocator (umprov_managed) is not in this image; umprov's own image "
                         "carries it (docs/managed-memory.md)"))
        em.done()
        return
    wait_for_gate(em, opts.get("cuda_gate"))
    if early is not None:
        early.join()
    em.event("mark", what="cuda init")
    budget = int(opts.get("oversub_budget_mib") or BUDGET // MiB) * MiB
    why = ruled_out(umprov_managed)
    if why:  # the pool's one guard worth checking on every host: jobs here run without it
        em.record(record("gpu", target, CHECK, "warn", hint="investigate", detail=(
            f"this container's allocator setting leaves umprov's managed-memory pool off: "
            f"{why}; jobs here meet out-of-memory where the pool would run them: change the "
            "setting, or leave the pool off")))
        em.done()
        return
    # the GPU's kernels over spilled memory, the path this check times against PCIe: the
    # optimizer's host step (umprov_managed_step) is the CPU's and bench/managed_peers.py's
    os.environ["UMPROV_MANAGED_HOST_STEP"] = "0"
    os.environ["UMPROV_MANAGED_GRADS_DOWN"] = "0"  # nor gradients down: the GPU's path alone
    if dev >= torch.cuda.device_count():  # started on a guess that was too high
        em.event("absent", device=dev)
        em.done()
        return
    torch.cuda.set_device(dev)
    torch.cuda.init()
    name = torch.cuda.get_device_name(dev)
    gate = gate_path(os.path.dirname(opts["lock"]), dev)
    profile = select_profile(opts["profiles"], name, opts.get("forced"))
    n = layer_size(budget)
    working = SHARDS * 4 * n * n * 4
    # Free memory now, before the managed memory is asked for (the other children hold theirs).
    why = _no_room(torch, dev, RESERVOIR_X * working)
    if why:
        em.record(record("gpu", target, CHECK, "skip", detail=f"skipped: {why}"))
        em.done()
        return
    # PyTorch's own memory capped at the budget; past it, this GPU's reservoir
    umprov_managed.enable(budget=budget, reservoir=RESERVOIR_X * working)
    locks = (opts.get("lock"), device_lock(opts, dev))
    try:
        em.event("mark", what="oversubscription warm-up step")
        with HostLinkLock(locks[0]), HostLinkLock(locks[1]):  # between others' timed windows
            training = Training(torch, torch.device("cuda", dev), n)
            training.step()
        wait_for_gate(em, gate, float(opts.get("timeout") or 300))
        em.start(CHECK, target)
        with HostLinkLock(locks[0]), HostLinkLock(locks[1]):
            for _ in range(STEPS - 1):
                training.step()
        result = training.result()
    except Exception as exc:
        if not out_of_memory(exc):
            raise
        em.record(record("gpu", target, CHECK, "fail", hint="investigate", reason="error",
                         detail=f"out of memory under the managed allocator with a "
                         f"{working // MiB} MiB working set: {str(exc).splitlines()[0][:200]}"))
        em.done()
        return
    h2d = _gate_rate(gate)
    stats = umprov_managed.stats()
    if h2d is None:
        h2d = profile.get("expect", {}).get("h2d_gbps")
    em.record(judge_oversub(target, result, stats, h2d, profile, budget, working))
    em.facts(**{f"oversub_gpu{dev}": {"layer": n, "shards": SHARDS, "steps": STEPS,
                                       "h2d_gbps": h2d, **stats, **result}})
    em.done()


def _gate_rate(path: str) -> float | None:
    try:
        with open(path) as fh:
            rate = json.load(fh).get("h2d_gbps")
        return float(rate) if rate else None
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def _no_room(torch: Any, dev: int, reservoir: int) -> str | None:
    """Why the step must not run here (None: it may)."""
    free = torch.cuda.mem_get_info(dev)[0]
    if free < reservoir + HEADROOM:
        return (f"the {reservoir // MiB} MiB of managed memory it asks for, with "
                f"{HEADROOM // MiB} MiB to spare, exceed the {free // MiB} MiB free on this GPU")
    avail = host_available()
    if avail is not None and 2 * reservoir > avail:
        return (f"the host has {avail // MiB} MiB available, less than twice the "
                f"{reservoir // MiB} MiB reservoir")
    return None


class ForeachAdam:
    """Adam as ``torch.optim.Adam`` runs it on CUDA by default (its multi-tensor path, no
    weight decay): the same foreach kernels over the same bytes, its state made at the first
    step as torch makes it (so the same tensors spill). Written out because torch.optim's
    first step imports torch's compiler stack, a second on the full run's longest path."""

    def __init__(self, torch: Any, params: list, lr: float, betas: tuple = (0.9, 0.999),
                 eps: float = 1e-8) -> None:
        self.torch, self.params, self.lr, self.betas, self.eps = torch, params, lr, betas, eps
        self.steps = 0
        self.exp_avgs: list = []
        self.exp_avg_sqs: list = []

    def step(self) -> None:
        torch, (beta1, beta2) = self.torch, self.betas
        with torch.no_grad():
            params = [p for p in self.params if p.grad is not None]
            grads = [p.grad for p in params]
            if not self.exp_avgs:  # a parameter's two moments together, as torch makes them
                for p in params:
                    self.exp_avgs.append(torch.zeros_like(p))
                    self.exp_avg_sqs.append(torch.zeros_like(p))
            self.steps += 1
            torch._foreach_lerp_(self.exp_avgs, grads, 1 - beta1)
            torch._foreach_mul_(self.exp_avg_sqs, beta2)
            torch._foreach_addcmul_(self.exp_avg_sqs, grads, grads, 1 - beta2)
            denom = torch._foreach_sqrt(self.exp_avg_sqs)
            torch._foreach_div_(denom, (1 - beta2 ** self.steps) ** 0.5)
            torch._foreach_add_(denom, self.eps)
            torch._foreach_addcdiv_(params, self.exp_avgs, denom,
                                    -self.lr / (1 - beta1 ** self.steps))

    def zero_grad(self) -> None:
        """Gradients zeroed in place, not set to None: the next backward reuses their memory."""
        grads = [p.grad for p in self.params if p.grad is not None]
        if grads:
            self.torch._foreach_zero_(grads)


class Training:
    """Adam over SHARDS identical layers: built, then stepped; the first step (the warm-up) is
    reported, the others timed."""

    def __init__(self, torch: Any, device: Any, n: int) -> None:
        self.torch = torch
        gen = torch.Generator(device=device).manual_seed(2024)
        first = torch.randn(n, n, device=device, generator=gen) / math.sqrt(n)
        weights = [first] + [first.clone() for _ in range(SHARDS - 1)]
        self.params = [torch.nn.Parameter(w) for w in weights]
        self.x = torch.randn(BATCH, n, device=device, generator=gen)
        self.opt = ForeachAdam(torch, self.params, lr=1e-3)
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.times: list[float] = []
        self.losses: list[float] = []

    def step(self) -> None:
        self.sync()
        t0 = time.perf_counter()
        loss = sum((self.x @ p).tanh().square().mean() for p in self.params)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        self.sync()
        self.times.append(time.perf_counter() - t0)
        self.losses.append(float(loss.item()))

    def result(self) -> dict:
        """Seconds of the timed steps (all after the first), and whether every layer ended
        bit-identical to the first."""
        params = self.params
        differ = sum(0 if self.torch.equal(p, params[0]) else 1 for p in params[1:])
        timed = self.times[1:]
        return {"step_s": round(sum(timed) / len(timed), 4),
                "first_step_s": round(self.times[0], 4), "layers_differing": differ,
                "loss_first": self.losses[0], "loss_last": self.losses[-1]}


def _train(torch: Any, device: Any, n: int) -> dict:
    """STEPS Adam steps over SHARDS identical layers, one after another (the CPU test's way;
    the child takes the first before its gate and the others after it)."""
    training = Training(torch, device, n)
    for _ in range(STEPS):
        training.step()
    return training.result()


def judge_oversub(target: str, result: dict, stats: dict, h2d: float | None, profile: dict,
                  budget: int, working: int) -> dict:
    """The record: fail when the layers differ or the step is far off the PCIe floor (2 x the
    bytes spilled to the host over the pinned rate), warn past the warn limit."""
    limits = profile.get("limits", {})
    warn_at = limits.get("managed_oversub_floor_ratio_warn", 3.0)
    fail_at = limits.get("managed_oversub_floor_ratio_fail", 10.0)
    spilled = int(stats.get("peak_spilled") or 0)
    step = result["step_s"]
    head = (f"{working // MiB} MiB working set (Adam, {SHARDS} layers) on a "
            f"{budget // MiB} MiB device budget: {spilled // MiB} MiB on the host; "
            f"{step * 1000:.0f} ms a step")
    if result["layers_differing"]:
        return record("gpu", target, CHECK, "fail", measured=result["layers_differing"],
                      unit="layers differing", limit=0, hint="isolate",
                      detail=f"{head}; layers on the host and on the GPU ended different")
    if not spilled or not h2d:
        return record("gpu", target, CHECK, "pass", measured=round(step, 4), unit="s",
                      detail=f"{head}; no PCIe floor to compare with")
    floor = 2 * spilled / (h2d * 1e9)
    ratio = step / floor
    verdict = "fail" if ratio > fail_at else "warn" if ratio > warn_at else "pass"
    why = "" if verdict == "pass" else f"; above {warn_at:g}x the floor"
    return record("gpu", target, CHECK, verdict, measured=round(ratio, 3), unit="x",
                  limit=warn_at, hint="reseat",
                  detail=f"{head}, floor {floor * 1000:.0f} ms (2 x spilled at "
                  f"{h2d:.1f} GB/s pinned); the same layers bit-identical on host and "
                  f"GPU{why}")

