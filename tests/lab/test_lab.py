"""`umprov lab`: up, SSH in with verified host keys, Ansible ping, idempotence, down."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.lab.conftest import clear_lab, lab_name, ssh

pytestmark = pytest.mark.cost(80)

NAME = lab_name("pytest-lifecycle")


@pytest.fixture(scope="module")
def lab_up(umprov_module_cli):
    clear_lab(NAME)
    result = umprov_module_cli("lab", "up", "--hosts", "2", "--name", NAME, "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    yield data
    umprov_module_cli("lab", "down", "--name", NAME)


@pytest.fixture(scope="module")
def umprov_module_cli():
    from click.testing import CliRunner

    from tests.conftest import _Boundary

    runner = CliRunner()
    return lambda *args: runner.invoke(_Boundary("umprov"), list(args), catch_exceptions=False)


def test_up_creates_hosts_inventory_and_known_hosts(lab_up):
    assert [h["name"] for h in lab_up["hosts"]] == [f"lab-{NAME}-1", f"lab-{NAME}-2"]
    assert all(h["state"] == "running" for h in lab_up["hosts"])
    known = Path(lab_up["known_hosts"]).read_text().splitlines()
    for host in lab_up["hosts"]:
        assert any(line.startswith(f"[127.0.0.1]:{host['port']} ssh-ed25519 ") for line in known)
    assert oct(Path(lab_up["key_file"]).stat().st_mode & 0o777) == "0o600"


def test_inventory_passes_validation(lab_up, umprov_module_cli):
    result = umprov_module_cli("inventory", "check", lab_up["inventory"], "--json")
    assert result.exit_code == 0, result.stderr
    hosts = json.loads(result.stdout)["hosts"]
    assert {(h["address"], h["port"]) for h in hosts} == {
        ("127.0.0.1", h["port"]) for h in lab_up["hosts"]
    }


def test_ssh_login_with_strict_host_key_checking(lab_up):
    key, known = Path(lab_up["key_file"]), Path(lab_up["known_hosts"])
    for host in lab_up["hosts"]:
        out = ssh(key, known, host["port"], "hostname && cat /proc/1/comm && sudo -n id -u")
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == [host["name"], "systemd", "0"]


def test_password_and_root_logins_are_refused(lab_up):
    port = lab_up["hosts"][0]["port"]
    key, known = Path(lab_up["key_file"]), Path(lab_up["known_hosts"])
    root = ssh(key, known, port, "true", user="root")
    assert root.returncode == 255 and "Permission denied" in root.stderr
    password = subprocess.run(
        [
            "ssh",
            "-p",
            str(port),
            "-o",
            f"UserKnownHostsFile={known}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "PreferredAuthentications=password",
            "-o",
            "PubkeyAuthentication=no",
            "-o",
            "BatchMode=yes",
            "lab@127.0.0.1",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert password.returncode == 255
    assert "Permission denied (publickey)" in password.stderr


def test_unknown_host_key_is_refused(lab_up, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    out = ssh(Path(lab_up["key_file"]), empty, lab_up["hosts"][0]["port"], "true")
    assert out.returncode == 255
    assert "Host key verification failed" in out.stderr


def test_ansible_ping_through_generated_inventory(lab_up):
    ansible = Path(sys.executable).parent / "ansible"
    out = subprocess.run(
        [str(ansible), "-i", lab_up["inventory"], "all", "-m", "ansible.builtin.ping", "-o"],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            "PATH": f"{ansible.parent}:/usr/bin:/bin",
            "HOME": str(Path.home()),
            "ANSIBLE_HOST_KEY_CHECKING": "True",
        },
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count('"ping": "pong"') == 2


def test_second_up_changes_nothing(lab_up, umprov_module_cli):
    result = umprov_module_cli("lab", "up", "--hosts", "2", "--name", NAME, "--json")
    assert result.exit_code == 0, result.stderr
    again = json.loads(result.stdout)
    assert again["changed"] is False, again["changes"]
    assert [h["port"] for h in again["hosts"]] == [h["port"] for h in lab_up["hosts"]]
    assert "nothing changed" not in result.stdout  # people's text stays on stderr


def test_status_lists_the_hosts(lab_up, umprov_module_cli):
    result = umprov_module_cli("lab", "status", "--name", NAME, "--json")
    assert result.exit_code == 0
    rows = json.loads(result.stdout)["hosts"]
    assert sorted(r["host"] for r in rows) == [f"lab-{NAME}-1", f"lab-{NAME}-2"]


def test_snapshot_starts_hosts_with_their_own_keys(lab_up, umprov_module_cli, docker_client):
    """A host saved by `lab snapshot` starts another lab's hosts: the file system travels (a
    marker file), the host's identity does not (new SSH host keys, empty machine id)."""
    key, known = Path(lab_up["key_file"]), Path(lab_up["known_hosts"])
    first = lab_up["hosts"][0]
    marked = ssh(key, known, first["port"], "sudo -n sh -c 'echo seeded > /etc/umprov-marker'")
    assert marked.returncode == 0, marked.stderr
    tag, copy = f"umprov-lab-host:{NAME}-test", lab_name("pytest-copy")
    saved = umprov_module_cli("lab", "snapshot", "--name", NAME, "--tag", tag, "--json")
    assert saved.exit_code == 0, saved.stderr
    try:
        up = umprov_module_cli("lab", "up", "--hosts", "1", "--name", copy, "--from-image", tag,
                               "--json")
        assert up.exit_code == 0, up.stderr
        data = json.loads(up.stdout)
        host = data["hosts"][0]
        out = ssh(Path(data["key_file"]), Path(data["known_hosts"]), host["port"],
                  "cat /etc/umprov-marker; hostname; wc -c < /etc/machine-id")
        assert out.returncode == 0, out.stderr
        assert out.stdout.split()[:2] == ["seeded", host["name"]]
        source_keys = {" ".join(ln.split()[1:3]) for ln in known.read_text().splitlines()}
        copy_keys = {" ".join(ln.split()[1:3])
                     for ln in Path(data["known_hosts"]).read_text().splitlines()}
        assert copy_keys and not copy_keys & source_keys  # its own host keys
        # The source host runs on, untouched.
        still = ssh(key, known, first["port"], "cat /etc/umprov-marker")
        assert still.returncode == 0 and still.stdout.strip() == "seeded"
    finally:
        umprov_module_cli("lab", "down", "--name", copy)
        docker_client.images.remove(tag)
    missing = umprov_module_cli("lab", "up", "--name", copy, "--from-image", tag)
    assert missing.exit_code == 4 and "--from-image" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1


