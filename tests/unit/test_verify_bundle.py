"""The agent as one file: the zipapp umprov builds from umprov/verify/agent/ and caches.

It must run with a bare Python (no umprov, no third-party package), carry the profiles, be
rebuilt only when the package changes, and the package itself must import nothing but the
standard library and itself (torch, nvidia-ml-py and PyYAML only inside the functions that
use them, where they are there).
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from umprov.verify import report
from umprov.verify.agent.profiles import BUILTIN_PROFILES
from umprov.verify.bundle import AGENT_DIR, agent_zipapp

FAKES = Path(__file__).resolve().parent / "verify_fakes"
BARE = [sys.executable, "-I", "-S"]  # no site-packages: neither umprov nor torch importable


def test_the_zipapp_runs_on_a_bare_python(tmp_path):
    pyz = agent_zipapp(cache=tmp_path)
    shown = subprocess.run([*BARE, str(pyz), "--help"], capture_output=True, text=True,
                           timeout=60, cwd=tmp_path, env={"PATH": os.environ["PATH"]})
    assert shown.returncode == 0, shown.stderr
    assert "--expected-gpus" in shown.stdout and "--profile-file" in shown.stdout
    ran = subprocess.run([*BARE, str(pyz), "--json", "-", "--quiet"], capture_output=True,
                         text=True, timeout=60, cwd=tmp_path, env={"PATH": os.environ["PATH"]})
    assert ran.returncode == 13, ran.stderr
    doc = json.loads(ran.stdout)
    assert report.validate(doc) == []
    assert "cannot import torch" in doc["records"][0]["detail"]


def test_the_zipapp_carries_the_profiles(tmp_path):
    pyz = agent_zipapp(cache=tmp_path)
    names = zipfile.ZipFile(pyz).namelist()
    assert "__main__.py" in names and "umprov_agent/profiles.json" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    listed = subprocess.run([*BARE, str(pyz), "--list-profiles"], capture_output=True,
                            text=True, timeout=60)
    assert json.loads(listed.stdout) == BUILTIN_PROFILES


def test_the_zipapp_is_cached_by_content(tmp_path):
    cache = tmp_path / "cache"
    first = agent_zipapp(cache=cache)
    stamp = first.stat().st_mtime_ns
    assert agent_zipapp(cache=cache) == first and first.stat().st_mtime_ns == stamp
    assert [p.name for p in cache.iterdir()] == [first.name]  # no temporary file left
    edited = tmp_path / "agent"
    shutil.copytree(AGENT_DIR, edited, ignore=shutil.ignore_patterns("__pycache__"))
    (edited / "cli.py").write_text((edited / "cli.py").read_text() + "\n# an edit\n")
    second = agent_zipapp(edited, cache=cache)
    assert second != first and second.is_file() and first.is_file()


def test_the_cache_lives_in_the_state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("UMPROV_STATE_DIR", str(tmp_path / "state"))
    pyz = agent_zipapp()
    assert pyz.parent == tmp_path / "state" / "agent" and pyz.suffix == ".pyz"


def test_the_package_runs_as_a_module_too(tmp_path):
    """``python -m umprov.verify.agent`` starts its children the same way (with -m)."""
    out = subprocess.run([sys.executable, "-m", "umprov.verify.agent", "--json", "-", "--quiet"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(FAKES / "cpu_torch")})
    doc = json.loads(out.stdout)
    assert out.returncode == 13 and report.validate(doc) == []
    assert "CPU-only build" in doc["records"][0]["detail"]  # the discover child ran


def _imports(tree: ast.AST) -> list[tuple[str, bool]]:
    """(top-level module, imported at module level) for each absolute import."""
    top_level = {id(n) for n in getattr(tree, "body", [])}
    guarded = {id(n) for stmt in getattr(tree, "body", []) if isinstance(stmt, ast.If)
               for n in ast.walk(stmt)}  # `if TYPE_CHECKING:` blocks
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        at_load = id(node) in top_level and id(node) not in guarded
        out += [(name.split(".")[0], at_load) for name in names]
    return out


@pytest.mark.parametrize("module", sorted(p.name for p in AGENT_DIR.glob("*.py")))
def test_the_agent_imports_only_the_standard_library(module):
    tree = ast.parse((AGENT_DIR / module).read_text(), feature_version=(3, 8))  # Python 3.8+
    for name, at_load in _imports(tree):
        if name in sys.stdlib_module_names or name == "__future__":
            continue
        assert not at_load, f"{module} imports {name} when it loads"
        # umprov_managed: the image's allocator (managed.oversubscription), where present
        assert name in ("torch", "pynvml", "yaml", "umprov_managed"), f"{module} imports {name}"


def test_the_zipapp_runs_on_an_old_python(tmp_path):
    """Images ship old interpreters (3.8 and up): set UMPROV_TEST_OLD_PYTHON to one to run it."""
    old = os.environ.get("UMPROV_TEST_OLD_PYTHON")
    if not old:
        pytest.skip("set UMPROV_TEST_OLD_PYTHON to a Python 3.8 or 3.9 to run this")
    pyz = agent_zipapp(cache=tmp_path)
    listed = subprocess.run([old, "-I", str(pyz), "--list-profiles"], capture_output=True,
                            text=True, timeout=60)
    assert json.loads(listed.stdout) == BUILTIN_PROFILES, listed.stderr
    ran = subprocess.run([old, str(pyz), "--json", "-", "--quiet"], capture_output=True,
                         text=True, timeout=60, cwd=tmp_path,
                         env={"PATH": os.environ["PATH"], "PYTHONPATH": str(FAKES / "cpu_torch")})
    doc = json.loads(ran.stdout)
    assert ran.returncode == 13 and report.validate(doc) == []
    assert "CPU-only build" in doc["records"][0]["detail"]  # its discover child ran
