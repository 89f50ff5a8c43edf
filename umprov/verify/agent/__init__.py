"""umprov's GPU verification agent: runs ON the GPU host, standard library and torch only.

It travels as one file, a zipapp built from this package (umprov/verify/bundle.py), copied
into any PyTorch image or run on the host directly::

    python3 agent.pyz --json report.json [--quick] [--expected-gpus N] [--profile-file F]
                      [--profile NAME] [--timeout S] [--duration 10m] [--exclusive]

(``python3 -m umprov.verify.agent`` is the same where umprov is installed.) It writes one
versioned JSON document (schema.py) and exits 0 (pass), 12 (warnings only) or 13 (a failing
check). Nothing here imports umprov outside this package: the control side imports this
package's schema and profiles, never the other way.

How it runs (host.py, runner.py): this process never touches a GPU. Every test runs in a child
process (the agent started again with ``--child KIND``) with a deadline; a child that does not
finish in time is killed with its whole process group and its check is reported as failed with
reason "timeout", so one hung GPU cannot hang the run. The children start together; the
monitor child (NVML and the kernel log, no torch) lists the GPUs' processes before any other
child creates a CUDA context. Timed host-link transfers of the per-GPU children take a file
lock, so GPUs measured in parallel do not share the host's memory bandwidth while timed, and
every timed window on a GPU takes that GPU's lock too: work of other children that times
nothing (NCCL's set-up, the allocator check, the oversubscription step's warm-up) runs between
those windows, never in one.
Across hosts, torchrun starts ``--child multinode`` once per GPU of every host (multinode.py
here; umprov/verify/multinode.py drives it).

The checks, one module per family: gpu.py (compute, GEMM rate, HBM and pinned bandwidth),
health.py (NVML counters per GPU, driver and fabric per host), managed.py (unified memory),
alloc.py (the cudaMallocAsync backend), nccl.py, pairs.py, busbw.py and ddp.py (collectives
on the host), burnin.py (``--duration``), xid.py (Xid errors in the kernel log), processes.py
(other processes on the GPUs), nvlink.py (links and error counters), multinode.py
(collectives across hosts); the types they share in gpuchild.py (one GPU as the per-GPU
checks see it) and group.py (one rank of a process group); probes of the driver in libnvml.py,
nvml.py and cudart.py; the monitor child in monitor.py, its samples read in samples.py; the
report written out in report.py. Every import inside the package runs one way
(tests/unit/test_layers.py checks it). docs/verify-checks.md lists every check with its verdict
rules.

Safety: NVLink multicast stays off in every child (NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 are set where absent); managed
memory buffers are a small fraction of the free device memory, never oversubscribed.

Compatible with Python 3.8+ (images ship old interpreters): no match statements, no zip(strict),
no str.removeprefix, ``from __future__ import annotations`` in every module.
"""
