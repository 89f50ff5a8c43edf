"""The umprov.gpu collection as Ansible users take it: built from roles/ and playbooks/,
installed by ansible-galaxy into a collections path, used by its names (playbooks, roles and
modules, each documented), and clean under ansible-test sanity."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.conftest import REPO

BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow

PLAYBOOKS = ("site", "preflight", "driver", "docker", "toolkit", "rolling", "verify", "deploy")
MODULES = ("gpu_preflight_facts", "apt_source_dpkg", "nvidia_container_toolkit_daemon_json",
           "gpu_verify", "pytorch_container")


@pytest.fixture(scope="module")
def collection(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """The built tarball installed into a collections path; the environment that finds it."""
    tmp = tmp_path_factory.mktemp("collection")
    proc = subprocess.run([sys.executable, str(REPO / "collection" / "build.py"),
                           "--output-path", str(tmp / "dist"), "--build-dir", str(tmp / "build")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    tarball = Path(proc.stdout.strip().splitlines()[-1])
    path = tmp / "collections"
    proc = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "install", "-p", str(path),
                           str(tarball)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(path), "ANSIBLE_ROLES_PATH": "",
           "ANSIBLE_CONFIG": ""}
    return tarball, env


def run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, cwd=cwd)


def test_the_tarball_carries_the_roles_modules_playbooks_and_the_agent(collection):
    tarball, _env = collection
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
    for role in (p.name for p in (REPO / "roles").iterdir()):
        assert f"roles/{role}/meta/argument_specs.yml" in names
        assert not any(n.startswith(f"roles/{role}/library") for n in names)
    assert {f"plugins/modules/{m}.py" for m in MODULES} <= names
    assert {f"playbooks/{p}.yml" for p in PLAYBOOKS} <= names
    assert "roles/gpu_agent/files/agent.pyz" in names
    assert "meta/runtime.yml" in names


def test_every_page_the_collection_cites_ships_in_it_and_no_address_is_made_up(collection):
    tarball, _env = collection
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
        texts = [tar.extractfile(m).read().decode(errors="replace") for m in tar.getmembers()
                 if m.isfile() and not m.name.endswith(".pyz")]
        manifest = json.loads(tar.extractfile("MANIFEST.json").read())
    cited = {c for text in texts for c in re.findall(r"\bdocs/[\w-]+\.md\b", text)}
    assert {"docs/roles.md", "docs/verify-checks.md"} <= cited <= names
    assert "example" not in json.dumps(manifest["collection_info"])


def test_every_module_and_role_is_documented(collection, tmp_path):
    _tarball, env = collection
    for module in MODULES:
        proc = run([str(BIN / "ansible-doc"), "-t", "module", f"umprov.gpu.{module}"], env, tmp_path)
        assert proc.returncode == 0 and "EXAMPLES" in proc.stdout, proc.stderr
    for role in (p.name for p in (REPO / "roles").iterdir()):
        proc = run([str(BIN / "ansible-doc"), "-t", "role", f"umprov.gpu.{role}"], env, tmp_path)
        assert proc.returncode == 0 and "options" in proc.stdout.lower(), (role, proc.stderr)


def test_the_playbooks_and_roles_are_used_by_their_names_from_any_folder(collection, tmp_path):
    """No clone, no ansible.cfg: the collection's playbooks find their own roles, and a user's
    playbook names them."""
    _tarball, env = collection
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    gpu01:\n      ansible_host: 127.0.0.1\n")
    for playbook in PLAYBOOKS:
        proc = run([str(BIN / "ansible-playbook"), "-i", "hosts.yml", "--syntax-check",
                    f"umprov.gpu.{playbook}"], env, tmp_path)
        assert proc.returncode == 0, (playbook, proc.stdout + proc.stderr)
    (tmp_path / "mine.yml").write_text(
        "- hosts: all\n  serial: 2\n  max_fail_percentage: 25\n  roles:\n"
        "    - umprov.gpu.nvidia_driver\n    - role: umprov.gpu.gpu_verify\n"
        "      vars: {gpu_verify_mode: quick}\n")
    proc = run([str(BIN / "ansible-playbook"), "-i", "hosts.yml", "--syntax-check", "mine.yml"],
               env, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ansible_test_sanity_is_clean():
    """Every sanity test ansible-test has for this Python, each in its own virtual environment
    (it installs their tools from the package index)."""
    proc = subprocess.run([sys.executable, str(REPO / "collection" / "sanity.py")],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
