"""The driver role's version decisions (tasks/install-Debian.yml), rendered by Ansible's templar
from the task file itself with real `apt-cache policy` output: the paths the lab's one-branch
repository never took. Backslashes in folded YAML blocks reach Jinja as written, which is how a
doubled one once made a regex match nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

ROLES = Path(__file__).resolve().parents[2] / "roles"
TASKS = yaml.safe_load((ROLES / "nvidia_driver/tasks/install-Debian.yml").read_text())

CUDA_POLICY = """\
nvidia-open:
  Installed: {installed}
  Candidate: 590.48.01-1
  Version table:
     590.48.01-1 500
        500 http://repo/compute/cuda/repos/debian12/x86_64  Packages
     580.95.05-1 500
        500 http://repo/compute/cuda/repos/debian12/x86_64  Packages
 *** 580.82.07-1 100
        100 /var/lib/dpkg/status
"""

DKMS_POLICY = """\
nvidia-open-kernel-dkms:
  Installed: (none)
  Candidate: 535.261.03-1
  Version table:
     535.261.03-1 500
        500 http://deb.debian.org/debian bookworm/contrib amd64 Packages
"""


def _task(name: str) -> dict[str, Any]:
    return next(t for t in TASKS if t.get("name", "").startswith(name))


def render(expr: Any, **variables: Any) -> Any:
    from ansible.template import Templar, trust_as_template

    return Templar(loader=None, variables=variables).template(trust_as_template(expr))


def decide(policy: str, *, version: str = "", others: list[str] | None = None) -> dict[str, Any]:
    """The set_fact of 'Work out the driver version to install', as the role computes it."""
    task = _task("Work out the driver version to install")
    variables: dict[str, Any] = {
        "nvidia_driver_branch": "580" if "nvidia-open:" in policy else "535",
        "nvidia_driver_version": version,
        "apt_source_policy": {"stdout": policy},  # apt_source's fetch, the first lookup
        "__nvidia_driver_policy_again": {"skipped": True, "stdout": ""},
        "__nvidia_driver_policy_others": {"results": [{"stdout": o} for o in (others or [])]},
        "apt_source_dpkg": {"blind": False},
        "ansible_check_mode": False,
    }
    from ansible.template import trust_as_template

    for key, value in {**task["vars"], **task["ansible.builtin.set_fact"]}.items():
        variables[key] = trust_as_template(value)
    names = task["ansible.builtin.set_fact"]
    return {key: render("{{ %s }}" % key, **variables) for key in names} | {"_vars": variables}


@pytest.mark.parametrize(("installed", "expected"), [
    ("(none)", "580.95.05-1"),  # apt's candidate is another branch: the newest of 580
    ("580.82.07-1", "580.82.07-1"),  # a driver of the branch is there: kept, not upgraded
])
def test_driver_version_is_of_the_wanted_branch(installed: str, expected: str) -> None:
    out = decide(CUDA_POLICY.format(installed=installed))
    assert out["__nvidia_driver_pkg_version"] == expected
    assert out["__nvidia_driver_available"] == ["590.48.01-1", "580.95.05-1", "580.82.07-1"]


def test_a_version_without_revision_matches_what_apt_has() -> None:
    out = decide(CUDA_POLICY.format(installed="(none)"), version="580.82.07")
    assert out["__nvidia_driver_pkg_version"] == "580.82.07-*"
    stop = _task("Stop when the repository has no driver of the wanted branch and version")
    variables = out["_vars"] | {k: v for k, v in out.items() if k != "_vars"}
    from ansible.template import Templar, trust_as_template

    templar = Templar(loader=None, variables=variables)
    assert not templar.evaluate_conditional(trust_as_template(stop["when"][1]))


def test_versions_of_the_other_packages_are_read() -> None:
    out = decide(DKMS_POLICY.replace("nvidia-open-kernel-dkms", "nvidia-driver"),
                 others=[DKMS_POLICY])
    assert out["__nvidia_driver_versions_elsewhere"] == [["535.261.03-1"]]


@pytest.mark.parametrize(("role", "name_var"), [
    ("docker_engine", "docker_engine_repo_name"),
    ("nvidia_container_toolkit", "nvidia_container_toolkit_repo_name"),
    ("nvidia_driver", "nvidia_driver_cuda_repo_name"),
])
def test_source_file_is_named_as_deb822_repository_names_it(role: str, name_var: str) -> None:
    """The name each role hands apt_source, and the file apt_source refreshes and takes back."""
    from ansible.template import trust_as_template

    role_vars = yaml.safe_load((ROLES / role / "vars/main.yml").read_text())
    apt_vars = yaml.safe_load((ROLES / "apt_source/vars/main.yml").read_text())
    variables = {key: trust_as_template(value) for key, value in role_vars.items()
                 if isinstance(value, str)}
    name = render(role_vars[f"__{role}_apt_source_name"], **variables, **{
        name_var: "My Sources_list", "nvidia_driver_source": "cuda_repo",
        "docker_engine_source": "docker_repo"})
    path = render(apt_vars["__apt_source_file"], apt_source_name=name)
    assert path == "/etc/apt/sources.list.d/my-sources-list.sources"
