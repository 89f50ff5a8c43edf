"""The roles, playbooks and inventory pass yamllint, ansible-lint (production) and a syntax check."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.cost(60)


def _tool(name: str) -> str | None:
    local = BIN / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which(name)


def _run(argv: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), NO_COLOR="1")
    return subprocess.run(
        argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env, check=False
    )


def test_yamllint_is_clean() -> None:
    tool = _tool("yamllint")
    if tool is None:
        pytest.skip("yamllint is not installed (pip install -e '.[dev]')")
    proc = _run([tool, "--strict", "roles", "playbooks", "inventory", ".yamllint", ".ansible-lint"])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ansible_lint_production_profile_is_clean() -> None:
    tool = _tool("ansible-lint")
    if tool is None:
        pytest.skip("ansible-lint is not installed (pip install -e '.[dev]')")
    proc = _run([tool, "--offline", "--profile", "production", "--nocolor",
                 "roles", "playbooks", "inventory"])
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]


@pytest.mark.parametrize(
    "playbook", ["site.yml", "preflight.yml", "driver.yml", "docker.yml", "toolkit.yml"]
)
def test_playbook_syntax(playbook: str) -> None:
    tool = _tool("ansible-playbook")
    if tool is None:
        pytest.skip("ansible-core is not installed")
    proc = _run([tool, "--syntax-check", "-i", "inventory/hosts.yml", f"playbooks/{playbook}"],
                timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("cwd", ["playbooks", "/"])
def test_plain_ansible_finds_the_roles_from_any_folder(cwd: str) -> None:
    """No ansible.cfg where it runs (none in playbooks/ or /): playbooks/roles links to roles/."""
    tool = shutil.which("ansible-playbook", path=str(Path(sys.executable).parent))
    if tool is None:
        pytest.skip("ansible-core is not installed")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    for playbook in ("site.yml", "rolling.yml", "verify.yml"):
        proc = subprocess.run([tool, "--syntax-check", "-i", "gpu01,", str(ROOT / "playbooks" /
                               playbook)], cwd=ROOT / cwd, env=env, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_default_is_in_argument_specs() -> None:
    import yaml

    for role in sorted((ROOT / "roles").iterdir()):
        defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {}
        specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())
        options = specs["argument_specs"]["main"]["options"]
        assert set(defaults) == set(options), role.name
        for name, opt in options.items():
            assert name.startswith(role.name + "_"), name
            assert opt.get("type") and opt.get("description"), name
            assert opt.get("default") == defaults[name], name


@pytest.mark.parametrize(
    ("distribution", "version", "major", "expected"),
    [
        ("Debian", "12.11", "12", "debian12"),  # Ansible reports Debian's point release
        ("Debian", "13.2", "13", "debian13"),
        ("Ubuntu", "24.04", "24", "ubuntu2404"),
        ("Ubuntu", "22.04", "22", "ubuntu2204"),
    ],
)
def test_cuda_repo_distro_default_names_nvidia_folders(
    distribution: str, version: str, major: str, expected: str
) -> None:
    """The default's folder in NVIDIA's CUDA repository, rendered by Ansible's own templar."""
    import yaml
    from ansible.template import Templar, trust_as_template

    defaults = yaml.safe_load((ROOT / "roles/nvidia_driver/defaults/main.yml").read_text())
    facts = {"distribution": distribution, "distribution_version": version,
             "distribution_major_version": major, "architecture": "x86_64"}
    templar = Templar(loader=None, variables={"ansible_facts": facts})
    # Ansible 2.19 templates only trusted text, as it trusts what it reads from role files.
    text = trust_as_template(defaults["nvidia_driver_cuda_repo_distro"])
    assert templar.template(text) == expected


def test_one_list_of_supported_targets() -> None:
    """gpu_preflight_supported_os is the list; every role's galaxy platforms, ansible.cfg and the
    README name the same systems and no other."""
    import yaml

    supported = yaml.safe_load((ROOT / "roles/gpu_preflight/defaults/main.yml").read_text())[
        "gpu_preflight_supported_os"]
    assert supported == {"Ubuntu": ["22.04", "24.04"], "Debian": ["12"]}
    codenames = {"Ubuntu": {"jammy", "noble"}, "Debian": {"bookworm"}}
    for meta in sorted((ROOT / "roles").glob("*/meta/main.yml")):
        platforms = yaml.safe_load(meta.read_text())["galaxy_info"]["platforms"]
        assert {p["name"]: set(p["versions"]) for p in platforms} == codenames, meta
    cfg = (ROOT / "ansible.cfg").read_text()
    assert "Debian 12, Ubuntu 22.04 and 24.04" in cfg and "RHEL" not in cfg
    assert "Debian 12 or Ubuntu 22.04/24.04" in (ROOT / "README.md").read_text()
