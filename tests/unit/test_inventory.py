"""Inventories: parsed as Ansible parses them, validated with one clear line per fault."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from umprov.errors import ExitCode, InventoryError
from umprov.inventory import Host, load_inventory, resolve_source


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())
    return path


@pytest.fixture
def roles_dir(tmp_path: Path) -> Path:
    """A role with an argument spec, standing in for the project's roles."""
    write(
        tmp_path / "roles" / "nvidia_driver" / "meta" / "argument_specs.yml",
        """
        argument_specs:
          main:
            options:
              nvidia_driver_branch: {type: str, default: "580"}
              nvidia_driver_allow_reboot: {type: bool, default: false}
              nvidia_driver_kernel_module: {type: str, choices: [auto, open, proprietary]}
        """,
    )
    return tmp_path / "roles"


GOOD_YAML = """
all:
  vars:
    nvidia_driver_branch: "580"
  children:
    gpu_hosts:
      hosts:
        gpu01:
          ansible_host: 10.0.0.1
          ansible_user: ops
          umprov_expected_gpus: 8
        gpu02:
          ansible_host: 10.0.0.2
          ansible_port: 2222
"""


def test_yaml_inventory_gives_typed_hosts(tmp_path, roles_dir):
    inv = load_inventory(str(write(tmp_path / "hosts.yml", GOOD_YAML)), roles_dir=roles_dir)
    assert [h.name for h in inv.hosts] == ["gpu01", "gpu02"]
    gpu01, gpu02 = inv.hosts
    assert gpu01 == Host(
        name="gpu01",
        address="10.0.0.1",
        port=22,
        user="ops",
        groups=("gpu_hosts",),
        vars={"nvidia_driver_branch": "580", "umprov_expected_gpus": 8},
    )
    assert gpu02.port == 2222 and gpu02.endpoint == "[10.0.0.2]:2222"
    json.dumps([h.to_dict() for h in inv.hosts])  # plain data, no Ansible-tagged types


def test_ini_inventory(tmp_path, roles_dir):
    path = write(
        tmp_path / "hosts.ini",
        """
        [gpu_hosts]
        gpu01 ansible_host=10.0.0.1 ansible_port=2200

        [gpu_hosts:vars]
        nvidia_driver_allow_reboot=true
        """,
    )
    (host,) = load_inventory(str(path), roles_dir=roles_dir).hosts
    assert (host.address, host.port) == ("10.0.0.1", 2200)
    assert host.vars["nvidia_driver_allow_reboot"] in (True, "true")


def test_folder_with_group_and_host_vars(tmp_path, roles_dir):
    folder = tmp_path / "site"
    write(folder / "hosts.yml", "all:\n  hosts:\n    gpu01:\n      ansible_host: 10.0.0.9\n")
    write(folder / "group_vars" / "all.yml", "nvidia_driver_branch: '575'\n")
    write(folder / "host_vars" / "gpu01.yml", "umprov_expected_gpus: 2\n")
    (host,) = load_inventory(str(folder), roles_dir=roles_dir).hosts
    assert host.vars == {"nvidia_driver_branch": "575", "umprov_expected_gpus": 2}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("all:\n  hosts:\n    a: [\n", r"hosts\.yml:\d+:\d+: YAML syntax error"),
        (
            "all:\n  hosts:\n    a:\n      ansible_host: ''\n",
            r"hosts\.yml:4: host 'a' has an empty address",
        ),
        (
            "all:\n  hosts:\n    a:\n      ansible_port: abc\n",
            r"hosts\.yml:4: host 'a' has port 'abc', expected a number from 1 to 65535",
        ),
        (
            "all:\n  hosts:\n    a:\n      ansible_port: 70000\n",
            r"hosts\.yml:4: .*70000.*1 to 65535",
        ),
        ("all:\n  hosts:\n    a:\n      ansible_port: 0\n", r"port '0'"),
        (
            "all:\n  hosts:\n    a:\n      umprov_expectd_gpus: 2\n",
            r"hosts\.yml:4: unknown umprov variable 'umprov_expectd_gpus' on host 'a' \(did you mean 'umprov_expected_gpus'\?\)",
        ),
        (
            "all:\n  hosts:\n    a:\n      nvidia_driver_brnch: '580'\n",
            r"unknown umprov variable 'nvidia_driver_brnch'",
        ),
        (
            "all:\n  hosts:\n    a:\n      umprov_expected_gpus: many\n",
            r"hosts\.yml:4: variable 'umprov_expected_gpus' on host 'a' must be of type int",
        ),
        (
            "all:\n  hosts:\n    a:\n      nvidia_driver_kernel_module: closed\n",
            r"expected one of auto, open, proprietary",
        ),
        (
            "all:\n  hosts:\n    a:\n      ansible_host: 10.0.0.1\n    b:\n      ansible_host: 10.0.0.1\n",
            r"hosts\.yml: hosts 'a' and 'b' both use 10\.0\.0\.1:22",
        ),
    ],
    ids=[
        "syntax",
        "empty-address",
        "port-text",
        "port-high",
        "port-zero",
        "unknown-umprov-var",
        "unknown-role-var",
        "wrong-type",
        "bad-choice",
        "duplicate-endpoint",
    ],
)
def test_bad_inventories_get_one_clear_line(
    tmp_path, roles_dir, umprov_cli, monkeypatch, text, expected
):
    path = write(tmp_path / "hosts.yml", text)
    with pytest.raises(InventoryError, match=expected) as info:
        load_inventory(str(path), roles_dir=roles_dir)
    assert "\n" not in str(info.value)
    assert str(path) in str(info.value)


