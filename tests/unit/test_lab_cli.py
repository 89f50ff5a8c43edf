"""`umprov lab` comes from the umprov-lab distribution, through the entry point group
umprov.commands: listed in umprov's help, loaded only when used, and as light as a built-in."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from umprov.cli import COMMANDS, plugin_commands

LAB_COMMANDS = ("up", "status", "down", "image", "snapshot")


def test_lab_is_a_plugin_not_a_built_in() -> None:
    assert "lab" not in COMMANDS
    assert plugin_commands()["lab"].value == "umprov_lab.cli:lab"


def test_help_lists_the_lab(umprov_cli) -> None:
    result = umprov_cli("--help")
    assert result.exit_code == 0
    # Named from its entry point alone: umprov --help imports no plugin.
    assert "lab " in result.stdout and "umprov-lab" in result.stdout


@pytest.mark.parametrize("command", LAB_COMMANDS)
def test_each_lab_command_has_help(umprov_cli, command: str) -> None:
    result = umprov_cli("lab", command, "--help")
    assert result.exit_code == 0, result.output
    assert "Usage: umprov lab " in result.stdout


def test_lab_image_takes_what_image_build_lab_took(umprov_cli) -> None:
    result = umprov_cli("lab", "image", "--help")
    assert "--tag" in result.stdout and "--torch-wheel" in result.stdout
    assert "--json" in result.stdout


def test_lab_help_imports_no_heavy_library() -> None:
    code = (
        "import sys\n"
        "from umprov.cli import run\n"
        "for args in (['--help'], ['lab', '--help'], *[['lab', c, '--help'] for c in %r]):\n"
        "    run(args)\n"
        "heavy = sorted(m for m in sys.modules\n"
        "               if m.split('.')[0] in ('docker', 'paramiko', 'rich', 'yaml', 'ansible',\n"
        "                                       'cryptography', 'torch'))\n"
        "print('HEAVY=' + ','.join(heavy))\n"
    ) % (LAB_COMMANDS,)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip().splitlines()[-1]
    assert out == "HEAVY=", f"lab help imported: {out}"


def test_lab_image_builds_on_the_lab_base_with_the_cpu_wheel(
    umprov_cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """What `umprov lab image` asks umprov's image builder for (the build itself is a lab test)."""
    from umprov import image
    from umprov_lab import engine, host_image
    from umprov_lab.image import LAB_TAG

    wheel = tmp_path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    wheel.touch()
    monkeypatch.setenv("UMPROV_LAB_TORCH_WHEEL", str(wheel))
    monkeypatch.setattr(engine, "docker_engine", lambda *a, **k: "client")
    monkeypatch.setattr(host_image, "ensure_host_image", lambda client, progress: ("base:1", False))
    asked: list[dict] = []

    def build(client, **kwargs):
        asked.append({"client": client, **kwargs})
        return image.BuildResult(kwargs["tag"], "sha256:" + "0" * 64, kwargs["base"], 1, 1.0,
                                 tmp_path, 3)

    monkeypatch.setattr(image, "build", build)
    result = umprov_cli("lab", "image", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["tag"] == LAB_TAG
    assert asked[0]["client"] == "client"
    assert (asked[0]["base"], asked[0]["tag"], asked[0]["torch_wheel"]) == (
        "base:1", LAB_TAG, wheel)
    other = tmp_path / "w.whl"
    other.touch()
    assert umprov_cli("lab", "image", "--tag", "t:1", "--torch-wheel", str(other)).exit_code == 0
    assert (asked[1]["tag"], asked[1]["torch_wheel"]) == ("t:1", other)
