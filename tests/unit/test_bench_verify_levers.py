"""bench/verify_levers.sh, issue 38's open measurements in one device call, with python3
stood in for by a script that records how it was called."""

from __future__ import annotations

import os
import subprocess
import zipfile
from pathlib import Path

from tests import fakebin
from tests.conftest import REPO

SCRIPT = REPO / "bench" / "verify_levers.sh"


def levers(tmp_path: Path, *stages: str, old: str = "") -> tuple[subprocess.CompletedProcess[str],
                                                                  Path]:
    bin_dir, out = tmp_path / "bin", tmp_path / "out"
    fakebin.shell(bin_dir, "python3", 'echo "args: $*"\necho "nvls: $NCCL_NVLS_ENABLE"\n')
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(out),
           "OLD": old}
    run = subprocess.run([str(SCRIPT), *stages], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=60)
    return run, out


def test_an_unknown_stage_is_refused_before_anything_runs(tmp_path):
    run, out = levers(tmp_path, "costs", "figurs")
    assert run.returncode == 2
    assert run.stderr.strip() == ("verify_levers.sh: unknown stage 'figurs' "
                                  "(costs figures gputests)")
    assert not out.exists()


def test_the_figures_stage_runs_the_ab_only_against_an_old_build_that_is_there(tmp_path):
    run, out = levers(tmp_path, "costs", "figures", old="no-such-agent.pyz")
    assert run.returncode == 0, run.stderr
    assert "agent_costs.py" in (out / "costs.txt").read_text()
    figures = (out / "figures.txt").read_text()
    assert "verify_figures.py --runs 5" in figures and "--old" not in figures
    assert "nvls: 0" in figures
    old = tmp_path / "agent-old.pyz"
    old.write_bytes(b"")
    run, out = levers(tmp_path, "figures", old=str(old))
    assert f"--old {old} --ab 2" in (out / "figures.txt").read_text()


def test_agent_at_builds_an_earlier_commits_agent_and_refuses_an_unknown_one(tmp_path):
    script = REPO / "bench" / "agent_at.sh"
    env = {**os.environ, "ABOLD": str(tmp_path)}
    run = subprocess.run([str(script), "HEAD"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    built = Path(run.stdout.strip())
    assert built.parent == tmp_path and built.name.startswith("agent-") and built.stat().st_size
    assert "umprov_agent/cli.py" in zipfile.ZipFile(built).namelist()
    run = subprocess.run([str(script), "no-such-rev"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 2
    assert run.stderr.startswith("agent_at.sh: no commit 'no-such-rev' in /")
    assert len(run.stderr.strip().splitlines()) == 1
