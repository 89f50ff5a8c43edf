"""`umprov lab up --slurm`'s pure parts: the image recipe's tag, slurm.conf, the inventory."""

from __future__ import annotations

from pathlib import Path

import yaml

from umprov.inventory import UMPROV_VARIABLES
from umprov_lab import slurm
from umprov_lab.hosts import LabHost
from umprov_lab.inventory import render_inventory

ROOT = Path(__file__).resolve().parents[2]
HOSTS = [LabHost(f"lab-t-{i}", f"umprov-lab-t-{i}", 22200 + i, "running") for i in (1, 2, 3)]


def conf_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln and not ln.startswith("#")]


def test_slurm_conf_names_each_host_by_host_name_reached_by_container_name():
    lines = conf_lines(slurm.render_conf("t", HOSTS))
    nodes = [ln for ln in lines if ln.startswith("NodeName=")]
    assert nodes == [f"NodeName=lab-t-{i} NodeAddr=umprov-lab-t-{i} CPUs=1 State=UNKNOWN"
                     for i in (1, 2, 3)]
    assert "SlurmctldHost=umprov-lab-t-slurmctld" in lines
    assert "ClusterName=lab" in lines
    assert "ReturnToService=2" in lines
    assert "SlurmdTimeout=30" in lines
    assert lines[-1].startswith(slurm.PARTITION_LINE)


def test_slurm_conf_leaves_the_health_check_to_the_role():
    # slurm_gpu_health stops when slurm.conf sets these outside its block
    text = slurm.render_conf("t", HOSTS)
    for key in ("HealthCheckProgram", "HealthCheckInterval", "HealthCheckNodeState", "Epilog",
                "Prolog"):
        assert not any(ln.startswith(key + "=") for ln in conf_lines(text)), key


def test_a_later_lab_up_keeps_what_a_role_added_after_the_labs_part():
    block = "# BEGIN umprov\nHealthCheckInterval=10\n# END umprov\n"
    before = slurm.render_conf("t", HOSTS[:2]) + block
    after = slurm.merge_conf(slurm.render_conf("t", HOSTS), before)
    assert after == slurm.render_conf("t", HOSTS) + block
    assert slurm.merge_conf("lab part\n", None) == "lab part\n"


def test_the_image_tag_follows_its_recipe_and_base():
    one, other = slurm.image_tag("base:1"), slurm.image_tag("base:2")
    assert one != other and one.startswith("umprov-lab-host:slurm-")
    assert "FROM base:1" in slurm.image_recipe("base:1")
    assert "slurm-wlm munge" in slurm.image_recipe("base:1")


def test_sinfo_lines_parse_into_node_states():
    assert slurm.parse_states("lab-t-1 idle\nlab-t-2 down*\n\n") == {
        "lab-t-1": "idle", "lab-t-2": "down*"}


def children(tmp_path: Path, **kw: bool) -> dict:
    text = render_inventory("t", HOSTS, tmp_path / "key", tmp_path / "kh", **kw)
    return yaml.safe_load(text)["all"]["children"]


def test_a_slurm_lab_puts_its_hosts_in_slurm_compute_with_documented_variables(tmp_path):
    group = children(tmp_path, slurm=True)["slurm_compute"]
    assert list(group["hosts"]) == [h.name for h in HOSTS]
    assert group["vars"] == {"umprov_expected_gpus": 0, "slurm_gpu_health_active": "never",
                             "umprov_rolling_verify": "passive",
                             # a rollout that can pass on hosts whose driver is a stand-in
                             "umprov_rolling_roles": ["nvidia_container_toolkit"]}
    specs = yaml.safe_load((ROOT / "roles/slurm_gpu_health/meta/argument_specs.yml").read_text())
    role_vars = specs["argument_specs"]["main"]["options"]
    for name in group["vars"]:
        assert name in UMPROV_VARIABLES or name in role_vars, name


def test_a_plain_lab_has_no_slurm_group(tmp_path):
    assert list(children(tmp_path)) == ["gpu_hosts"]