def test_bad_ini_names_the_file(tmp_path, roles_dir):
    path = write(tmp_path / "hosts.ini", "[gpu\nnot an inventory =\n")
    with pytest.raises(InventoryError, match=str(path)):
        load_inventory(str(path), roles_dir=roles_dir)


def test_missing_file_lists_where_it_looked(tmp_path):
    with pytest.raises(
        InventoryError,
        match=r"inventory not found: nowhere \(looked for nowhere, .*inventory/nowhere\.yml",
    ):
        resolve_source("nowhere")


@pytest.mark.parametrize(("given", "looked"), [
    ("inventory/lab/x.yml", ["inventory/lab/x.yml", "P/inventory/lab/x.yml"]),
    ("lab/x.yml", ["lab/x.yml", "P/inventory/lab/x.yml"]),
    ("lab/x", ["lab/x", "P/inventory/lab/x", "P/inventory/lab/x.yml", "P/inventory/lab/x.yaml",
               "P/inventory/lab/x.ini"]),
])
def test_a_missing_inventory_lists_only_places_it_could_be(tmp_path, monkeypatch, given, looked):
    """No inventory/inventory/..., no x.yml.yml among the places named."""
    monkeypatch.setenv("UMPROV_PROJECT_DIR", str(tmp_path))
    with pytest.raises(InventoryError) as raised:
        resolve_source(given)
    listed = str(raised.value).split("(looked for ", 1)[1].rstrip(")").split(", ")
    assert listed == [place.replace("P/", f"{tmp_path}/") for place in looked]


