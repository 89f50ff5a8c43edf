"""What PyTorch users do, on umprov's pool (run as a script by test_managed_compat_gpu.py).

    python managed_cases.py CASE [ARG]     # prints one JSON line: the case's facts

UMPROV_MANAGED_MEMORY=1 and the allocator's folder on PYTHONPATH switch the pool on at torch's
import, as in umprov's image; the same cases run without it for the baseline.
"""

from __future__ import annotations

import json
import os
import sys

import umprov_managed

umprov_managed.after_torch_import()

import torch  # noqa: E402

DEV = torch.device("cuda")


def model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(),
                               torch.nn.Linear(1024, 512)).to(DEV)


def batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator(device="cpu").manual_seed(1)
    return [(torch.randn(64, 512, generator=gen).to(DEV), torch.randn(64, 512, generator=gen)
             .to(DEV)) for _ in range(n)]


def train(m: torch.nn.Module, opt: torch.optim.Optimizer, data: list, *, accumulate: int = 1,
          sched: object = None) -> list[float]:
    losses = []
    for i, (x, y) in enumerate(data):
        loss = torch.nn.functional.mse_loss(m(x), y) / accumulate
        loss.backward()
        if (i + 1) % accumulate == 0:
            torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
            opt.step()
            opt.zero_grad()
            if sched is not None:
                sched.step()
        losses.append(float(loss))
    return losses


def case_stats() -> dict:
    x = torch.empty(256 << 20, dtype=torch.uint8, device=DEV)
    allocated, peak = torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
    summary, pool = torch.cuda.memory_summary(), umprov_managed.stats()
    del x
    return {"allocated": allocated, "peak": peak, "summary_lines": len(summary.splitlines()),
            "after_free": torch.cuda.memory_allocated(), "pool": pool}


def case_cudnn() -> dict:
    torch.backends.cudnn.benchmark = True
    conv = torch.nn.Conv2d(16, 32, 3, padding=1).to(DEV)
    x = torch.randn(8, 16, 64, 64, device=DEV, requires_grad=True)
    out = conv(x)
    out.sum().backward()
    torch.cuda.synchronize()
    return {"out": list(out.shape), "grad": float(x.grad.abs().sum())}


def case_compile(mode: str) -> dict:
    m = model()
    x = torch.randn(64, 512, device=DEV)
    eager = m(x)
    compiled = torch.compile(m, mode=None if mode == "default" else mode)
    outs = [compiled(x) for _ in range(4)]
    torch.cuda.synchronize()
    return {"max_diff": max(float((o - eager).abs().max()) for o in outs)}


def case_train(optim: str) -> dict:
    m = model()
    kind, kwargs = {"adamw": (torch.optim.AdamW, {}), "adamw_fused": (torch.optim.AdamW, {
        "fused": True}), "sgd": (torch.optim.SGD, {"momentum": 0.9})}[optim]
    opt = kind(m.parameters(), lr=1e-3, **kwargs)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    losses = train(m, opt, batches(12), accumulate=2, sched=sched)
    return {"losses": losses, "host_step": "_umprov_host" in opt.__dict__,
            "grads_down": grads_down(m, opt)}


def grads_down(m: torch.nn.Module, opt: torch.optim.Optimizer) -> bool:
    """Whether one more backward leaves every gradient in the host step's pinned memory."""
    host = opt.__dict__.get("_umprov_host")
    if host is None or host.grads_down is None:
        return False
    x, y = batches(1)[0]
    torch.nn.functional.mse_loss(m(x), y).backward()
    torch.cuda.synchronize()
    return all(host.grads_down.host_of(p) is not None for p in m.parameters())


