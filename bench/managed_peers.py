"""umprov's pool against the offload tools people pick instead, past the GPU's memory (#36).

    python3 bench/managed_peers.py [--model transformer|mlp] [--left-gib 15.5] [--layers 15]
        [--steps 6] [--only NAME,...]

A neighbour process that is not torch (CuPy) holds all of the GPU but ``--left-gib``; then
each run trains in a child of its own (an allocator is chosen at a process's start): a stack
of ``nn.TransformerEncoderLayer(4096, 32 heads, ff 16384, dropout 0)``, batch 2 x 512 tokens,
or (``--model mlp``) a stack of MLP blocks ``Linear(8192, 32768), GELU, Linear(32768, 8192)``
on 2048 tokens (537 M parameters a block: weights dominate and activations are small, so every
design is bound by moving parameters and gradients); the median step after the first, the
user's code the same for every run but the peers' own wrapping:

- default: PyTorch's allocator (out of memory past the GPU's memory: the contrast);
- pool: ``UMPROV_MANAGED_MEMORY=1`` (the image's hook), the optimizer as written, gradients
  down off (``UMPROV_MANAGED_GRADS_DOWN=0``: the product before run J);
- pool_gpu_step: the same with ``UMPROV_MANAGED_HOST_STEP=0``: the pool before the host step
  (the issue's baseline: the GPU's kernels over spilled state);
- pool_grads_down: the product since run J (``UMPROV_MANAGED_GRADS_DOWN=1``, the default):
  gradients go down into pinned host memory during backward;
- pool_weights_out: an experiment, not the product: pool_grads_down with the first quarter of
  the layers' weights moved into the reservoir by the bench (``weights_out``);
- torchao: ``CPUOffloadOptimizer(params, AdamW, offload_gradients=True, fused=True)``;
- fsdp2: ``fully_shard(..., offload_policy=CPUOffloadPolicy(pin_memory=True))``, world size 1;
- deepspeed: ZeRO-Offload, ``deepspeed.initialize`` with ZeRO stage 2 and
  ``offload_optimizer: {device: cpu, pin_memory: true}`` (DeepSpeedCPUAdam, JIT-built once
  before the run), world size 1, 2e8-element buckets as DeepSpeed's examples set them; the
  loop calls ``engine.backward(loss)`` and ``engine.step()`` as DeepSpeed's users do (AdamW only);
  its bf16 row is DeepSpeed's ``bf16: {enabled: true}`` (bf16 weights on the GPU, fp32 master
  weights on the host) under the same autocast.

Also a size that fits (2 layers, 1 MLP block: default against pool) and the loss curve of the
host step against the same model trained in device memory (that size, 20 steps, the host step
forced).
Every figure against the others of the same run; the pinned host-to-device rate measured here.
Safety: the pool never asks for more managed memory than the GPU had free (its reservoir is
``--left-gib``, kept on the host); the spilled working set is checked against the host's
available memory first. Results: bench/results/managed_peers.json, a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from managed_alloc import GIB, NVLS_OFF, build, pinned_h2d
from managed_alloc import after_first as step

HERE = Path(__file__).resolve().parent
MANAGED = HERE.parent / "docker" / "pytorch-cuda" / "managed"
NEIGHBOUR = """
import sys, time, cupy
free, _ = cupy.cuda.runtime.memGetInfo()
keep = free - int(float(sys.argv[1]) * (1 << 30))
held = cupy.empty(keep, dtype=cupy.uint8) if keep > 0 else None
cupy.cuda.runtime.deviceSynchronize()
print("ready", flush=True)
time.sleep(3600)
"""


# ---- the child: one run ------------------------------------------------------------------
def child(run: dict) -> dict:
    managed = run["how"].startswith("pool")
    if managed:
        sys.path.insert(0, os.environ.get("UMPROV_BENCH_MANAGED", str(MANAGED)))
        import umprov_managed

        umprov_managed.after_torch_import()
    import torch

    torch.manual_seed(0)
    dev = torch.device("cuda")
    times, losses, phases, placement, churn = [], [], [], [], []
    began = time.perf_counter()
    try:
        model = build_model(torch, run).to(dev)
        if run["how"] == "pool_weights_out":
            weights_out(torch, umprov_managed, model)
        opt = optimizer(torch, model, run)  # torchao pins its host copies here
        engine = opt.engine if isinstance(opt, EngineStep) else None
        model = engine or model  # DeepSpeed's forward and backward go through its engine
        backward = engine.backward if engine else torch.Tensor.backward
        x = batch(torch, run).to(dev)
        setup = _synced(torch) - began
        for _ in range(run["steps"]):
            torch.cuda.synchronize()
            marks = [time.perf_counter()]
            with torch.autocast("cuda", torch.bfloat16, enabled=run["dtype"] == "bf16"):
                loss = model(x).float().square().mean()
            marks.append(_synced(torch))
            backward(loss)
            marks.append(_synced(torch))
            opt.step()
            opt.zero_grad(set_to_none=True)
            marks.append(_synced(torch))
            times.append(marks[-1] - marks[0])
            phases.append([round(b - a, 4) for a, b in zip(marks, marks[1:], strict=False)])
            losses.append(float(loss))
            churn.append(allocator_counts(torch))
            if managed:  # where the pool's segments are, step by step
                pool = umprov_managed.stats()
                placement.append([round(pool[k] / GIB, 2) for k in ("placed", "spilled")])
    except torch.OutOfMemoryError as exc:
        return out_of_memory(exc, umprov_managed if managed else None, len(times))
    if managed:  # one more step, untimed: what sits where
        try:
            out_where = where_step(torch, umprov_managed, model, opt, x)
        except torch.OutOfMemoryError as exc:
            out_where = out_of_memory(exc, None, len(times))
    out = {"step_s": times, "setup_s": setup, "losses": losses, "phases_fwd_bwd_step": phases,
           **({"host_optimizer": type(getattr(engine, "basic_optimizer", None)).__name__}
              if engine else {}),
           "allocator_after_first": {k: churn[-1][k] - churn[0][k] for k in churn[0]},
           "gpu_peak_gib": torch.cuda.max_memory_allocated() / GIB,
           "host_peak_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20),
           "params_b": sum(p.numel() for p in model.parameters()) / 1e9}
    if managed:
        out["pool"] = umprov_managed.stats()
        out["placed_spilled_gib"] = placement
        out["host_step"] = "_umprov_host" in opt.__dict__
        out["where_gib"] = out_where
    return out


def out_of_memory(exc: BaseException, pool, steps_done: int) -> dict:  # noqa: ANN001
    """Where the run met out-of-memory: the message, the last frames, the pool's counters."""
    frames = traceback.extract_tb(exc.__traceback__)[-4:]
    out = {"oom": str(exc).splitlines()[0][:160], "steps_done": steps_done,
           "at": [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames]}
    if pool is not None:
        out["pool"] = pool.stats()
    return out


