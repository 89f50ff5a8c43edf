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
        "managed_levers.sh: unknown stage 'expandible' (early gradroom curve deepspeed homes discard expandable "
        "lag optims mlp tight headroom gputests)"]
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
    step = (copy / "umprov_managed_grads.py").read_text()
    assert "\nLAG = 1 << 30" in step
    original = (REPO / "docker/pytorch-cuda/managed/umprov_managed_grads.py").read_text()
    assert step.replace("LAG = 1 << 30", "LAG = 256 << 20", 1) == original


def test_the_optimizer_mlp_and_tight_stages_run_their_own_rows_and_sizes(recorded):
    env, out = recorded
    run = levers(env, "optims", "mlp", "tight")
    assert run.returncode == 0, run.stderr
    optims = (out / "optims.txt").read_text().split()
    rows = optims[optims.index("--only") + 1].split(",")
    assert {r.split(":", 1)[1] for r in rows} == {"adamw_fused:fp32", "sgd:fp32", "adamw:bf16"}
    assert {r.split(":")[0] for r in rows} == {"pool_grads_down", "torchao"}
    mlp = (out / "mlp.txt").read_text().split()
    assert mlp[mlp.index("--model") + 1] == "mlp" and "fit:default" in mlp[mlp.index("--only") + 1]
    tight = (out / "tight.txt").read_text().split()
    left = [tight[i + 1] for i, a in enumerate(tight) if a == "--left-gib"]
    assert left[-1] == "9"  # the last one is the one argparse keeps


def levers_saying_headroom(env: dict, stage: str) -> subprocess.CompletedProcess[str]:
    """``stage`` with a python3 that also says the headroom it was given."""
    fakebin.shell(Path(env["PATH"].split(":")[0]), "python3",
                  'echo "args: $*"\necho "headroom: ${UMPROV_MANAGED_HEADROOM:-default}"\n')
    return levers(env, stage)


def test_the_headroom_stage_runs_bf16_with_cudas_headroom_and_without(recorded):
    env, out = recorded
    run = levers_saying_headroom(env, "headroom")
    assert run.returncode == 0, run.stderr
    kept, off = (out / "headroom.txt").read_text(), (out / "headroom-off.txt").read_text()
    assert "pool_grads_down:adamw:bf16" in kept and "headroom: default" in kept
    assert "pool_grads_down:adamw:bf16" in off and "headroom: 0" in off
    assert "UMPROV_MANAGED_HEADROOM" not in env


def test_the_gradroom_stage_runs_fp32_gradients_down_with_less_headroom(recorded):
    env, out = recorded
    run = levers_saying_headroom(env, "gradroom")
    assert run.returncode == 0, run.stderr
    kept = (out / "gradroom.txt").read_text()
    none, small = (out / "gradroom-0.txt").read_text(), (out / "gradroom-256m.txt").read_text()
    assert "pool_grads_down:adamw:fp32,torchao:adamw:fp32" in kept and "headroom: default" in kept
    assert "pool_grads_down:adamw:fp32" in none and "headroom: 0\n" in none
    assert "pool_grads_down:adamw:fp32" in small and "headroom: 256m" in small
    assert "torchao" not in none + small


@pytest.mark.parametrize(("build_rc", "fallback"), [(0, "0"), (1, "1")])
def test_the_deepspeed_stage_builds_its_adam_first_and_falls_back_where_it_cannot(
        recorded, build_rc, fallback):
    env, out = recorded
    fakebin.shell(Path(env["PATH"].split(":")[0]), "python3",
                  f'if [ "$1" = -c ]; then echo building; exit {build_rc}; fi\n'
                  'echo "args: $*"\necho "torch_adam: ${UMPROV_BENCH_DS_TORCH_ADAM:-0}"\n')
    run = levers(env, "deepspeed")
    assert run.returncode == 0, run.stderr
    assert "building" in (out / "deepspeed-build.txt").read_text()
    text = (out / "deepspeed.txt").read_text()
    args = text.split()
    rows = set(args[args.index("--only") + 1].split(","))
    assert {"deepspeed:adamw:fp32", "deepspeed:adamw:bf16", "torchao:adamw:fp32",
            "pool_grads_down:adamw:fp32"} <= rows
    assert f"torch_adam: {fallback}" in text
