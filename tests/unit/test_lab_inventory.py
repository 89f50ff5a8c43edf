"""What `umprov lab up` writes into the inventory: plain umprov variables, nothing lab-only."""

from __future__ import annotations

from pathlib import Path

import yaml

from umprov.inventory import UMPROV_VARIABLES
from umprov_lab.hosts import LabHost
from umprov_lab.image import LAB_TAG
from umprov_lab.inventory import render_inventory


def _group_vars(tmp_path: Path) -> dict:
    hosts = [LabHost("lab-t-1", "umprov-lab-t-1", 22201, "running")]
    text = render_inventory("t", hosts, tmp_path / "key", tmp_path / "kh")
    return yaml.safe_load(text)["all"]["children"]["gpu_hosts"]["vars"]


def test_lab_hosts_get_no_container_limits_and_the_lab_image(tmp_path: Path) -> None:
    group_vars = _group_vars(tmp_path)
    # Lab hosts lack CAP_SYS_RESOURCE: the one switch umprov reads, not a "this is a lab" flag.
    assert group_vars["umprov_container_limits"] is False
    assert "umprov_lab" not in group_vars
    assert group_vars["umprov_image"] == LAB_TAG
    assert group_vars["umprov_known_hosts"] == str(tmp_path / "kh")


def test_lab_hosts_name_the_labs_key_as_the_containers_login(tmp_path: Path) -> None:
    """deploy lets the lab's own key into the containers there, with no key in ~/.ssh and no
    --authorized-key (a pipx install): an ordinary variable deploy reads for any host."""
    assert _group_vars(tmp_path)["umprov_authorized_key"] == str(tmp_path / "key.pub")


def test_every_umprov_variable_the_lab_sets_is_documented(tmp_path: Path) -> None:
    ours = [name for name in _group_vars(tmp_path) if name.startswith("umprov_")]
    assert ours and all(name in UMPROV_VARIABLES for name in ours), ours