# parameters a layer (block) of each model, for the host-memory check before any run
PARAMS_PER_LAYER = {"transformer": 201_379_840, "mlp": 536_911_872}


def build_model(torch, run: dict):  # noqa: ANN001, ANN201 - the child's torch
    """The run's model on the CPU: ``run["layers"]`` layers of ``run["model"]``."""
    if run.get("model", "transformer") == "mlp":
        blocks = [torch.nn.Sequential(torch.nn.Linear(8192, 32768), torch.nn.GELU(),
                                      torch.nn.Linear(32768, 8192))
                  for _ in range(run["layers"])]
    else:
        blocks = [torch.nn.TransformerEncoderLayer(4096, 32, 16384, dropout=0.0,
                                                   batch_first=True)
                  for _ in range(run["layers"])]
    return torch.nn.Sequential(*blocks)


def batch(torch, run: dict):  # noqa: ANN001, ANN201 - the child's torch
    """The one batch every step trains on, the same for every run of a model (seeded)."""
    gen = torch.Generator().manual_seed(1)
    shape = (2048, 8192) if run.get("model", "transformer") == "mlp" else (2, 512, 4096)
    return torch.randn(*shape, generator=gen)


COUNTS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
          "num_device_free")


def allocator_counts(torch) -> dict:  # noqa: ANN001 - the child's torch
    """The caching allocator's counters of its slow paths (cache released and retried,
    streams synchronised, segments asked of CUDA and given back); names a torch lacks: 0."""
    stats = torch.cuda.memory_stats()
    return {k: int(stats.get(k, 0)) for k in COUNTS}


