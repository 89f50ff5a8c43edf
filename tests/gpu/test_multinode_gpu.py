"""The multi-node NCCL path on one 2-GPU machine: two "nodes" of one GPU each.

Two torchrun processes (CUDA_VISIBLE_DEVICES=0 and =1), c10d rendezvous over 127.0.0.1, each
rank being the agent's zipapp --child multinode, built and judged by umprov.verify.multinode exactly as a
multi-host run. Run on the H200 machine: `pytest -q tests/gpu/test_multinode_gpu.py`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from umprov.verify import report
from umprov.verify.multinode_judge import HostRun, host_reports, parse_events
from umprov.verify.multinode_plan import MultiNodeOptions, node_env, shell_script, torchrun_command

OUT = Path(os.environ["UMPROV_GPU_TEST_OUT"]) if os.environ.get("UMPROV_GPU_TEST_OUT") else None

pytestmark = pytest.mark.gpu

# "default": NCCL picks its transport (P2P/SHM on one machine); "network": P2P and SHM off, so
# the ranks talk over NCCL's socket transport on loopback, the path between real hosts.
TRANSPORTS = {
    "default": {},
    "network": {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_SOCKET_IFNAME": "lo"},
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_two_nodes_of_one_gpu_nccl(agent: Path, tmp_path: Path, gpu_count: int,
                                   transport: str) -> None:
    if gpu_count < 2:
        pytest.skip(f"needs 2 CUDA GPUs, {gpu_count} visible")
    opts = MultiNodeOptions(backend="nccl", timeout=120)
    (tmp_path / "opts.json").write_text(json.dumps(opts.worker_opts()))
    endpoint, rdzv_id = f"127.0.0.1:{_free_port()}", f"gpu-test-{transport}"
    runs, procs = [], []
    t0 = time.monotonic()
    for node in range(2):
        work = tmp_path / f"node{node}"
        work.mkdir()
        run = HostRun(f"node{node}", {})
        run.nproc, run.local_addr, run.stage = 1, "127.0.0.1", "launched"
        run.env = {**node_env({}), **TRANSPORTS[transport]}
        cmd = torchrun_command(python=sys.executable, agent=str(agent), nnodes=2, nproc=1,
                               endpoint=endpoint, rdzv_id=rdzv_id, join_timeout=opts.timeout,
                               local_addr="127.0.0.1", is_host=node == 0,
                               opts_path=str(tmp_path / "opts.json"),
                               out_prefix=str(work / "rank"))
        script = shell_script(cmd, run.env, workdir=str(work), deadline=opts.run_deadline())
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(node)}
        run.launched_at = time.time()
        procs.append(subprocess.Popen(["sh", "-c", script], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, start_new_session=True))
        runs.append(run)
    try:
        for run, proc in zip(runs, procs, strict=True):
            run.output, _ = proc.communicate(timeout=opts.run_deadline() + 30)
            run.rc, run.finished_at, run.stage = proc.returncode, time.time(), "finished"
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
    wall = time.monotonic() - t0
    for node, run in enumerate(runs):
        for f in sorted((tmp_path / f"node{node}").glob("rank.*")):
            run.ranks[int(f.suffix[1:])] = parse_events(f.read_text())
    docs = host_reports(runs, backend="nccl", endpoint=endpoint, rdzv_id=rdzv_id,
                        timeout=opts.timeout, wall_s=wall)
    for doc in docs:
        assert report.validate(doc) == [], report.validate(doc)
    if OUT is not None:
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / f"multinode-{transport}.json").write_text(json.dumps(docs, indent=2))
    for doc in docs:
        checks = {r["check"]: r for r in doc["records"]}
        assert doc["verdict"] in ("pass", "warn"), (doc["records"], runs[0].output[-2000:])
        for check in ("multinode.join", "multinode.all_reduce", "multinode.all_gather"):
            assert checks[check]["verdict"] == "pass", checks[check]
        assert checks["multinode.all_reduce"]["measured"] == 0
        bw = checks["multinode.busbw"]
        assert bw["measured"] > 0 and bw["verdict"] == "skip"  # no profile value given here
        assert doc["facts"]["world_size"] == 2 and doc["facts"].get("nccl")
    busbw = {r["check"]: r for r in docs[0]["records"]}["multinode.busbw"]["measured"]
    print(f"\n{transport}: 2 nodes x 1 GPU, {wall:.1f} s, busbw {busbw} GB/s, timings "
          + json.dumps([d["facts"]["timings"] for d in docs]))
