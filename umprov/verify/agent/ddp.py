"""One DistributedDataParallel step on every rank of the host's process group (nccl.py): all
ranks must end with identical parameters, updated, and equal to a reference step with the
gradients averaged by hand."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .schema import record

if TYPE_CHECKING:
    from .group import Rank

BATCH = 16


def _model(torch: Any, device: Any) -> Any:
    nn = torch.nn
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8)).to(device)


def ddp_prepare(torch: Any, device: Any, rank: int, cpu: bool) -> dict:
    """The model and its DDP wrapper, built while the per-GPU checks run (seconds)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(1000 + rank)  # different on purpose: DDP must broadcast rank 0's
    model = _model(torch, device)
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=None if cpu else [device.index])
    return {"model": model, "ddp": ddp}


def ddp_warm_up(torch: Any, state: dict) -> None:
    """DDP's first iterations (autograd's device thread and cuBLAS in the first, the bucket
    rebuild at the second's forward) and SGD's kernels: two forwards and backwards on zeros,
    the gradients then dropped, nothing stepped, so ``ddp_step`` still starts from the
    broadcast weights."""
    model, ddp = state["model"], state["ddp"]
    device = next(model.parameters()).device
    for _ in range(2):
        loss = torch.nn.functional.mse_loss(ddp(torch.zeros(BATCH, 64, device=device)),
                                            torch.zeros(BATCH, 8, device=device))
        loss.backward()
    scratch = torch.zeros(8, device=device, requires_grad=True)
    scratch.grad = torch.ones(8, device=device)
    torch.optim.SGD([scratch], lr=0.1).step()
    for p in model.parameters():
        p.grad = None


def ddp_step(r: Rank, state: dict) -> None:
    torch, dist, device, world = r.torch, r.dist, r.device, r.world
    model, ddp = state["model"], state["ddp"]
    start = [p.detach().clone() for p in model.parameters()]
    ref = _model(torch, device)
    ref.load_state_dict(model.state_dict())  # rank 0's weights, as DDP broadcast them
    gen = torch.Generator().manual_seed(2000 + r.rank)
    x = torch.randn(BATCH, 64, generator=gen).to(device)
    y = torch.randn(BATCH, 8, generator=gen).to(device)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    loss = torch.nn.functional.mse_loss(ddp(x), y)
    loss.backward()
    opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = torch.empty(world * flat.numel(), device=device)
    dist.all_gather_into_tensor(every, flat)
    rows = every.view(world, -1)
    identical = bool((rows == rows[0]).all())
    changed = any(not torch.equal(a, b) for a, b in zip(start, model.parameters()))  # noqa: B905
    err = float((_reference_step(r, ref, x, y) - flat).abs().max())
    averaged = err <= 1e-4
    ok = identical and changed and averaged
    if r.lead:
        r.em.record(record(
            "host", "host", "ddp.step", "pass" if ok else "fail", measured=identical,
            hint="investigate",
            detail=f"one DDP SGD step on {world} rank(s){r.one}: parameters "
            f"{'identical' if identical else 'DIFFER'} across ranks, "
            f"{'updated' if changed else 'NOT updated'}, max diff to an averaged-gradient "
            f"reference {err:.2e}"))


def _reference_step(r: Rank, ref: Any, x: Any, y: Any) -> Any:
    """The same step on every rank's data, gradients averaged; its flat parameters."""
    torch, world = r.torch, r.world
    xs = torch.empty(world * BATCH, 64, device=r.device)
    ys = torch.empty(world * BATCH, 8, device=r.device)
    r.dist.all_gather_into_tensor(xs, x)
    r.dist.all_gather_into_tensor(ys, y)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    ref_loss = sum(torch.nn.functional.mse_loss(ref(xs[i * BATCH:(i + 1) * BATCH]),
                                                ys[i * BATCH:(i + 1) * BATCH])
                   for i in range(world)) / world
    ref_loss.backward()
    ref_opt.step()
    return torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