def where_step(torch, managed, model, opt, x) -> dict:  # noqa: ANN001 - the child's torch
    """The allocator's bytes after forward, after backward and after the step, each as on
    the device / in the reservoir, live and cached free (torch's segment snapshot), and the
    parameters' and gradients' own after backward as on the device (or a view of host memory)
    / in the reservoir: which allocations hold the device."""
    def pool() -> dict:
        torch.cuda.synchronize()
        out = {"live": [0.0, 0.0], "free": [0.0, 0.0]}
        for seg in torch.cuda.memory_snapshot():
            spilled = int(managed.in_reservoir(seg["address"]))
            out["live"][spilled] += seg["allocated_size"] / GIB
            out["free"][spilled] += (seg["total_size"] - seg["allocated_size"]) / GIB
        return {k: [round(v, 2) for v in pair] for k, pair in out.items()}

    seen = {"params": [0.0, 0.0], "grads": [0.0, 0.0]}  # on the device, in the reservoir
    loss = model(x).float().square().mean()
    seen["after_forward"] = pool()
    loss.backward()
    seen["after_backward"] = pool()
    for p in model.parameters():
        for kind, t in (("params", p), ("grads", p.grad)):
            if t is not None:
                at = int(managed.in_reservoir(t))
                seen[kind][at] += t.numel() * t.element_size() / GIB
    opt.step()
    opt.zero_grad(set_to_none=True)
    seen["after_step"] = pool()
    return {**seen, **{k: [round(v, 2) for v in seen[k]] for k in ("params", "grads")}}


def weights_out(torch, managed, model) -> list:  # noqa: ANN001 - the child's torch, pool
    """An experiment for a GPU that the weights fill (run K, 9 GiB left: 7.5 GiB of weights
    left forward's activations none; they spilled, and the kernels reading them across the
    bus made forward 3.0 s): the first quarter of the layers' weights moved into the
    reservoir, so activations get the device memory they leave. A GEMM reads its weight about
    M/128 times (8 for 1024 tokens) and its activation input N/128 times (32 for 4096
    features): a spilled weight should cost the bus less than a spilled activation."""
    pool = managed.reservoir(torch.cuda.current_device())
    moved = []
    with torch.no_grad(), torch.cuda.use_mem_pool(pool):
        for layer in list(model)[:-(-len(model) // 4)]:
            for p in layer.parameters():
                there = torch.empty_like(p)
                there.copy_(p)
                p.data = there
                moved.append(p)
    return moved


def _synced(torch) -> float:  # noqa: ANN001 - the child's torch
    torch.cuda.synchronize()
    return time.perf_counter()


class EngineStep:
    """DeepSpeed's engine in the loop's optimizer's place: its step, which zeroes the
    gradients (the loop calls the engine's backward: ZeRO's reduction into the offloaded
    partition)."""

    def __init__(self, engine) -> None:  # noqa: ANN001 - deepspeed's engine
        self.engine = engine

    def step(self) -> None:
        self.engine.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing: the engine's step zeroed them."""


def deepspeed_engine(model, run: dict) -> EngineStep:  # noqa: ANN001 - the child's model
    """ZeRO-Offload as its users write it for one GPU without the launcher."""
    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29542"), ("RANK", "0"),
                       ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(key, value)
    import deepspeed

    if run["optim"] != "adamw":
        raise ValueError(f"the deepspeed row runs AdamW only, not {run['optim']}")
    params: dict = {"lr": 1e-5, "weight_decay": 0.01}
    if os.environ.get("UMPROV_BENCH_DS_TORCH_ADAM") == "1":  # DeepSpeedCPUAdam did not build
        params.update(torch_adam=True, fused=True)  # torch's fused AdamW on the CPU instead
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "AdamW", "params": params},
              "zero_optimization": {"stage": 2, "contiguous_gradients": True,
                                    "overlap_comm": True, "reduce_bucket_size": 2e8,
                                    "allgather_bucket_size": 2e8,
                                    "offload_optimizer": {"device": "cpu", "pin_memory": True}}}
    if run.get("dtype") == "bf16":
        # DeepSpeed's own mixed precision: bf16 weights on the GPU, fp32 master weights with
        # the optimizer on the host. Left fp32, ZeRO-2 clones the flat fp32 weights on the
        # GPU on their way to the host (stage_1_and_2.py, 0.19.8): 2x the weights at init.
        config["bf16"] = {"enabled": True}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=config)
    return EngineStep(engine)


