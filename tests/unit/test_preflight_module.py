"""gpu_preflight's own module (roles/gpu_preflight/library): pure helpers, no host needed."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

MODULE = Path(__file__).resolve().parents[2] / "roles/gpu_preflight/library/gpu_preflight_facts.py"


@pytest.fixture(scope="module")
def facts() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_preflight_facts", MODULE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kernel(running: str, newest: str, headers: dict[str, bool]) -> dict[str, Any]:
    return {
        "running": running,
        "newest": newest,
        "headers": {r: {"package": f"linux-headers-{r}", "installed": ok, "installable": False}
                    for r, ok in headers.items()},
    }


def test_an_old_kernel_without_headers_does_not_count(facts: Any) -> None:
    # Debian keeps only the current ABI's headers: 6.1.0-26 stays installed, its headers gone.
    k = kernel("6.1.0-28-amd64", "6.1.0-28-amd64",
               {"6.1.0-26-amd64": False, "6.1.0-28-amd64": True})
    assert facts.kernel_headers_missing(k) == []


def test_running_and_newest_kernels_need_headers(facts: Any) -> None:
    k = kernel("6.1.0-26-amd64", "6.1.0-28-amd64",
               {"6.1.0-26-amd64": False, "6.1.0-28-amd64": False, "6.1.0-21-amd64": False})
    assert facts.kernel_headers_missing(k) == [
        "linux-headers-6.1.0-26-amd64", "linux-headers-6.1.0-28-amd64"]
    same = kernel("6.8.0-48-generic", "6.8.0-48-generic", {"6.8.0-48-generic": False})
    assert facts.kernel_headers_missing(same) == ["linux-headers-6.8.0-48-generic"]


def test_headers_meta_packages_follow_the_kernel_meta_packages(facts: Any) -> None:
    installed = [
        "linux-image-amd64", "linux-image-6.1.0-28-amd64", "linux-image-cloud-amd64",
        "linux-image-generic-hwe-24.04", "linux-image-unsigned-6.8.0-48-generic",
        "linux-image-6.1.0-28-amd64-dbg", "linux-image-aws", "linux-image-",
    ]
    assert facts.header_meta_packages(installed) == [
        "linux-headers-amd64", "linux-headers-aws", "linux-headers-cloud-amd64",
        "linux-headers-generic-hwe-24.04",
    ]
    assert facts.header_meta_packages([]) == []


@pytest.mark.parametrize(("version", "refused"), [
    ("2.14.3", True), ("2.16.14", True), ("2.17.0", False), ("2.19.14", False),
    ("2.20.0rc1", False), ("", False),
])
def test_an_ansible_core_older_than_the_roles_need_is_refused_first(facts, version, refused):
    """Debian 12's ansible-core 2.14 passed preflight and then stopped halfway through the
    driver play; now preflight names the version before anything changes."""
    said = facts.ansible_too_old(version, "2.17")
    assert (said is not None) is refused
    if refused:
        assert said.startswith(f"ansible-core {version} runs this playbook") and "2.17" in said


def test_preflight_passes_the_controllers_version_and_the_roles_minimum():
    import yaml

    role = MODULE.parents[1]
    (task,) = [t for t in yaml.safe_load((role / "tasks" / "main.yml").read_text())
               if "gpu_preflight_facts" in t]
    assert task["gpu_preflight_facts"]["ansible_version"] == "{{ ansible_version.full }}"
    minimum = yaml.safe_load((role / "vars" / "main.yml").read_text())[
        "__gpu_preflight_ansible_minimum"]
    pyproject = (role.parents[1] / "pyproject.toml").read_text()
    runtime = (role.parents[1] / "collection" / "meta" / "runtime.yml").read_text()
    assert f'"ansible-core>={minimum}' in pyproject and f">={minimum}.0" in runtime


class _Refused(Exception):
    pass


class _Module:
    """The part of AnsibleModule check_inputs uses: its params, warnings and failure."""

    def __init__(self, **params: Any) -> None:
        self.params = {"ansible_version": "2.19.0", "ansible_minimum": "2.17",
                       "fail_on_unsupported_os": True, "unknown_variables": [],
                       "known_variables": [], "fail_on_unknown_variables": True, "value_rules": {}, "values": {},
                       **params}
        self.warnings: list[str] = []

    def warn(self, text: str) -> None:
        self.warnings.append(text)

    def fail_json(self, msg: str) -> None:
        raise _Refused(msg)


SUPPORTED = {"Ubuntu": ["22.04", "24.04"], "Debian": [12]}


def os_facts(name: str, version: str, family: str, release: str = "") -> dict[str, str]:
    return {"ansible_distribution": name, "ansible_distribution_version": version,
            "ansible_distribution_major_version": version.split(".")[0],
            "ansible_distribution_release": release, "ansible_os_family": family}


@pytest.mark.parametrize(("host_facts", "supported", "family"), [
    (os_facts("Debian", "12.7", "Debian", "bookworm"), True, True),  # 12.x by its major version
    (os_facts("Ubuntu", "24.04", "Debian", "noble"), True, True),
    (os_facts("Ubuntu", "25.04", "Debian"), False, True),  # an untried release of an apt family
    (os_facts("Rocky", "9.4", "RedHat"), False, False),
])
def test_the_os_is_judged_from_the_facts_the_module_gathers(facts, host_facts, supported, family):
    said = facts.os_check(host_facts, SUPPORTED, "gpu1")
    assert (said["supported"], said["family_supported"]) == (supported, family)
    assert said["message"].startswith(f"Unsupported OS on gpu1: {host_facts['ansible_distribution']}")
    assert said["message"].endswith("umprov supports Ubuntu 22.04/24.04, Debian 12.")


@pytest.mark.parametrize("fail_on_unsupported_os", [True, False])
def test_a_family_without_apt_is_refused_whatever_the_os_flag_says(facts, fail_on_unsupported_os):
    """The roles have apt tasks only: a Rocky host must stop in preflight, not skip its setup."""
    module = _Module(fail_on_unsupported_os=fail_on_unsupported_os)
    rocky = facts.os_check(os_facts("Rocky", "9.4", "RedHat", "Blue Onyx"), SUPPORTED, "gpu1")
    said = r"Rocky 9\.4 \(Blue Onyx\)\. .* Nothing was changed on this host: umprov's roles"
    with pytest.raises(_Refused, match=said):
        facts.check_inputs(module, rocky)


def test_an_untried_release_of_an_apt_family_only_warns_when_allowed(facts):
    module = _Module(fail_on_unsupported_os=False)
    facts.check_inputs(module, facts.os_check(os_facts("Ubuntu", "25.04", "Debian"), SUPPORTED, "g"))
    assert module.warnings and "Continuing" in module.warnings[0]


def test_the_module_gathers_the_minimal_facts_setup_would(facts):
    """The plays gather no facts: the preflight's one call must return what setup's min subset
    does, or the roles after it lose ansible_facts.distribution and friends."""
    gathered = facts.minimal_facts(type("M", (), {"params": {}, "run_command": None,
                                                  "get_bin_path": lambda *a, **k: None})())
    for name in ("ansible_distribution", "ansible_os_family", "ansible_service_mgr",
                 "ansible_architecture", "ansible_kernel", "ansible_distribution_release"):
        assert name in gathered, name


def test_an_unknown_variable_gets_the_suggestion_inventory_check_makes(facts):
    """One home for the suggestion: the module's function, which umprov inventory check uses."""
    from umprov.inventory.rules import did_you_mean

    known = ["nvidia_driver_branch", "docker_engine_source"]
    module = _Module(unknown_variables=["nvidia_driver_brnch", "docker_engine_" + "z" * 30],
                     known_variables=known)
    debian = facts.os_check(os_facts("Debian", "12", "Debian"), SUPPORTED, "gpu1")
    with pytest.raises(_Refused, match=r"Unknown variable\(s\): docker_engine_z+, "
                       r"nvidia_driver_brnch \(did you mean 'nvidia_driver_branch'\?\)\. .*"
                       r"docs/roles\.md, in umprov's repository and the umprov\.gpu collection"):
        facts.check_inputs(module, debian)
    assert did_you_mean("nvidia_driver_brnch", known) == facts.did_you_mean(
        "nvidia_driver_brnch", known) == " (did you mean 'nvidia_driver_branch'?)"
