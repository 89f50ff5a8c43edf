"""A team's inventory against two lab hosts, end to end (issue 19).

The inventory is written the way Ansible users write theirs, not the way `umprov lab up` does:
a folder with a vault-encrypted group_vars/all/vault.yml (the lab's repository URLs and the
hosts' SSH ports), templated addresses and ports, `~` paths for the key and the known_hosts
file, and no ansible_ssh_common_args: OpenSSH under provision must use umprov's trust store.
With a fresh state directory and an empty known_hosts file, provision refuses the unknown keys
(exit 6, the message every command gives); `umprov trust` records them; then provision, deploy,
status and verify all run through the vault-encrypted inventory. The hosts start from the
Docker-converged snapshot (tests/lab/conftest.py's docker_host_image): what is proved here is
the inventory and the trust store, not installing Docker (test_interrupts does that from fresh
hosts).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.lab.conftest import LAB_IMAGE_TAG, clear_lab, cli, lab_name, seed_engines

pytestmark = [pytest.mark.lab, pytest.mark.cost(350)]

# UMPROV_TEST_INVENTORIES_LAB: another lab name, for runs beside someone else's.
NAME = lab_name("pytest-inv", "UMPROV_TEST_INVENTORIES_LAB")
TAG = LAB_IMAGE_TAG
VAULT_PASSWORD = "team-vault-password-for-the-lab"
SSH_PORT = 2223  # the container's SSH port on each host: templated, so not the default 2222


def encrypt(text: str) -> bytes:
    from ansible.parsing.vault import VaultLib, VaultSecret

    return VaultLib().encrypt(text, secret=VaultSecret(VAULT_PASSWORD.encode()))


TEAM: dict[str, Any] = {}


def write_team_inventory(root: Path, lab: dict[str, Any], home: Path) -> Path:
    """site/: hosts.yml with templated addresses and ports, group_vars/all/main.yml in the
    clear, group_vars/all/vault.yml encrypted."""
    from umprov_lab.inventory import lab_role_vars
    from umprov_lab.layout import LAB_USER

    site = root / "site"
    (site / "group_vars" / "all").mkdir(parents=True)
    hosts = {h["name"]: {
        "ansible_host": "{{ lab_address }}",
        "ansible_port": "{{ lab_ports[inventory_hostname] }}",
    } for h in lab["hosts"]}
    (site / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"gpu_hosts": {
        "hosts": hosts}}}}))
    (site / "group_vars" / "all" / "main.yml").write_text(yaml.safe_dump({
        "lab_address": "127.0.0.1",
        "ssh_base_port": SSH_PORT - 1,
        "ansible_user": LAB_USER,
        "ansible_become": True,
        "ansible_ssh_private_key_file": "~/.ssh/id_ed25519",
        "umprov_known_hosts": "~/team_known_hosts",
        "umprov_ssh_port": "{{ ssh_base_port + 1 }}",
        "umprov_container_limits": False,
        "umprov_gpus": "none",
        "umprov_image": TAG,
    }))
    secret = {"lab_ports": {h["name"]: h["port"] for h in lab["hosts"]}, **lab_role_vars(NAME)}
    (site / "group_vars" / "all" / "vault.yml").write_bytes(encrypt(yaml.safe_dump(secret)))
    # The lab's key where a user keeps theirs; a known_hosts file that knows no one yet.
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    shutil.copy(lab["key_file"], home / ".ssh" / "id_ed25519")
    shutil.copy(Path(lab["key_file"]).with_suffix(".pub"), home / ".ssh" / "id_ed25519.pub")
    (home / "team_known_hosts").write_text("")
    return site


@pytest.fixture(scope="module", autouse=True)
def team(request: pytest.FixtureRequest,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    snapshot = request.getfixturevalue("docker_host_image")
    # Built (or found) before HOME changes below; the hosts' engines start with the lab image
    # (what is proved here is how inventories are read, not the push).
    clear_lab(NAME)
    seed_engines(request.getfixturevalue("engine_seed"), NAME, range(1, 3), snapshot)
    up = cli("lab", "up", "--hosts", "2", "--name", NAME, "--json", "--from-image", snapshot)
    assert up.exit_code == 0, up.stderr
    lab = json.loads(up.stdout)
    root = tmp_path_factory.mktemp("team")
    home = root / "home"
    password_file = root / "vault-pass.txt"
    password_file.write_text(VAULT_PASSWORD + "\n")
    password_file.chmod(0o600)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(home))
        mp.setenv("UMPROV_STATE_DIR", str(root / "state"))  # a trust store of its own
        site = write_team_inventory(root, lab, home)
        TEAM.update(lab=lab, site=site, home=home, names=[h["name"] for h in lab["hosts"]],
                    vault=["-i", str(site), "--vault-password-file", str(password_file)])
        yield TEAM
    cli("lab", "down", "--name", NAME)


def test_the_inventory_needs_its_vault_password() -> None:
    result = cli("inventory", "check", str(TEAM["site"]))
    assert result.exit_code == 3
    assert f"{TEAM['site'] / 'group_vars' / 'all' / 'vault.yml'}: vault-encrypted" in result.stderr


def test_templated_addresses_and_home_paths_as_ansible_reads_them() -> None:
    result = cli("inventory", "check", *TEAM["vault"], "--json")
    assert result.exit_code == 0, result.stderr
    hosts = {h["name"]: h for h in json.loads(result.stdout)["hosts"]}
    for lab_host in TEAM["lab"]["hosts"]:
        host = hosts[lab_host["name"]]
        assert (host["address"], host["port"]) == ("127.0.0.1", lab_host["port"])
        assert host["key_file"] == str(TEAM["home"] / ".ssh" / "id_ed25519")
        assert host["known_hosts"] == str(TEAM["home"] / "team_known_hosts")
        assert host["vars"]["umprov_ssh_port"] == SSH_PORT


@pytest.fixture(scope="module")
def trusted() -> dict[str, Any]:
    """provision before and after `umprov trust`: refused, then converged."""
    before = cli("provision", *TEAM["vault"], "--only", "docker", "--json")
    trust = cli("trust", "gpu_hosts", *TEAM["vault"], "--yes", "--json")
    after = cli("provision", *TEAM["vault"], "--only", "docker", "--json")
    return {"before": before, "trust": trust, "after": after}


def test_provision_refuses_unknown_keys_with_the_common_message(trusted: dict[str, Any]) -> None:
    before = trusted["before"]
    assert before.exit_code == 6, before.stdout[-2000:] + before.stderr[-2000:]
    hosts = {h["host"]: h for h in json.loads(before.stdout)["hosts"]}
    for lab_host in TEAM["lab"]["hosts"]:
        name, port = lab_host["name"], lab_host["port"]
        assert hosts[name]["status"] == "untrusted"
        line = (f"umprov: {name}: host key for [127.0.0.1]:{port} is not known (ED25519 SHA256:")
        assert any(x.startswith(line) for x in before.stderr.splitlines()), before.stderr
        assert f"run `umprov trust {name}`" in before.stderr


def test_trust_then_provision_converges(trusted: dict[str, Any]) -> None:
    trust, after = trusted["trust"], trusted["after"]
    assert trust.exit_code == 0, trust.stderr
    assert all(h["recorded"] for h in json.loads(trust.stdout)["hosts"])
    assert after.exit_code == 0, after.stdout[-2000:] + after.stderr[-2000:]
    assert {h["status"] for h in json.loads(after.stdout)["hosts"]} <= {"ok", "changed"}
    # umprov's own file holds the keys, and the team's known_hosts was left alone.
    assert (TEAM["home"] / "team_known_hosts").read_text() == ""


@pytest.fixture(scope="module")
def deployed(trusted: dict[str, Any]) -> Any:
    assert trusted["after"].exit_code == 0
    pub = TEAM["home"] / ".ssh" / "id_ed25519.pub"
    return cli("deploy", *TEAM["vault"], "--push", "--authorized-key", str(pub), "--json")


def test_deploy_through_the_vault_inventory(deployed: Any) -> None:
    assert deployed.exit_code == 0, deployed.stderr
    hosts = json.loads(deployed.stdout)["hosts"]
    assert {h["host"] for h in hosts} == set(TEAM["names"])
    assert all(h["ok"] for h in hosts)


def test_status_sees_the_templated_port(deployed: Any) -> None:
    assert deployed.exit_code == 0
    result = cli("status", *TEAM["vault"], "--json")
    assert result.exit_code == 0, result.stderr
    for row in json.loads(result.stdout)["hosts"]:
        assert row["reachable"] and row["state"] == "running"
        assert any(f":{SSH_PORT}" in b for binds in row["ports"].values() for b in binds), row


def test_verify_reaches_every_host(deployed: Any) -> None:
    """The lab has no GPU: an honest failure (13), but from the agent on every host, never an
    unreachable or untrusted one."""
    assert deployed.exit_code == 0
    result = cli("verify", *TEAM["vault"], "--quick", "--json")
    assert result.exit_code == 13, result.stderr
    docs = json.loads(result.stdout)["hosts"]
    assert {d["host"] for d in docs} == set(TEAM["names"])
    for doc in docs:
        details = " ".join(str(r.get("detail")) for r in doc["records"])
        assert "unreachable: " not in details and "untrusted: " not in details
        assert any(r["check"] != "agent.connect" for r in doc["records"])


def test_ask_vault_pass_works_like_the_file() -> None:
    result = cli("status", "-i", str(TEAM["site"]), "--ask-vault-pass", "--json",
                 input=VAULT_PASSWORD + "\n")
    assert result.exit_code in (0, 6, 11), result.stderr  # the hosts' state is not the point
    assert "vault-encrypted" not in result.stderr
    assert VAULT_PASSWORD not in result.stdout + result.stderr
