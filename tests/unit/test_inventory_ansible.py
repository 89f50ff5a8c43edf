"""Inventories exactly as Ansible loads them (issue 19): vault, plugins, comma lists, several
sources, ~ and relative paths, templated variables, and the file named in every error."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from umprov.errors import ConfigError, ExitCode, InventoryError
from umprov.inventory import InventoryRequest, load_inventory

PASSWORD = "correct horse battery staple"


def write(path: Path, text: str, mode: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())
    if mode is not None:
        path.chmod(mode)
    return path


def encrypt(path: Path, text: str, password: str = PASSWORD, label: str | None = None) -> Path:
    """A vault-encrypted file, as ansible-vault writes one."""
    from ansible.parsing.vault import VaultLib, VaultSecret

    data = VaultLib().encrypt(textwrap.dedent(text).lstrip(),
                              secret=VaultSecret(password.encode()), vault_id=label)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


@pytest.fixture(autouse=True)
def _plain_ansible_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No vault or inventory setting from the machine running the tests leaks in."""
    for name in ("ANSIBLE_VAULT_PASSWORD_FILE", "ANSIBLE_VAULT_IDENTITY_LIST",
                 "ANSIBLE_ASK_VAULT_PASS", "ANSIBLE_INVENTORY", "ANSIBLE_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def vaulted(tmp_path: Path) -> Path:
    """A folder inventory whose group_vars/all/vault.yml is vault-encrypted."""
    site = tmp_path / "site"
    write(site / "hosts.yml", """
        all:
          hosts:
            gpu1: {ansible_host: 10.0.0.1}
    """)
    write(site / "group_vars" / "all" / "main.yml", "nvidia_driver_branch: '570'\n")
    encrypt(site / "group_vars" / "all" / "vault.yml", "umprov_expected_gpus: 8\n")
    return site


@pytest.fixture
def password_file(tmp_path: Path) -> Path:
    return write(tmp_path / "vault-pass.txt", PASSWORD + "\n", mode=0o600)


def test_vault_encrypted_group_vars_with_a_password_file(vaulted, password_file):
    inv = load_inventory(InventoryRequest(sources=(str(vaulted),),
                                          vault_password_files=(str(password_file),)))
    (host,) = inv.hosts
    assert host.vars == {"nvidia_driver_branch": "570", "umprov_expected_gpus": 8}
    assert inv.vault.passwords[0].file == str(password_file)


def test_vault_password_file_from_the_environment(vaulted, password_file, monkeypatch):
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(password_file))
    (host,) = load_inventory(str(vaulted)).hosts
    assert host.vars["umprov_expected_gpus"] == 8


def test_vault_identity_list_from_the_environment(vaulted, password_file, monkeypatch):
    monkeypatch.setenv("ANSIBLE_VAULT_IDENTITY_LIST", f"prod@{password_file}")
    inv = load_inventory(str(vaulted))
    assert inv.hosts[0].vars["umprov_expected_gpus"] == 8
    assert [p.label for p in inv.vault.passwords] == ["prod"]


