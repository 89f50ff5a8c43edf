"""``managed.oversubscription``: a training step whose working set is many times the device
memory it may use, under umprov's managed-memory allocator (the image's ``umprov_managed``).

One child per GPU, in full mode. It imports torch with the others, then waits at a gate the
parent opens when that GPU's per-GPU child has ended (no other child of the agent times
anything on the GPU meanwhile); the gate file carries that child's pinned host-to-device rate,
the PCIe floor's denominator.

The allocator gets a device budget of BUDGET bytes; the model is SHARDS identical linear
layers trained with Adam, weights, gradients and both moments OVERSUB times the budget, so
the first layers' weights sit on the GPU and the rest of the working set on the host, read and
written over PCIe. Every layer starts equal and sees the same data, so after the steps every
layer must be bit-identical whether its memory was on the GPU or the host.

Safety: the budget caps device placement; the managed memory asked for in all is never more
than the GPU has free (managed oversubscription of a shared GPU can hang it) nor more than half
of the host's available memory. Nothing here runs where ``umprov_managed`` is missing (NGC and
other images): the check is skipped, saying so.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

from .profiles import select_profile
from .runner import Emitter, HostLinkLock, MiB, device_lock, out_of_memory, wait_for_gate
from .schema import record

CHECK = "managed.oversubscription"
BUDGET = 64 * MiB  # device bytes the allocator may place the step's tensors in
SHARDS = 8  # identical layers; the first ones fit the budget, the others spill
OVERSUB = 8  # working set (weights, gradients, two Adam moments) / budget
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


def layer_size(budget: int) -> int:
    """The side of each square fp32 layer: SHARDS layers of 4 tensors each (weight, gradient,
    two moments) make OVERSUB x ``budget``; a multiple of 256 for cuBLAS."""
    per_tensor = OVERSUB * budget / (SHARDS * 4)
    return max(256, int(math.sqrt(per_tensor / 4)) // 256 * 256)


def child_oversub(em: Emitter, opts: dict, dev: int) -> None:
    em.start(CHECK, f"gpu{dev}")
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
    # Before the gate, nothing that runs on the GPU: torch.optim's first step imports
    # torch's compiler stack (a second), and a CUDA context costs memory, not GPU time.
    em.event("mark", what="import torch.optim")
    import torch._dynamo  # noqa: F401
    import torch.optim  # noqa: F401

    wait_for_gate(em, opts.get("cuda_gate"))
    em.event("mark", what="cuda init")
    budget = int(opts.get("oversub_budget_mib") or BUDGET // MiB) * MiB
    setting = getattr(umprov_managed, "async_backend", lambda: None)()
    if setting:  # the pool's one guard worth checking on every host: jobs here run without it
        em.record(record("gpu", target, CHECK, "warn", hint="investigate", detail=(
            f"{setting} in this container leaves umprov's managed-memory pool off (CUDA's own "
            "pool allocator takes no memory pool): jobs here meet out-of-memory where the "
            "pool would run them; unset it, or leave the pool off")))
        em.done()
        return
    # the GPU's kernels over spilled memory, the path this check times against PCIe: the
    # optimizer's host step (umprov_managed_step) is the CPU's and bench/managed_peers.py's
    os.environ["UMPROV_MANAGED_HOST_STEP"] = "0"
    umprov_managed.enable(budget=budget, reserve=0)
    torch.cuda.set_device(dev)
    torch.cuda.init()
    name = torch.cuda.get_device_name(dev)
    gate = gate_path(os.path.dirname(opts["lock"]), dev)
    wait_for_gate(em, gate, float(opts.get("timeout") or 300))
    h2d = _gate_rate(gate)
    profile = select_profile(opts["profiles"], name, opts.get("forced"))
    n = layer_size(budget)
    working = SHARDS * 4 * n * n * 4
    why = _no_room(torch, dev, working)
    em.start(CHECK, target)
    if why:
        em.record(record("gpu", target, CHECK, "skip", detail=f"skipped: {why}"))
        em.done()
        return
    try:
        with HostLinkLock(opts.get("lock")), HostLinkLock(device_lock(opts, dev)):
            result = _train(torch, torch.device("cuda", dev), n)
    except Exception as exc:
        if not out_of_memory(exc):
            raise
        em.record(record("gpu", target, CHECK, "fail", hint="investigate", reason="error",
                         detail=f"out of memory under the managed allocator with a "
                         f"{working // MiB} MiB working set: {str(exc).splitlines()[0][:200]}"))
        em.done()
        return
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


def _no_room(torch: Any, dev: int, working: int) -> str | None:
    """Why the step must not run here (None: it may)."""
    free = torch.cuda.mem_get_info(dev)[0]
    if free < working + HEADROOM:
        return (f"the {working // MiB} MiB of managed memory it asks for, with "
                f"{HEADROOM // MiB} MiB to spare, exceed the {free // MiB} MiB free on this GPU")
    avail = host_available()
    if avail is not None and 2 * working > avail:
        return (f"the host has {avail // MiB} MiB available, less than twice the "
                f"{working // MiB} MiB working set")
    return None


def _train(torch: Any, device: Any, n: int) -> dict:
    """STEPS Adam steps over SHARDS identical layers; seconds of the timed steps, and whether
    every layer ended bit-identical to the first."""
    gen = torch.Generator(device=device).manual_seed(2024)
    first = torch.randn(n, n, device=device, generator=gen) / math.sqrt(n)
    weights = [first] + [first.clone() for _ in range(SHARDS - 1)]
    params = [torch.nn.Parameter(w) for w in weights]
    x = torch.randn(BATCH, n, device=device, generator=gen)
    opt = torch.optim.Adam(params, lr=1e-3)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = []
    losses = []
    for _ in range(STEPS):
        sync()
        t0 = time.perf_counter()
        loss = sum((x @ p).tanh().square().mean() for p in params)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        sync()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss.item()))
    differ = sum(0 if torch.equal(p, params[0]) else 1 for p in params[1:])
    timed = times[1:]
    return {"step_s": round(sum(timed) / len(timed), 4), "first_step_s": round(times[0], 4),
            "layers_differing": differ, "loss_first": losses[0], "loss_last": losses[-1]}


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

