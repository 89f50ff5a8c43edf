"""The agent's children keep compiled bytecode in a private cache of the agent's, so torch is
imported from bytecode on hosts whose images ship none (see runner.bytecode_cache)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from umprov.verify.agent import runner


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    return tmp_path


def test_children_write_bytecode_only_into_the_private_cache(cache_home: Path) -> None:
    env = runner.child_env()
    cache = Path(env["PYTHONPYCACHEPREFIX"])
    assert cache == cache_home / "umprov-agent" / "pycache"
    assert "PYTHONDONTWRITEBYTECODE" not in env
    assert oct(cache.stat().st_mode & 0o777) == "0o700"
    assert oct(cache.parent.stat().st_mode & 0o777) == "0o700"


def test_a_cache_others_can_write_is_not_used(cache_home: Path) -> None:
    shared = cache_home / "umprov-agent" / "pycache"
    shared.mkdir(parents=True)
    shared.chmod(0o777)
    env = runner.child_env()
    assert "PYTHONPYCACHEPREFIX" not in env
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"  # the user's setting stands


def test_a_prefix_the_user_chose_is_kept(cache_home: Path, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(cache_home / "mine"))
    env = runner.child_env()
    assert env["PYTHONPYCACHEPREFIX"] == str(cache_home / "mine")
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"


def test_no_cache_where_none_can_be_made(tmp_path: Path, monkeypatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    assert "PYTHONPYCACHEPREFIX" not in runner.child_env()


def test_the_cache_is_used_by_a_child(cache_home: Path) -> None:
    """A real child: what it imports is compiled into the cache, not beside the source."""
    import subprocess
    import sys

    source = cache_home / "src"
    source.mkdir()
    (source / "probe_mod.py").write_text("VALUE = 1\n")
    subprocess.run([sys.executable, "-c", "import probe_mod"], env={
        **runner.child_env(), "PYTHONPATH": str(source)}, check=True)
    cached = list((cache_home / "umprov-agent" / "pycache").rglob("probe_mod*.pyc"))
    assert cached and not (source / "__pycache__").exists()
    assert os.stat(cached[0]).st_uid == os.getuid()
