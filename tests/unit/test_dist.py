"""`make dist` as a new user runs it from a clone: only what building needs (a small build venv,
not the development venv with ruff, ansible-lint and a CPU torch), the five artifacts in the
folder given, and a missing prerequisite named."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests import fakebin
from tests.conftest import REPO
from umprov import __version__

ARTIFACTS = tuple(name.format(v=__version__) for name in (
    "umprov-{v}-py3-none-any.whl", "umprov-{v}.tar.gz", "umprov-gpu-{v}.tar.gz",
    "umprov_lab-{v}-py3-none-any.whl", "umprov_lab-{v}.tar.gz"))


def make(tmp_path: Path, *args: str, timeout: int = 60) -> subprocess.CompletedProcess[str]:
    """make in the clone with no development venv (VENV names a folder that does not exist),
    nothing of it on PATH, the build's folders under ``tmp_path``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    env["PATH"] = ":".join(p for p in env.get("PATH", "/usr/bin:/bin").split(":")
                           if ".venv" not in p)
    return subprocess.run(
        ["make", "-C", str(REPO), "--no-print-directory", f"VENV={tmp_path / 'no-dev-venv'}",
         f"BUILD_DIR={tmp_path / 'build'}", f"DIST={tmp_path / 'dist'}", *args],
        capture_output=True, text=True, timeout=timeout, env=env)


def test_dist_needs_no_development_venv(tmp_path):
    planned = make(tmp_path, "-n", "dist")
    assert planned.returncode == 0, planned.stderr
    assert "no-dev-venv" not in planned.stdout and "[dev]" not in planned.stdout, planned.stdout
    assert "build-requirements.txt" in planned.stdout


def test_dist_without_pythons_venv_module_names_the_package(tmp_path):
    python = fakebin.shell(tmp_path, "python3", "exit 1\n")  # `import ensurepip, venv` fails
    done = make(tmp_path, "dist", f"PYTHON={python}")
    assert done.returncode != 0
    assert "apt-get install python3-venv" in done.stderr, done.stderr
    assert not (tmp_path / "build").exists()


@pytest.mark.slow
def test_dist_builds_the_five_artifacts_in_a_build_venv(tmp_path):
    done = make(tmp_path, "dist", "PYTHON=/usr/bin/python3", timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "dist").iterdir()) == sorted(ARTIFACTS)
    assert not (tmp_path / "no-dev-venv").exists()
    site = next((tmp_path / "build" / "venv" / "lib").glob("python3*/site-packages"))
    assert not {"torch", "ruff", "ansiblelint", "umprov"} & {p.name for p in site.iterdir()}
