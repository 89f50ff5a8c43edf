"""A real Slurm cluster in the lab (`umprov lab up --slurm`): Debian 12's slurmctld and slurmd,
and umprov's rolling change and health check acting through them.

One 4-host Slurm lab serves the module (tests/lab/conftest.py's `slurm_lab`). The lab hosts have
no GPU: a healthy node is one whose passive checks pass expecting none (the inventory's
`umprov_expected_gpus: 0`); a host given `umprov_expected_gpus: 1` in a copy of the inventory is
a sick node, found by the real checks, no result faked. Every verdict is read back from Slurm
itself (`sinfo`, on the controller).
"""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.lab.conftest import SlurmLab

pytestmark = pytest.mark.lab

SLURM_LAB = "pytest-slurm"
SLURM_HOSTS = 4


def test_lab_up_slurm_gives_a_cluster_whose_nodes_are_idle_and_run_jobs(slurm_lab: SlurmLab):
    assert slurm_lab.nodes_now() == {n: ("idle", "") for n in slurm_lab.nodes}
    # a job through munge and slurmctld, from a node as the lab user
    ran = slurm_lab.ssh(slurm_lab.nodes[0], f"srun -N {SLURM_HOSTS} hostname")
    assert ran.returncode == 0, ran.stderr
    assert sorted(ran.stdout.split()) == sorted(slurm_lab.nodes)


def test_a_restarted_host_comes_back_to_the_cluster_by_itself(slurm_lab: SlurmLab):
    # munged and slurmd are enabled units, and ReturnToService=2 takes the node back
    node, container = slurm_lab.nodes[-1], slurm_lab.up["hosts"][-1]["container"]
    subprocess.run(["docker", "restart", "-t", "5", container], check=True, capture_output=True)
    deadline = time.monotonic() + 90
    while slurm_lab.nodes_now().get(node) != ("idle", "") and time.monotonic() < deadline:
        time.sleep(1)
    assert slurm_lab.nodes_now()[node] == ("idle", "")