def optimizer(torch, model, run: dict):  # noqa: ANN001, ANN201 - torch is the child's
    if run["how"] == "deepspeed":
        return deepspeed_engine(model, run)
    kind = {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[run["optim"].split("_")[0]]
    kwargs = {"lr": 1e-5, **({"momentum": 0.9} if kind is torch.optim.SGD else {}),
              **({"fused": True} if run["optim"].endswith("fused") else {})}
    if run["how"] == "torchao":
        from torchao.optim import CPUOffloadOptimizer

        kwargs.pop("fused", None)
        return CPUOffloadOptimizer(model.parameters(), kind, offload_gradients=True,
                                   **({"fused": True} if kind is torch.optim.AdamW else {}),
                                   **kwargs)
    if run["how"] == "fsdp2":
        import torch.distributed as dist
        from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29541")
        dist.init_process_group("nccl", rank=0, world_size=1)
        for layer in model:
            fully_shard(layer, offload_policy=CPUOffloadPolicy(pin_memory=True))
        fully_shard(model, offload_policy=CPUOffloadPolicy(pin_memory=True))
        kwargs.pop("fused", None)
    return kind(model.parameters(), **kwargs)


# ---- the parent ---------------------------------------------------------------------------
GRADS_DOWN = ("pool_grads_down", "pool_weights_out")  # the runs with gradients down on


def run_child(library: Path, managed: Path, timeout: float, reservoir_gib: float,
              **run: object) -> dict:
    env = {**os.environ, **NVLS_OFF, "UMPROV_MANAGED_LIBRARY": str(library),
           "UMPROV_BENCH_MANAGED": str(managed.resolve()),
           "UMPROV_MANAGED_RESERVOIR": f"{reservoir_gib}g",
           "UMPROV_MANAGED_MEMORY": "1" if str(run["how"]).startswith("pool") else "0",
           "UMPROV_MANAGED_HOST_STEP": {"pool_gpu_step": "0", "pool_host_step": "1"}.get(
               str(run["how"]), "auto"),
           "UMPROV_MANAGED_GRADS_DOWN": "1" if run["how"] in GRADS_DOWN else "0"}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(run)], env=env,
                              capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {**run, "error": f"timed out after {timeout:.0f} s"}
    try:
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        result = {"error": f"exit {proc.returncode}: {proc.stderr[-800:]}"}
    return {**run, **result, "wall_s": round(time.perf_counter() - t0, 1)}


def plan(args: argparse.Namespace) -> list[dict]:
    big = {"layers": args.layers, "steps": args.steps, "model": args.model}
    runs = [{"name": f"{how}:{optim}:{dtype}", "how": how, "optim": optim, "dtype": dtype, **big}
            for dtype, optim, hows in (
                ("fp32", "adamw", ("default", "pool_gpu_step", "pool_grads_down", "pool",
                                   "pool_weights_out", "torchao", "fsdp2", "deepspeed")),
                ("fp32", "adamw_fused", ("pool", "pool_grads_down", "torchao")),
                ("fp32", "sgd", ("pool_gpu_step", "pool", "pool_grads_down", "torchao")),
                ("bf16", "adamw", ("pool", "pool_grads_down", "torchao", "fsdp2", "deepspeed")))
            for how in hows]
    # a size that fits beside the neighbour: 6.2 GiB of transformer, 8.0 GiB of MLP
    small = {"layers": 1 if args.model == "mlp" else 2, "optim": "adamw", "dtype": "fp32",
             "model": args.model}
    runs += [{"name": f"fit:{how}", "how": how, "steps": 8, **small}
             for how in ("default", "pool", "pool_grads_down")]
    runs += [{"name": f"curve:{how}", "how": how, "steps": 20, **small}
             for how in ("default", "pool_host_step")]
    only = set(args.only.split(",")) if args.only else None
    return [r for r in runs if only is None or r["name"] in only or r["how"] in only]


