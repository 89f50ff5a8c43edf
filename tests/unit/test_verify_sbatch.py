"""docs/examples/multinode.sbatch and `umprov verify --multi-node --events DIR`: the script run
by bash under a stand-in srun and scontrol (two "nodes" on this machine, real torchrun and gloo),
and the folder it leaves judged into the records of `umprov verify --multi-node`."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests import fakebin
from tests.conftest import REPO
from umprov.verify.bundle import agent_zipapp
from umprov.verify.multinode_plan import MultiNodeOptions

SCRIPT = REPO / "docs" / "examples" / "multinode.sbatch"

# srun: the command once per node of FAKE_NODES, at once, each with Slurm's task variables.
FAKE_SRUN = """#!/bin/bash
while [[ $1 == --* ]]; do shift; done
nodes=($FAKE_NODES); pids=()
for i in "${!nodes[@]}"; do
  SLURMD_NODENAME=${nodes[$i]} SLURM_NODEID=$i SLURM_PROCID=$i SLURM_NNODES=${#nodes[@]} "$@" &
  pids+=($!)
done
rc=0; for p in "${pids[@]}"; do wait "$p" || rc=$?; done; exit $rc
"""
FAKE_SCONTROL = """#!/bin/bash
[ "$1 $2" = "show hostnames" ] || exit 1
printf '%s\\n' $FAKE_NODES
"""


def test_the_scripts_work_is_umprovs() -> None:
    """The per-rank sizes written in the script are MultiNodeOptions' for each backend."""
    text = SCRIPT.read_text()
    for backend in ("nccl", "gloo"):
        line = re.search(rf"^  {backend}\) WORK='(.*)' ;;$", text, re.MULTILINE)
        assert line, backend
        want = MultiNodeOptions(backend=backend).worker_opts()
        assert json.loads("{" + line.group(1) + "}") == {
            k: v for k, v in want.items() if k not in ("backend", "timeout")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sbatch(tmp_path: Path, nodes: str, **env: str) -> Path:
    """Run the script as Slurm would, with the stand-ins; the folder it leaves."""
    bin_dir = tmp_path / "bin"
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        fakebin.program(bin_dir / name, text)
    full = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path),
            "FAKE_NODES": nodes, "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "n[0-1]",
            "SLURM_SUBMIT_DIR": str(tmp_path), "UMPROV_PYTHON": sys.executable,
            "UMPROV_BACKEND": "gloo", "UMPROV_TIMEOUT": "60",
            "UMPROV_RDZV_HOST": "127.0.0.1", "UMPROV_RDZV_PORT": str(_free_port()),
            "GLOO_SOCKET_IFNAME": "lo", **env}
    res = subprocess.run(["bash", str(SCRIPT)], env=full, capture_output=True, text=True,
                         timeout=300, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "umprov verify --multi-node --events" in res.stdout
    return tmp_path / "umprov-mn-4242"


def checks(doc: dict) -> dict[str, dict]:
    return {r["check"]: r for r in doc["records"]}


def test_a_job_run_with_sbatch_is_judged_as_umprov_runs_it(tmp_path: Path, umprov_cli) -> None:
    pytest.importorskip("torch")
    agent = agent_zipapp(cache=tmp_path / "cache")
    out = sbatch(tmp_path, "n0 n1", UMPROV_AGENT=str(agent))
    result = umprov_cli("verify", "--multi-node", "--events", str(out), "--json")
    logs = [(out / n / "torchrun.log").read_text()[-1500:] for n in ("n0", "n1")]
    assert result.exit_code == 0, (result.stderr[-2000:], logs)
    docs = {d["host"]: d for d in json.loads(result.stdout)["hosts"]}
    assert set(docs) == {"n0", "n1"}
    for node, doc in docs.items():
        got = checks(doc)
        assert set(got) == {"multinode.join", "multinode.all_reduce", "multinode.all_gather",
                            "multinode.busbw"}
        assert got["multinode.all_reduce"]["measured"] == 0 == got["multinode.all_gather"][
            "measured"]
        assert got["multinode.busbw"]["verdict"] == "skip" and got["multinode.busbw"]["measured"]
        facts = doc["facts"]
        assert facts["launcher"] == "sbatch" and facts["slurm_job_id"] == "4242"
        assert facts["slurm_node"] == node and facts["world_size"] == 2
        assert facts["rendezvous"].startswith("127.0.0.1:")


def write_job(folder: Path, nodes: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "job.json").write_text(json.dumps(
        {"job_id": "7", "backend": "gloo", "timeout": 30, "rendezvous": "n0:29400",
         "nodes": nodes, "started": 100.0, "ended": 131.0}))


def test_a_node_without_output_did_not_join(tmp_path: Path, umprov_cli) -> None:
    out = tmp_path / "job"
    write_job(out, ["n0", "n1"])
    (out / "n0").mkdir()
    (out / "n0" / "nproc").write_text("1\n")
    (out / "n0" / "torchrun.rc").write_text("1\n")
    (out / "n0" / "torchrun.log").write_text(
        "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError\n")
    result = umprov_cli("verify", "--multi-node", "--events", str(out), "--json")
    assert result.exit_code == 13
    docs = {d["host"]: d for d in json.loads(result.stdout)["hosts"]}
    assert checks(docs["n1"])["multinode.join"]["detail"] == (
        "did not join: no output from node n1: its task did not start")
    assert "n1 did not join" in checks(docs["n0"])["multinode.join"]["detail"]


def test_events_folder_errors_are_one_line(tmp_path: Path, umprov_cli) -> None:
    result = umprov_cli("verify", "--multi-node", "--events", str(tmp_path))
    assert result.exit_code == 4
    assert result.stderr.strip() == (f"umprov: error: {tmp_path}/job.json: missing (the sbatch script "
                                      "writes it once its srun has ended)")
    (tmp_path / "job.json").write_text('{"job_id": 1}')
    result = umprov_cli("verify", "--multi-node", "--events", str(tmp_path))
    assert result.exit_code == 4 and "needs job_id, backend, timeout, nodes" in result.stderr
    result = umprov_cli("verify", "gpu1,", "--multi-node", "--events", str(tmp_path))
    assert result.exit_code == 4 and "--events judges a finished job" in result.stderr
