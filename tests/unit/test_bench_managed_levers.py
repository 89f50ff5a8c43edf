"""bench/managed_levers.sh, the open measurements of issue 36 (its GPU runs: bench/README), with
python3 stood in for by a script that records how it was called."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests import fakebin
from tests.conftest import REPO

SCRIPT = REPO / "bench" / "managed_levers.sh"


@pytest.fixture
def recorded(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose python3 prints its arguments and the allocator setting it got."""
    bin_dir = tmp_path / "bin"
    fakebin.shell(bin_dir, "python3",
                  'echo "args: $*"\n'
                  'echo "conf: ${PYTORCH_CUDA_ALLOC_CONF:-none} nvls: $NCCL_NVLS_ENABLE"\n')
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(out)}
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    return env, out


def levers(env: dict[str, str], *stages: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *stages], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)


def test_an_unknown_stage_is_refused_before_anything_runs(recorded):
    env, out = recorded
    run = levers(env, "homes", "expandible")
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "managed_levers.sh: unknown stage 'expandible' (early homes discard expandable lag gputests)"]
    assert not out.exists()


def test_each_speed_stage_keeps_torchaos_row_and_its_own_setting(recorded):
    env, out = recorded
    run = levers(env, "expandable", "homes")  # the setting must not outlive its stage
    assert run.returncode == 0, run.stderr
    homes, expandable = (out / "homes.txt").read_text(), (out / "expandable.txt").read_text()
    for text in (homes, expandable):
        assert "torchao:adamw:fp32" in text and "nvls: 0" in text
    assert "conf: none" in homes
    assert "conf: expandable_segments:True" in expandable


def test_the_lag_stage_measures_a_copy_with_1_gib_in_flight(recorded):
    env, out = recorded
    run = levers(env, "lag")
    assert run.returncode == 0, run.stderr
    args = (out / "lag.txt").read_text().splitlines()[0].split()
    copy = Path(args[args.index("--managed") + 1])
    step = (copy / "umprov_managed_step.py").read_text()
    assert "\nLAG = 1 << 30" in step
    original = (REPO / "docker/pytorch-cuda/managed/umprov_managed_step.py").read_text()
    assert step.replace("LAG = 1 << 30", "LAG = 256 << 20", 1) == original
