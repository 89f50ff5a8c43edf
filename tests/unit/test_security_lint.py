"""ruff's security rules (flake8-bandit, `S`) are on for umprov/ and find nothing there."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_security_rules_are_selected_for_umprov() -> None:
    lint = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert "S" in lint["select"]
    assert not [r for r in lint.get("ignore", []) if r.startswith("S")]
    for pattern, rules in lint.get("per-file-ignores", {}).items():
        if not pattern.startswith(("tests", "bench")):
            assert not [r for r in rules if r.startswith("S")], pattern


def test_umprov_is_clean_under_the_security_rules() -> None:
    local = Path(sys.executable).parent / "ruff"
    ruff = str(local) if os.access(local, os.X_OK) else shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    proc = subprocess.run(
        [ruff, "check", "--select", "S", "--output-format", "concise", "--no-cache", "umprov"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
