"""Value rules beyond types (roles/gpu_preflight/files/value_rules.yml): one file, read by
`umprov inventory check` and by the preflight play, which therefore judge every value alike."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from umprov.errors import ConfigError, ExitCode
from umprov.inventory import check_format, value_rules

MODULE = REPO / "roles" / "gpu_preflight" / "library" / "gpu_preflight_facts.py"
RULES_FILE = REPO / "roles" / "gpu_preflight" / "files" / "value_rules.yml"

# (variable, value, valid)
CASES = [
    ("umprov_expected_gpus", 0, True),
    ("umprov_expected_gpus", 8, True),
    ("umprov_expected_gpus", "8", True),
    ("umprov_expected_gpus", -1, False),
    ("umprov_ssh_port", 2222, True),
    ("umprov_ssh_port", 0, False),
    ("umprov_ssh_port", 65536, False),
    ("umprov_internode_busbw_gbps", 12.5, True),
    ("umprov_internode_busbw_gbps", -0.5, False),
    ("nvidia_driver_branch", "570", True),
    ("nvidia_driver_branch", 580, True),
    ("nvidia_driver_branch", "57x", False),
    ("nvidia_driver_branch", "570.133.20", False),
    ("nvidia_driver_version", "", True),
    ("nvidia_driver_version", "570.133.20", True),
    ("nvidia_driver_version", "580.95.05-1", True),
    ("nvidia_driver_version", "535.247.01-0ubuntu1", True),
    ("nvidia_driver_version", "latest", False),
    ("nvidia_driver_version", "570", False),
    ("nvidia_driver_reboot_timeout", 1200, True),
    ("nvidia_driver_reboot_timeout", 0, False),
    ("nvidia_driver_apt_lock_timeout", 0, True),
    ("nvidia_driver_apt_lock_timeout", -5, False),
    ("nvidia_container_toolkit_version", "1.17.8-1", True),
    ("nvidia_container_toolkit_version", "stable", False),
    ("gpu_preflight_command_timeout", 30, True),
    ("gpu_preflight_command_timeout", True, False),
    ("umprov_rolling_batch", "25%", True),
    ("umprov_rolling_batch", "100%,3", True),
    ("umprov_rolling_batch", "150%", False),  # more hosts than there are
    ("umprov_rolling_batch", "0%", False),
]


@pytest.fixture(scope="module")
def module() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_preflight_facts", MODULE)
    assert spec and spec.loader
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


@pytest.mark.parametrize(("name", "value", "valid"), CASES)
def test_umprov_and_the_preflight_module_agree(module, name, value, valid):
    import yaml

    rules = yaml.safe_load(RULES_FILE.read_text())
    assert (value_rules().problem(name, value) is None) is valid
    assert (module.value_problems(rules, {name: value}) == []) is valid


def test_every_ruled_variable_is_a_known_variable():
    from umprov.inventory import variable_specs

    assert set(value_rules().variables) <= set(variable_specs())


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("umprov_expected_gpus: -1", "is '-1', expected a whole number, 0 or more"),
        ("nvidia_driver_branch: '57x'", 'expected an NVIDIA driver branch such as "570"'),
        ("nvidia_driver_version: latest", "expected an NVIDIA driver version"),
        ("umprov_rendezvous_port: 70000", "expected a port number from 1 to 65535"),
    ],
)
def test_inventory_check_applies_the_rules(tmp_path, umprov_cli, line, expected):
    path = tmp_path / "hosts.yml"
    path.write_text(f"all:\n  hosts:\n    gpu1:\n      {line}\n")
    result = umprov_cli("inventory", "check", str(path))
    assert result.exit_code == ExitCode.INVENTORY
    assert f"{path}:4: variable '{line.split(':')[0]}' on host 'gpu1'" in result.stderr
    assert expected in result.stderr


def test_a_templated_value_is_judged_templated(tmp_path, umprov_cli):
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  vars: {n: 4}\n  hosts:\n    gpu1:\n"
                    "      umprov_expected_gpus: '{{ n - 5 }}'\n")
    result = umprov_cli("inventory", "check", str(path))
    assert result.exit_code == ExitCode.INVENTORY
    assert "is '-1'" in result.stderr and "from the template '{{ n - 5 }}'" in result.stderr


@pytest.mark.parametrize("size", ["16g", "512m", "1073741824", "1gb", "2.5G", "64k"])
def test_sizes_docker_reads(size):
    assert check_format("size", size, "--shm-size") == size


@pytest.mark.parametrize("size", ["", "16 gigs", "-1g", "1t", "g", "16gg"])
def test_sizes_docker_refuses(size):
    with pytest.raises(ConfigError, match="--shm-size: .* is not a size such as 16g"):
        check_format("size", size, "--shm-size")


def test_the_preflight_play_refuses_a_bad_value_before_anything(tmp_path):
    """The real role on this machine (connection local): the module fails on the values before
    it reads anything, with the rules file's words."""
    (tmp_path / "play.yml").write_text(textwrap.dedent("""
        - name: Preflight only
          hosts: all
          gather_facts: false
          roles: [gpu_preflight]
    """))
    (tmp_path / "hosts.ini").write_text(
        f"[gpus]\nlocalhost ansible_connection=local ansible_python_interpreter={sys.executable}"
        " umprov_expected_gpus=-1 nvidia_driver_branch=57x\n")
    done = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "hosts.ini", "play.yml"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path),
             "ANSIBLE_ROLES_PATH": str(REPO / "roles"), "ANSIBLE_NOCOLOR": "1",
             "LANG": "C.UTF-8"},
    )
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert ("Bad value(s): nvidia_driver_branch is '57x', expected an NVIDIA driver branch "
            "such as \\\"570\\\"; umprov_expected_gpus is '-1', expected a whole number, 0 or "
            "more.") in done.stdout
