"""The plugin lookup reads entry_points.txt beside each distribution's metadata, as
importlib.metadata would, without importing importlib.metadata on `umprov --help`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from umprov.cli import plugins


def dist(site: Path, folder: str, name: str, entry_points: str) -> None:
    meta = site / folder
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1\n\nbody\n")
    (meta / "entry_points.txt").write_text(entry_points)


@pytest.fixture
def sites(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    monkeypatch.setattr(sys, "path", [str(first), str(tmp_path / "missing"), str(second)])
    plugins.installed.cache_clear()
    yield first, second
    plugins.installed.cache_clear()


def test_reads_the_group_and_only_the_group(sites) -> None:
    first, _ = sites
    dist(first, "acme_tools-1.0.dist-info", "acme-tools",
         "[console_scripts]\nacme = acme:main\n\n[umprov.commands]\n"
         "# a comment\nfleet = acme.fleet:cli\nburn = acme.burn:group.cmd\n\n[other]\nx = y:z\n")
    dist(first, "plain-2.0.dist-info", "plain", "[console_scripts]\nplain = plain:main\n")
    found = plugins.installed()
    assert [(p.name, p.value, p.source) for p in found] == [
        ("fleet", "acme.fleet:cli", "acme-tools"), ("burn", "acme.burn:group.cmd", "acme-tools")]


def test_first_distribution_of_a_name_on_sys_path_wins(sites) -> None:
    first, second = sites
    dist(first, "acme_tools-2.0.dist-info", "acme-tools", "[umprov.commands]\nnew = acme:new\n")
    dist(second, "acme_tools-1.0.dist-info", "acme-tools", "[umprov.commands]\nold = acme:old\n")
    dist(second, "other-1.0.egg-info", "other", "[umprov.commands]\nmore = other:more\n")
    assert [p.name for p in plugins.installed()] == ["new", "more"]


def test_load_resolves_module_and_attribute_path(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "plugmod.py").write_text("class group:\n    cmd = 'the command'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert plugins.Plugin("x", "plugmod:group.cmd", "d").load() == "the command"


def test_help_does_not_import_importlib_metadata() -> None:
    code = ("import sys\nfrom umprov.cli import run\nrun(['--help'])\n"
            "print('META=' + str('importlib.metadata' in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip().splitlines()[-1]
    assert out == "META=False"
