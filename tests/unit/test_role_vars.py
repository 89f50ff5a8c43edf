"""nvidia_driver's derived variables (vars/main.yml), rendered by Ansible's own templar with
the facts gpu_preflight would set: the decisions the lab cannot reach (NVSwitch, real drivers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

ROLE = Path(__file__).resolve().parents[2] / "roles/nvidia_driver"


def _trusted(value: Any) -> Any:
    from ansible.template import trust_as_template

    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, list):
        return [_trusted(v) for v in value]
    if isinstance(value, dict):
        return {k: _trusted(v) for k, v in value.items()}
    return value


def render(expr: str, *, driver: dict[str, Any], nvswitch: bool, distribution: str = "Ubuntu",
           **extra: Any) -> Any:
    """What the role computes on a host with these facts (Ansible trusts its role files)."""
    from ansible.template import Templar, trust_as_template

    variables: dict[str, Any] = {}
    for name in ("defaults/main.yml", "vars/main.yml"):
        variables.update(_trusted(yaml.safe_load((ROLE / name).read_text())))
    variables.update(
        inventory_hostname="gpu1",
        ansible_facts={"distribution": distribution, "distribution_version": "24.04",
                       "distribution_major_version": "24", "architecture": "x86_64",
                       "os_family": "Debian"},
        gpu_preflight_driver={"answers": True, "branch": "580", "version": "580.95.05",
                              "managed_by": "dpkg", "fabricmanager": "",
                              "nvidia_smi": "/usr/bin/nvidia-smi", "nvidia_smi_message": "",
                              **driver},
        gpu_preflight_nvswitch_present=nvswitch, gpu_preflight_open_module="supported",
        gpu_preflight_gpu_present=True, gpu_preflight_secure_boot={"enabled": False, "detail": ""},
        gpu_preflight_gpu_generations=["hopper"], gpu_preflight_gpus=[],
        **extra,
    )
    return Templar(loader=None, variables=variables).template(trust_as_template(expr))


KEPT = "{{ __nvidia_driver_existing_matches }}"
PROBLEMS = "{{ __nvidia_driver_problems }}"


@pytest.mark.parametrize(("nvswitch", "fabricmanager", "kept"), [
    (False, "", True),  # PCIe host: nothing else needed
    (True, "/usr/bin/nv-fabricmanager", True),
    (True, "", False),  # HGX with a working driver but no fabric manager: not healthy
])
def test_a_working_driver_is_kept_only_with_fabric_manager_where_nvswitch_needs_it(
    nvswitch: bool, fabricmanager: str, kept: bool
) -> None:
    driver = {"fabricmanager": fabricmanager}
    assert render(KEPT, driver=driver, nvswitch=nvswitch) is kept
    assert render(PROBLEMS, driver=driver, nvswitch=nvswitch) == []


def test_packaged_driver_without_fabric_manager_installs_it_at_the_drivers_version() -> None:
    packages = render("{{ __nvidia_driver_fm_packages }}", driver={}, nvswitch=True)
    assert packages == ["nvidia-fabricmanager-580", "libnvidia-nscq-580"]


def test_foreign_driver_without_fabric_manager_is_named_as_such() -> None:
    problems = render(PROBLEMS, driver={"managed_by": "foreign"}, nvswitch=True)
    assert len(problems) == 1
    assert "no fabric manager" in problems[0] and "error 802" in problems[0]
    assert "does not match branch" not in problems[0]


def test_foreign_driver_of_another_branch_is_still_refused() -> None:
    problems = render(PROBLEMS, driver={"managed_by": "foreign", "branch": "570",
                                        "version": "570.1"}, nvswitch=False)
    assert len(problems) == 1 and "does not match branch 580" in problems[0]


@pytest.mark.parametrize(("distribution", "first", "dkms"), [
    ("Ubuntu", "nvidia-headless-no-dkms-580-server-open", False),
    ("Debian", "nvidia-driver", True),
    ("Linuxmint", "nvidia-driver", True),  # another apt distribution gets Debian's packages
])
def test_the_distributions_packages_follow_the_distribution(distribution, first, dkms) -> None:
    chosen = {"driver": {}, "nvswitch": False, "distribution": distribution,
              "nvidia_driver_source": "distribution", "nvidia_driver_kernel_module": "open"}
    assert render("{{ __nvidia_driver_versioned }}", **chosen)[0] == first
    assert render("{{ __nvidia_driver_dkms }}", **chosen) is dkms