def past(run: dict) -> bool:
    """Whether the run is of the size past the GPU's memory (not a fitting or curve run)."""
    return not run["name"].startswith(("fit:", "curve:"))


def table(results: list[dict], rate: float) -> list[str]:
    by = {r["name"]: r for r in results}
    best_peer = min((step(r) for r in results if r["how"] in ("torchao", "fsdp2", "deepspeed")
                     and past(r) and step(r)), default=None)
    lines = [f"pinned h2d {rate:.1f} GB/s", "run | step s | x best peer | GPU peak GiB | "
             "host peak GiB | spilled GiB | set-up + first step s"]
    for r in results:
        s = step(r)
        spilled = (r.get("pool") or {}).get("peak_spilled", 0) / GIB
        ratio = f"{s / best_peer:.2f}" if s and best_peer and past(r) else ""
        what = r.get("oom") and "out of memory" or r.get("error", "")[:60]
        first = (f"{r['setup_s']:.1f} + {r['step_s'][0]:.1f}"
                 if r.get("step_s") and "setup_s" in r else "")
        lines.append(f"{r['name']} | {s and round(s, 3) or what} | {ratio} | "
                     f"{r.get('gpu_peak_gib', 0):.1f} | {r.get('host_peak_gib', 0):.1f} | "
                     f"{spilled:.1f} | {first}")
    fit_d = step(by.get("fit:default", {}))
    for how in ("pool_grads_down", "pool"):  # the product, then with gradients down off
        fit_p = step(by.get(f"fit:{how}", {}))
        if fit_d and fit_p:
            lines.append(f"fits: {how} {fit_p:.4f} s vs default {fit_d:.4f} s = "
                         f"{fit_p / fit_d:.3f}x")
    a, b = by.get("curve:default", {}).get("losses"), by.get("curve:pool_host_step", {}).get(
        "losses")
    if a and b:
        worst = max(abs(x - y) / abs(x) for x, y in zip(a, b, strict=True))
        lines.append(f"loss curve, host step vs device, 20 steps: worst relative {worst:.2e}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child")
    ap.add_argument("--model", choices=sorted(PARAMS_PER_LAYER), default="transformer")
    ap.add_argument("--left-gib", type=float, default=15.5)
    ap.add_argument("--layers", type=int, default=15)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--only", default="")
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--managed", type=Path, default=MANAGED,
                    help="the managed modules and library to measure (another checkout's "
                         "docker/pytorch-cuda/managed: a change against its parent, one lease)")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    available = int(next(ln.split()[1] for ln in meminfo if ln.startswith("MemAvailable")))
    working = args.layers * PARAMS_PER_LAYER[args.model] * 16  # weights, grads, 2 moments
    if working * 1.5 > available * 1024:
        raise SystemExit("not enough host memory for the working set and its host copies")
    rate = pinned_h2d()
    neighbour = subprocess.Popen([sys.executable, "-c", NEIGHBOUR, str(args.left_gib)],
                                 stdout=subprocess.PIPE, text=True)
    results = []
    try:
        if neighbour.stdout is None or neighbour.stdout.readline().strip() != "ready":
            raise SystemExit("the neighbour process did not start")
        with tempfile.TemporaryDirectory() as tmp:
            library = build(Path(tmp), args.managed)
            for run in plan(args):
                results.append(run_child(library, args.managed, args.timeout, args.left_gib,
                                         **run))
                print(json.dumps({k: v for k, v in results[-1].items() if k != "losses"}),
                      file=sys.stderr, flush=True)
    finally:
        neighbour.kill()
        neighbour.wait()
    lines = table(results, rate)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "managed_peers.json").write_text(json.dumps(
        {"pinned_h2d_gbs": rate, "left_gib": args.left_gib, "model": args.model,
         "managed": str(args.managed),
         "alloc_conf": {n: os.environ[n] for n in ("PYTORCH_CUDA_ALLOC_CONF",
                                                   "PYTORCH_ALLOC_CONF") if n in os.environ},
         "results": results,
         "table": lines}, indent=2))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