def test_down_leaves_only_the_cached_image(lab_up, umprov_module_cli, docker_client):
    # What a deploy to host 1 would have kept: gone with the host, so no login is offered.
    from umprov.deploy import options, state
    from umprov.paths import write_private
    from umprov_lab.host_image import recipe_tag
    from umprov_lab.layout import LABEL, inventory_path, lab_dir

    host = SimpleNamespace(name=lab_up["hosts"][0]["name"], address="127.0.0.1", port=22,
                           user="lab", key_file=None, known_hosts=None, vars={})
    state.record_connection(host, options.HostSettings("img", "none", 2222, 8888, "127.0.0.1",
                                                       "umprov"), "umprov", None)
    write_private(state.token_path(host.name), "tok\n")
    assert umprov_module_cli("status", "--connect", host.name).exit_code == 0
    result = umprov_module_cli("lab", "down", "--name", NAME, "--json")
    assert result.exit_code == 0, result.stderr
    assert str(state.connection_path(host.name)) in json.loads(result.stdout)["removed"]
    gone = umprov_module_cli("status", "--connect", host.name)
    assert gone.exit_code == 4 and "nothing deployed" in gone.stderr
    assert not docker_client.containers.list(all=True, filters={"label": f"{LABEL}={NAME}"})
    assert not [v for v in docker_client.volumes.list() if v.name.startswith(f"umprov-lab-{NAME}-")]
    assert not [n for n in docker_client.networks.list() if n.name == f"umprov-lab-{NAME}"]
    assert not inventory_path(NAME).exists()
    assert not lab_dir(NAME).exists()
    docker_client.images.get(recipe_tag())  # kept for the next `lab up`
    again = umprov_module_cli("lab", "down", "--name", NAME, "--json")
    assert json.loads(again.stdout)["removed"] == []