def test_a_path_from_the_project_folder_is_found_from_any_folder(tmp_path, monkeypatch):
    write(tmp_path / "inventory" / "lab" / "demo.yml", "all: {}\n")
    monkeypatch.setenv("UMPROV_PROJECT_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path / "inventory")
    assert resolve_source("inventory/lab/demo.yml") == tmp_path / "inventory" / "lab" / "demo.yml"


def test_name_under_inventory_folder(tmp_path, monkeypatch):
    write(tmp_path / "inventory" / "hosts.yml", "all: {}\n")
    write(tmp_path / "inventory" / "lab" / "demo.yml", "all: {}\n")
    monkeypatch.setenv("UMPROV_PROJECT_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path / "inventory")
    assert resolve_source("hosts") == tmp_path / "inventory" / "hosts.yml"
    assert resolve_source("lab/demo") == tmp_path / "inventory" / "lab" / "demo.yml"


def test_no_argument_uses_ansible_cfg(tmp_path, monkeypatch):
    write(tmp_path / "ansible.cfg", "[defaults]\ninventory = inventory/site.yml  ; comment\n")
    write(tmp_path / "inventory" / "site.yml", "all: {}\n")
    monkeypatch.delenv("ANSIBLE_INVENTORY", raising=False)
    monkeypatch.setenv("ANSIBLE_CONFIG", str(tmp_path / "ansible.cfg"))
    assert resolve_source(None) == tmp_path / "inventory" / "site.yml"


def test_ansible_inventory_env_wins(tmp_path, monkeypatch):
    target = write(tmp_path / "other.yml", "all: {}\n")
    monkeypatch.setenv("ANSIBLE_INVENTORY", str(target))
    assert resolve_source(None) == target


def test_select_by_name_group_and_glob(tmp_path, roles_dir):
    inv = load_inventory(str(write(tmp_path / "hosts.yml", GOOD_YAML)), roles_dir=roles_dir)
    assert [h.name for h in inv.select("gpu0*")] == ["gpu01", "gpu02"]
    assert [h.name for h in inv.select("gpu02")] == ["gpu02"]
    assert len(inv.select("gpu_hosts")) == 2
    with pytest.raises(InventoryError, match="no host matches 'cpu'"):
        inv.select("cpu")


def test_project_roles_define_every_lab_variable():
    """The lab's generated inventory must pass the real project's validation."""
    from umprov.inventory import variable_specs
    from umprov_lab.inventory import lab_role_vars

    specs = variable_specs()
    for name in lab_role_vars("demo"):
        assert name in specs, f"lab sets {name}, which no role declares"


# The CLI: exit codes and JSON.


def test_check_command_json(tmp_path, umprov_cli):
    path = write(
        tmp_path / "hosts.yml", "all:\n  hosts:\n    gpu01:\n      ansible_host: 10.0.0.1\n"
    )
    result = umprov_cli("inventory", "check", str(path), "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["hosts"][0]["address"] == "10.0.0.1"


def test_check_command_bad_inventory_exit_code(tmp_path, umprov_cli):
    path = write(tmp_path / "hosts.yml", "all:\n  hosts:\n    a:\n      ansible_port: x\n")
    result = umprov_cli("inventory", "check", str(path))
    assert result.exit_code == ExitCode.INVENTORY
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr


def test_check_command_missing_file(umprov_cli):
    result = umprov_cli("inventory", "check", "/nonexistent/hosts.yml")
    assert result.exit_code == ExitCode.INVENTORY
    assert "inventory not found: /nonexistent/hosts.yml" in result.stderr


# Every problem at once, as a linter lists them, each with its file and line.


def test_check_lists_every_problem_each_with_its_line(tmp_path, umprov_cli):
    path = write(tmp_path / "hosts.yml", """
        all:
          hosts:
            gpu01:
              ansible_host: 10.0.0.1
              umprov_expectd_gpus: 2
            gpu02:
              ansible_host: 10.0.0.2
              ansible_port: x
              umprov_manged_memory: true
        """)
    result = umprov_cli("inventory", "check", str(path))
    assert result.exit_code == ExitCode.INVENTORY
    lines = result.stderr.strip().splitlines()
    assert [line.split(": ")[2] for line in lines] == [f"{path}:{n}" for n in (5, 8, 9)], lines
    assert all(line.startswith("umprov: error: ") for line in lines)
    assert "more)" not in result.stderr and "Traceback" not in result.stderr
    assert "'umprov_manged_memory' on host 'gpu02' (did you mean 'umprov_managed_memory'?)" in lines[2]


def test_the_error_lists_its_problems_and_reads_as_one_line(tmp_path, roles_dir):
    path = write(tmp_path / "hosts.yml",
                 "all:\n  hosts:\n    a:\n      umprov_x: 1\n      umprov_y: 2\n")
    with pytest.raises(InventoryError) as info:
        load_inventory(str(path), roles_dir=roles_dir)
    assert [line.split(": ", 1)[0] for line in info.value.lines()] == [f"{path}:4", f"{path}:5"]
    assert str(info.value).endswith("(and 1 more)") and "\n" not in str(info.value)


@pytest.mark.parametrize(("files", "expected"), [
    ({"hosts.yml": "all:\n  hosts:\n    a:\n      ansible_host: 10.0.0.1\n"
                   "      umprov_manged_memory: true\n"}, "hosts.yml:5"),
    # The group's setting is merged first and its key kept: the host's own line still wins.
    ({"hosts.yml": "all:\n  hosts:\n    a:\n      ansible_host: 10.0.0.1\n"
                   "      umprov_expected_gpus: true\n",
      "group_vars/all.yml": "umprov_expected_gpus: 8\n"}, "hosts.yml:5"),
    ({"hosts.yml": "all:\n  hosts:\n    a:\n      ansible_host: 10.0.0.1\n",
      "host_vars/a.yml": "nvidia_driver_allow_reboot: 1\numprov_expected_gpus: false\n",
      "group_vars/all.yml": "umprov_expected_gpus: 8\n"}, "host_vars/a.yml:2"),
    ({"hosts.yml": "all:\n  vars:\n    nvidia_driver_allow_rebot: true\n"
                   "  hosts:\n    a:\n      ansible_host: 10.0.0.1\n"}, "hosts.yml:3"),
    ({"hosts": "[gpu]\nb ansible_host=10.0.0.2 umprov_expected_gpus=2\n"
               "a ansible_host=10.0.0.1\n[gpu:vars]\nnvidia_driver_allow_rebot=true\n"},
     "hosts:5"),
], ids=["yaml-host", "yaml-over-group", "host-vars", "yaml-group-vars", "ini-group-vars"])
def test_a_bool_value_keeps_its_line(tmp_path, roles_dir, files, expected):
    """ansible-core 2.19 tags no bool with its origin: the line is found in the host's files."""
    for name, text in files.items():
        write(tmp_path / "inv" / name, text)
    source = tmp_path / "inv" / ("hosts" if "hosts" in files else "")
    with pytest.raises(InventoryError) as info:
        load_inventory(str(source), roles_dir=roles_dir)
    assert str(info.value).startswith(f"{tmp_path / 'inv' / expected}: "), str(info.value)


def test_a_groups_typo_is_one_line_naming_its_hosts(tmp_path, roles_dir):
    folder = tmp_path / "site"
    write(folder / "hosts.yml", "all:\n  hosts:\n" + "".join(
        f"    gpu0{n}:\n      ansible_host: 10.0.0.{n}\n" for n in range(1, 6)))
    write(folder / "group_vars" / "all.yml", "umprov_expectd_gpus: 8\n")
    with pytest.raises(InventoryError) as info:
        load_inventory(str(folder), roles_dir=roles_dir)
    (line,) = info.value.lines()
    assert line.startswith(f"{folder / 'group_vars' / 'all.yml'}:1: unknown umprov variable")
    assert "on hosts 'gpu01', 'gpu02', 'gpu03' and 2 more" in line


# Deploy's values are checked where every variable is: `inventory check` and every command
# refuse them before any host is touched (umprov/inventory/values.py).


@pytest.mark.parametrize(("line", "expected"), [
    ("umprov_bind: 999.1.1.1", "variable 'umprov_bind' on host 'gpu01' must be an IP address "
                               "(e.g. 127.0.0.1), not '999.1.1.1'"),
    ("umprov_gpus: '0,0'", "variable 'umprov_gpus' on host 'gpu01' lists a GPU twice: 0,0"),
    ("umprov_gpus: '0,x'", "variable 'umprov_gpus' on host 'gpu01': 'x' is not a GPU index"),
    ("umprov_container_name: ../x", "variable 'umprov_container_name' on host 'gpu01': '../x' "
                                    "is not valid as a container name"),
    ("umprov_image: 'UPPER:tag with space'", "variable 'umprov_image' on host 'gpu01': "
                                             "'UPPER:tag with space' is not an image reference"),
    ("umprov_image: \"{{ 'Bad' }}\"", "variable 'umprov_image' on host 'gpu01': 'Bad' is not an "
                                      "image reference (e.g. umprov/pytorch-cuda:0.1.0), from "
                                      "the template"),
])
def test_deploy_values_are_checked_with_the_inventory(tmp_path, umprov_cli, line, expected):
    path = write(tmp_path / "hosts.yml",
                 f"all:\n  hosts:\n    gpu01:\n      ansible_host: 10.0.0.1\n      {line}\n")
    result = umprov_cli("inventory", "check", str(path))
    assert result.exit_code == ExitCode.INVENTORY, result.output
    assert result.stderr.startswith(f"umprov: error: {path}:5: {expected}"), result.stderr
    assert result.stderr.count("\n") == 1


@pytest.mark.parametrize("line", ["umprov_gpus: 0", "umprov_gpus: none", "umprov_bind: '::1'",
                                  "umprov_image: ''", "umprov_container_name: gpu-box_1"])
def test_good_deploy_values_pass_the_inventory(tmp_path, roles_dir, line):
    path = write(tmp_path / "hosts.yml",
                 f"all:\n  hosts:\n    gpu01:\n      ansible_host: 10.0.0.1\n      {line}\n")
    (host,) = load_inventory(str(path), roles_dir=roles_dir).hosts
    assert line.split(":")[0] in host.vars


def test_any_name_ansible_takes_is_a_host_for_commands_that_name_no_files(tmp_path, roles_dir):
    """Only deploy and status --connect name files after a host (checked there): an IPv6
    literal or a cloud inventory's name with a space is an inventory's host like any other."""
    path = write(tmp_path / "hosts.yml", "all:\n  hosts:\n    gpu01:\n    ../evil:\n")
    assert [h.name for h in load_inventory(str(path), roles_dir=roles_dir).hosts] == [
        "gpu01", "../evil"]
    assert [h.name for h in load_inventory("2001:db8::1,", roles_dir=roles_dir).hosts] == [
        "2001:db8::1"]