def test_vault_id_on_the_command_line(vaulted, password_file, umprov_cli):
    result = umprov_cli("inventory", "check", str(vaulted), "--vault-id",
                        f"prod@{password_file}", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["hosts"][0]["vars"]["umprov_expected_gpus"] == 8


def test_ask_vault_pass_reads_the_terminal(vaulted, umprov_cli):
    result = umprov_cli("inventory", "check", "-i", str(vaulted), "--ask-vault-pass", "--json",
                        input=PASSWORD + "\n")
    assert result.exit_code == 0, result.stderr
    assert "Vault password (default)" in result.stderr
    assert PASSWORD not in result.stdout + result.stderr


def test_ask_vault_pass_with_standard_input_closed_is_one_line_not_an_interrupt(
        vaulted, umprov_cli, monkeypatch):
    import umprov.cli.options

    monkeypatch.setattr(umprov.cli.options, "_terminal", lambda: False)  # as in CI, cron
    result = umprov_cli("inventory", "check", str(vaulted), "-J", input="")
    assert result.exit_code == ExitCode.CONFIG, result.stderr
    assert result.stderr.strip().splitlines()[-1].endswith(
        "Vault password (default): standard input is not a terminal and ended before a "
        "password; use --vault-password-file")
    assert "Warning" not in result.stderr and "interrupted" not in result.stderr


def test_missing_vault_password_names_the_file(vaulted, umprov_cli):
    result = umprov_cli("inventory", "check", str(vaulted))
    assert result.exit_code == ExitCode.INVENTORY, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert str(vaulted / "group_vars" / "all" / "vault.yml") in result.stderr
    assert "no vault password was given" in result.stderr and "--ask-vault-pass" in result.stderr


def test_wrong_vault_password_names_the_file(vaulted, tmp_path, umprov_cli):
    wrong = write(tmp_path / "wrong.txt", "not it\n")
    result = umprov_cli("inventory", "check", str(vaulted), "--vault-password-file", str(wrong))
    assert result.exit_code == ExitCode.INVENTORY
    assert f"{vaulted / 'group_vars' / 'all' / 'vault.yml'}: vault-encrypted, and none" in (
        result.stderr)


def test_missing_vault_password_file_is_a_bad_option(vaulted, tmp_path, umprov_cli):
    result = umprov_cli("inventory", "check", str(vaulted), "--vault-password-file",
                        str(tmp_path / "nope.txt"))
    assert result.exit_code == ExitCode.CONFIG
    assert "nope.txt" in result.stderr and result.stderr.count("\n") == 1


def test_vault_prompt_without_a_terminal_is_a_bad_option(vaulted):
    with pytest.raises(ConfigError, match="no terminal"):
        load_inventory(InventoryRequest(sources=(str(vaulted),), ask_vault_pass=True))


def test_vault_encrypted_inventory_file_and_inline_value(tmp_path, password_file):
    hosts = encrypt(tmp_path / "hosts.yml", "all:\n  hosts:\n    gpu1: {ansible_host: 10.0.0.7}\n")
    request = InventoryRequest(sources=(str(hosts),), vault_password_files=(str(password_file),))
    assert load_inventory(request).hosts[0].address == "10.0.0.7"
    with pytest.raises(InventoryError, match=rf"{hosts}: vault-encrypted"):
        load_inventory(str(hosts))


def test_yaml_error_in_group_vars_names_file_and_line(tmp_path, umprov_cli):
    site = tmp_path / "site"
    write(site / "hosts.yml", "all:\n  hosts:\n    gpu1:\n")
    write(site / "group_vars" / "all.yml", "nvidia_driver_branch: '570'\nbroken: [\n")
    result = umprov_cli("inventory", "check", str(site))
    assert result.exit_code == ExitCode.INVENTORY
    assert f"{site / 'group_vars' / 'all.yml'}:3:1: YAML syntax error" in result.stderr
    assert result.stderr.count("\n") == 1


def test_constructed_plugin_beside_a_yaml_inventory(tmp_path):
    """A folder holding a plugin file: Ansible's `auto` loads `plugin: constructed`."""
    site = tmp_path / "site"
    write(site / "01-hosts.yml", """
        all:
          hosts:
            gpu1: {ansible_host: 10.0.0.1, gpu_count: 8}
            gpu2: {ansible_host: 10.0.0.2, gpu_count: 4}
    """)
    write(site / "02-constructed.yml", """
        plugin: ansible.builtin.constructed
        strict: true
        compose:
          ansible_port: 2200 + gpu_count
        groups:
          big: gpu_count >= 8
    """)
    gpu1, gpu2 = load_inventory(str(site)).hosts
    assert (gpu1.port, gpu2.port) == (2208, 2204)
    assert "big" in gpu1.groups and "big" not in gpu2.groups


def test_a_plugin_ansible_cannot_parse_is_refused_as_ansible_refuses_it(tmp_path):
    path = write(tmp_path / "inv.yml", "plugin: ansible.builtin.yaml\n")
    with pytest.raises(InventoryError, match="Plugin configuration YAML file, not YAML inventory"):
        load_inventory(str(path))
    unknown = write(tmp_path / "other.yml", "plugin: no.such.plugin\n")
    with pytest.raises(InventoryError, match=f"{unknown}: .*unknown plugin 'no.such.plugin'"):
        load_inventory(str(unknown))


def test_comma_list(umprov_cli):
    result = umprov_cli("inventory", "check", "gpu1,gpu2,", "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert [(h["name"], h["address"]) for h in data["hosts"]] == [("gpu1", "gpu1"),
                                                                   ("gpu2", "gpu2")]
    assert data["sources"] == ["gpu1,gpu2,"]


def test_several_sources_are_all_read(tmp_path, umprov_cli):
    one = write(tmp_path / "one.yml", "all:\n  hosts:\n    gpu1: {ansible_host: 10.0.0.1}\n")
    two = write(tmp_path / "two.ini", "[gpus]\ngpu2 ansible_host=10.0.0.2\n")
    result = umprov_cli("inventory", "check", str(one), "-i", str(two), "-i", "gpu3,", "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert sorted(h["name"] for h in data["hosts"]) == ["gpu1", "gpu2", "gpu3"]
    assert data["sources"] == [str(one), str(two), "gpu3,"]


def test_ansible_inventory_lists_several_sources(tmp_path, monkeypatch):
    one = write(tmp_path / "one.yml", "all:\n  hosts:\n    gpu1:\n")
    two = write(tmp_path / "two.yml", "all:\n  hosts:\n    gpu2:\n")
    monkeypatch.setenv("ANSIBLE_INVENTORY", f"{one},{two}")
    assert [h.name for h in load_inventory(None).hosts] == ["gpu1", "gpu2"]


def test_home_key_path_is_the_users_not_the_inventory_folders(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    path = write(tmp_path / "inv" / "hosts.yml", """
        all:
          hosts:
            gpu1:
              ansible_ssh_private_key_file: ~/.ssh/id_ed25519
              umprov_known_hosts: ~/.ssh/lab_known_hosts
            gpu2:
              ansible_host: 10.0.0.2
              ansible_private_key_file: keys/id_rsa
    """)
    gpu1, gpu2 = load_inventory(str(path)).hosts
    assert gpu1.key_file == str(tmp_path / "home" / ".ssh" / "id_ed25519")
    assert gpu1.known_hosts == str(tmp_path / "home" / ".ssh" / "lab_known_hosts")
    # Relative: from the working directory, where ansible-playbook resolves it too.
    assert gpu2.key_file == os.path.join(os.getcwd(), "keys", "id_rsa")


def test_templated_address_and_port(tmp_path, monkeypatch):
    path = write(tmp_path / "hosts.yml", """
        all:
          vars:
            domain: gpu.example.com
            base_port: 2200
          hosts:
            gpu1:
              ansible_host: "{{ inventory_hostname }}.{{ domain }}"
              ansible_port: "{{ base_port + 22 }}"
              umprov_ssh_port: "{{ base_port + 2 }}"
              ansible_user: "{{ lookup('ansible.builtin.env', 'UMPROV_TEST_USER') }}"
    """)
    monkeypatch.setenv("UMPROV_TEST_USER", "ops")
    (host,) = load_inventory(str(path)).hosts
    assert (host.address, host.port, host.user) == ("gpu1.gpu.example.com", 2222, "ops")
    assert host.vars["umprov_ssh_port"] == 2202


def test_templated_value_is_validated_and_the_template_named(tmp_path):
    path = write(tmp_path / "hosts.yml", """
        all:
          vars: {port_name: ssh}
          hosts:
            gpu1: {umprov_ssh_port: "{{ port_name }}"}
    """)
    with pytest.raises(InventoryError) as err:
        load_inventory(str(path))
    text = str(err.value)
    assert f"{path}:4" in text and "umprov_ssh_port" in text and "must be of type int" in text
    assert "from the template '{{ port_name }}'" in text


def test_ssh_args_that_would_replace_host_key_checking_are_refused(tmp_path, umprov_cli):
    # ansible_ssh_args outranks ANSIBLE_SSH_ARGS, umprov's host key options for provision.
    site = write(tmp_path / "hosts.yml", """
        all:
          hosts:
            gpu1: {ansible_ssh_args: "-o StrictHostKeyChecking=no"}
            gpu2: {ansible_ssh_common_args: "-o ProxyJump=bastion"}
    """)
    result = umprov_cli("inventory", "check", str(site))
    assert result.exit_code == ExitCode.INVENTORY
    assert f"{site}:3" in result.stderr and "host 'gpu1' sets ansible_ssh_args" in result.stderr
    assert "gpu2" not in result.stderr and result.stderr.count("\n") == 1


@pytest.mark.parametrize(("key", "meant"), [
    ("ansbile_host", "ansible_host"), ("ansible_hots", "ansible_host"),
    ("ansible_usr", "ansible_user"), ("ansible_prot", "ansible_port"),
    ("ansible_ssh_privte_key_file", "ansible_ssh_private_key_file")])
def test_a_near_miss_of_a_connection_variable_is_refused(tmp_path, umprov_cli, key, meant):
    """Ansible reads it as any variable and connects by the host's name (or as the user
    running it): one line naming the file, line and the variable meant."""
    site = write(tmp_path / "hosts.yml", f"""
        all:
          hosts:
            gpu1: {{{key}: x1}}
            gpu2:
              ansible_host: 10.0.0.2
              ansible_hostname: gpu2
              ansible_user_dir: /root
              ansible_python_interpreter: /usr/bin/python3
              ansible_ssh_host: 10.0.0.2
    """)
    result = umprov_cli("inventory", "check", str(site))
    assert result.exit_code == ExitCode.INVENTORY
    assert result.stderr == (f"umprov: error: {site}:3: host 'gpu1' sets '{key}', which Ansible "
                             f"does not read (did you mean '{meant}'?)\n")


def test_template_with_an_undefined_variable_is_named(tmp_path):
    path = write(tmp_path / "hosts.yml", """
        all:
          hosts:
            gpu1: {ansible_host: "{{ nowhere }}.example.com"}
    """)
    with pytest.raises(InventoryError, match=r"hosts\.yml:3: variable 'ansible_host' on host "
                       r"'gpu1' uses a variable that is not defined: '\{\{ nowhere \}\}"):
        load_inventory(str(path))


def test_role_variable_that_needs_facts_is_left_to_the_play(tmp_path):
    path = write(tmp_path / "hosts.yml", """
        all:
          hosts:
            gpu1:
              nvidia_driver_cuda_repo_distro: "{{ ansible_facts.distribution | lower }}12"
    """)
    (host,) = load_inventory(str(path)).hosts
    assert host.vars["nvidia_driver_cuda_repo_distro"].startswith("{{ ansible_facts")


def test_every_command_takes_the_inventory_the_same_way(umprov_cli):
    """-i and the vault options on every command that reads an inventory."""
    for command in (["inventory", "check"], ["provision"], ["deploy"], ["status"], ["verify"],
                    ["trust"], ["image", "build"]):
        text = umprov_cli(*command, "--help").stdout
        for option in ("-i, --inventory", "--vault-id", "--vault-password-file",
                       "--ask-vault-pass"):
            assert option in text, (command, option)


def _inline(value: str) -> str:
    """An inline vault value (``!vault |``), as ansible-vault encrypt_string writes one."""
    from ansible.parsing.vault import VaultLib, VaultSecret

    data = VaultLib().encrypt(value, secret=VaultSecret(PASSWORD.encode())).decode()
    return "!vault |\n" + "".join(f"      {line}\n" for line in data.splitlines())


def test_inline_vault_values_are_read_and_never_printed(tmp_path, password_file, umprov_cli):
    site = tmp_path / "site"
    (site / "group_vars").mkdir(parents=True)
    (site / "hosts.yml").write_text("all:\n  hosts:\n    gpu1: {ansible_host: 10.0.0.1}\n")
    (site / "group_vars" / "all.yml").write_text(
        f"nvidia_driver_version: {_inline('570.133.20')}"
        f"umprov_env:\n  HF_TOKEN: {_inline('hf-secret-canary')}")
    result = umprov_cli("inventory", "check", str(site), "--vault-password-file",
                        str(password_file), "--json")
    assert result.exit_code == 0, result.stderr
    host = json.loads(result.stdout)["hosts"][0]
    assert host["vars"]["nvidia_driver_version"] == "<hidden>"
    assert host["vars"]["umprov_env"] == {"HF_TOKEN": "<hidden>"}
    assert "570.133.20" not in result.output and "hf-secret-canary" not in result.output
    (site / "group_vars" / "all.yml").write_text(f"umprov_ssh_port: {_inline('twenty-two')}")
    result = umprov_cli("inventory", "check", str(site), "--vault-password-file",
                        str(password_file))
    assert result.exit_code == ExitCode.INVENTORY, result.stderr
    assert "umprov_ssh_port" in result.stderr and "<hidden>" in result.stderr
    assert "twenty-two" not in result.stderr


def test_a_prompt_left_on_the_terminal_is_an_interrupt(vaulted, umprov_cli, monkeypatch):
    import umprov.cli.options

    monkeypatch.setattr(umprov.cli.options, "_terminal", lambda: True)  # Ctrl-C at the prompt
    result = umprov_cli("inventory", "check", str(vaulted), "-J", input="")
    assert result.exit_code == ExitCode.INTERRUPTED, result.stderr