def case_first_steps() -> dict:
    """A 1 GiB model whose gradients do not fit beside it under the budget
    (UMPROV_MANAGED_BUDGET): the losses of three AdamW steps, and what spilled to the
    reservoir at most, the first step's backward and Adam's new moments included."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(16)]).to(DEV)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    gen = torch.Generator(device="cpu").manual_seed(1)
    x = torch.randn(256, 4096, generator=gen).to(DEV)
    losses = []
    for _ in range(3):
        loss = m(x).square().mean()
        loss.backward()
        umprov_managed.spilled()  # the peak: gradients in the reservoir are freed by zero_grad
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
    umprov_managed.spilled()  # the peak, as of now
    return {"losses": losses, "host_step": "_umprov_host" in opt.__dict__,
            "pool": umprov_managed.stats()}


def case_resume(path: str) -> dict:
    """Train 4 steps, save; in a fresh process (``resume``), load and train 4 more."""
    data = batches(8)
    m = model()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    if os.path.exists(path):
        saved = torch.load(path, weights_only=True)
        m.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        return {"losses": train(m, opt, data[4:])}
    losses = train(m, opt, data[:4])
    torch.save({"model": m.state_dict(), "opt": opt.state_dict()}, path)
    return {"losses": losses, "host_step": "_umprov_host" in opt.__dict__}


def case_side_stream() -> dict:
    """A block used on a side stream (record_stream) is not handed out again while that
    stream's work on it runs."""
    side = torch.cuda.Stream()
    a = torch.randn(4096, 4096, device=DEV)
    t = torch.empty(4096, 4096, device=DEV)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(20):
            torch.matmul(a, a, out=t)
    t.record_stream(side)
    ptr = t.data_ptr()
    del t
    u = torch.empty(4096, 4096, device=DEV)
    same = u.data_ptr() == ptr
    torch.cuda.synchronize()
    return {"reused_early": same, "reserved": reserved_over_steps(side)}


def reserved_over_steps(side: torch.cuda.Stream, steps: int = 4) -> list[int]:
    """Memory reserved after each of a few steps that free a block used on a side stream:
    such a block comes back once the side stream is done with it, never held for good."""
    p = torch.nn.Parameter(torch.zeros(1, device=DEV))
    opt = torch.optim.SGD([p], lr=0.1)
    reserved = []
    for _ in range(steps):
        t = torch.ones(4096, 4096, device=DEV)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            t.mul_(2.0)
        t.record_stream(side)
        del t
        p.grad = torch.ones_like(p)
        opt.step()
        reserved.append(torch.cuda.memory_reserved())
    return reserved


def case_spill() -> dict:
    """Tensors past the budget (UMPROV_MANAGED_BUDGET) land in the reservoir and hold what
    was written; with expandable segments too (the reservoir is made with them off)."""
    blocks = [torch.full((64 << 20,), float(i), device=DEV) for i in range(6)]  # 6 x 256 MiB
    right = all(float(b.sum()) == i * (64 << 20) for i, b in enumerate(blocks))
    return {"right": right, "pool": umprov_managed.stats()}


def case_fraction() -> dict:
    """The job's own memory fraction is of device memory: the reservoir comes on top. 3 GiB
    of device memory, less than the reservoir PyTorch counts in every segment."""
    total = torch.cuda.get_device_properties(DEV).total_memory
    torch.cuda.set_per_process_memory_fraction((3 << 30) / total)
    x = torch.ones(256 << 20, dtype=torch.float32, device=DEV)  # 1 GiB
    return {"sum": float(x.sum()), "pool": umprov_managed.stats()}


def case_beyond(layers: str) -> dict:
    """A model larger than the device memory left to it (another process holds the rest),
    fine-tuned in bf16: its first kernels, and the backward thread's cuBLAS handle, come after
    PyTorch has filled the device; CUDA makes them in the headroom."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(int(layers))]).to(DEV)
    tuned = list(m.parameters())[-8:]
    for p in m.parameters():
        p.requires_grad_(any(p is t for t in tuned))
    opt = torch.optim.AdamW(tuned, lr=1e-4)
    x = torch.randn(256, 4096, device=DEV)
    losses = []
    for _ in range(2):
        with torch.autocast("cuda", torch.bfloat16):
            loss = m(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
    return {"losses": losses, "pool": umprov_managed.stats()}


def case_scaler() -> dict:
    """GradScaler's step (fused AdamW, fp16 autocast) stays the device's, as written."""
    m = model()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, fused=True)
    scaler = torch.amp.GradScaler("cuda")
    losses = []
    for x, y in batches(6):
        with torch.autocast("cuda", torch.float16):
            loss = torch.nn.functional.mse_loss(m(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        losses.append(float(loss))
    return {"losses": losses, "host_step": "_umprov_host" in opt.__dict__}


def case_ddp() -> dict:
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        m = torch.nn.parallel.DistributedDataParallel(model(), device_ids=[0])
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        return {"losses": train(m, opt, batches(6)), "grads_down": grads_down(m, opt)}
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    name, *rest = sys.argv[1:]
    facts = globals()[f"case_{name}"](*rest)
    facts["enabled"] = umprov_managed.enabled()
    print(json.dumps(facts))
