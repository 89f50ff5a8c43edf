"""Credentials as ansible-playbook takes them (issue 19): -K / --ask-become-pass, -e @FILE,
vault passwords; no secret in argv, crash logs, ansible-runner's artifacts or umprov's state.

The end-to-end test runs the real ansible-runner and ansible-playbook against this machine
(connection local, a throwaway project in a temporary folder), then searches everything the run
left for the secrets.
"""

from __future__ import annotations

import json
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest

import umprov.provision
from tests.conftest import REPO
from tests.unit.test_inventory_ansible import encrypt
from umprov.errors import ExitCode
from umprov.paths import Secret
from umprov.provision.args import parse_extra

BECOME = "become-canary-7f3a9c"
VAULT = "vault-canary-2b81e4"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project of one playbook that prints the variables it was given."""
    root = tmp_path / "project"
    (root / "playbooks").mkdir(parents=True)
    (root / "roles").symlink_to(REPO / "roles")  # the variables' specs the inventory is checked by
    (root / "ansible.cfg").write_text("[defaults]\nroles_path = roles\n")
    (root / "playbooks" / "site.yml").write_text(textwrap.dedent("""
        - name: Show what arrived
          hosts: all
          gather_facts: false
          tasks:
            - name: Variables
              ansible.builtin.debug:
                msg: "answer={{ answer }} from_yaml={{ from_yaml }} from_json={{ from_json }}
                      vaulted={{ umprov_expected_gpus }}"
    """))
    monkeypatch.chdir(tmp_path)
    for name in ("ANSIBLE_VAULT_PASSWORD_FILE", "ANSIBLE_VAULT_IDENTITY_LIST",
                 "ANSIBLE_ASK_VAULT_PASS", "ANSIBLE_BECOME_ASK_PASS", "ANSIBLE_INVENTORY"):
        monkeypatch.delenv(name, raising=False)
    return root


@pytest.fixture
def local_inventory(tmp_path: Path) -> Path:
    """This machine, reached without SSH; its group_vars vault-encrypted with VAULT."""
    site = tmp_path / "site"
    (site / "group_vars" / "all").mkdir(parents=True)
    (site / "hosts.ini").write_text(
        f"[here]\nlocalhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    encrypt(site / "group_vars" / "all" / "vault.yml", "umprov_expected_gpus: 4\n",
            password=VAULT)
    return site


def test_extra_vars_in_order_pairs_and_files(tmp_path):
    plan = parse_extra(["a=1", "b=x", "@vars.yml", "c=true"])
    assert plan == [{"a": 1, "b": "x"}, Path.cwd() / "vars.yml", {"c": True}]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("- a\n- b\n", "expected a mapping of variables, not a list"),
        ("a: [\n", "YAML syntax error"),
    ],
)
def test_a_bad_extra_vars_file_is_a_bad_value_naming_it(tmp_path, umprov_cli, body, message):
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("gpu1 ansible_host=10.0.0.1\n")
    bad = tmp_path / "bad.yml"
    bad.write_text(body)
    result = umprov_cli("provision", str(inventory), "-e", f"@{bad}")
    assert result.exit_code == ExitCode.CONFIG, result.stderr
    assert str(bad) in result.stderr and message in result.stderr
    missing = umprov_cli("provision", str(inventory), "-e", "@nowhere.json")
    assert missing.exit_code == ExitCode.CONFIG and "no such file" in missing.stderr


def test_ask_become_pass_reads_the_terminal(tmp_path, umprov_cli, monkeypatch):
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("gpu1 ansible_host=10.0.0.1\n")
    got: dict[str, Any] = {}

    def fake_run(inv: Any, **kwargs: Any) -> Any:
        got.update(kwargs)
        raise umprov.errors.UmprovError("stopped here")

    monkeypatch.setattr(umprov.provision, "run_playbook", fake_run)
    result = umprov_cli("provision", str(inventory), "-K", input=BECOME + "\n")
    assert result.exit_code == ExitCode.FAILED and "stopped here" in result.stderr
    assert "BECOME password" in result.stderr and BECOME not in result.stderr
    assert isinstance(got["become_password"], Secret)
    assert got["become_password"].reveal() == BECOME
    assert BECOME not in repr(got)


def test_crash_log_blanks_extra_vars(tmp_path, umprov_cli, monkeypatch):
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("gpu1 ansible_host=10.0.0.1\n")
    (tmp_path / "vars.yml").write_text("a: 1\n")
    argv = ["umprov", "provision", str(inventory), "-e", f"ansible_become_password={BECOME}",
            f"--extra-vars=token={BECOME}", "-e", f"@{tmp_path / 'vars.yml'}"]
    monkeypatch.setattr(sys, "argv", argv)

    def crash(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(umprov.provision, "run_playbook", crash)
    result = umprov_cli(*argv[1:])
    assert result.exit_code == ExitCode.INTERNAL
    logs = list((tmp_path / "state" / "logs").glob("crash-*.log"))
    assert len(logs) == 1
    text = logs[0].read_text()
    assert BECOME not in text
    assert "ansible_become_password=<redacted>" in text and "--extra-vars=token=<redacted>" in text
    assert f"@{tmp_path / 'vars.yml'}" in text  # a path, not a secret: kept


@pytest.mark.parametrize(("argv", "logged"), [
    (["deploy", "--env", f"TOKEN={BECOME}", f"--env=HF={BECOME}"],
     ["deploy", "--env", "TOKEN=<redacted>", "--env=HF=<redacted>"]),
    (["deploy", "--env", "TOKEN"], ["deploy", "--env", "TOKEN"]),  # its value is the shell's
    (["provision", "-e", f'{{"ansible_become_password": "{BECOME}"}}', "-e", f"a=1 b={BECOME}"],
     ["provision", "-e", "<redacted>", "-e", "a=<redacted> b=<redacted>"]),
    (["provision", f"-ekey={BECOME}", "--name", "x=y"],
     ["provision", "-ekey=<redacted>", "--name", "x=y"])])
def test_a_crash_log_blanks_every_value_that_may_be_a_secret(argv, logged):
    from umprov.cli import redacted_argv

    assert redacted_argv(argv) == logged


def test_secrets_reach_ansible_playbook_and_nothing_keeps_them(
    project, local_inventory, tmp_path, umprov_cli, monkeypatch
):
    """-K, --ask-vault-pass and -e @FILE through the real ansible-runner: the play sees every
    value, and neither password is left in the run's artifacts, the state dir or a temp file."""
    monkeypatch.setenv("UMPROV_PROJECT_DIR", str(project))
    yaml_vars = tmp_path / "vars.yml"
    yaml_vars.write_text("from_yaml: yes-yaml\n")
    json_vars = tmp_path / "vars.json"
    json_vars.write_text(json.dumps({"from_json": "yes-json"}))
    before = set(Path(tempfile.gettempdir()).glob("umprov-secret-*"))
    result = umprov_cli(
        "provision", str(local_inventory), "--strategy", "linear", "--json",
        "-e", "answer=42", "-e", f"@{yaml_vars}", "-e", f"@{json_vars}", "-K", "-J",
        input=f"{VAULT}\n{BECOME}\n",
    )
    assert result.exit_code == 0, result.stderr[-3000:]
    run = json.loads(result.stdout)
    artifacts = Path(run["artifacts"])
    stdout = next(artifacts.glob("artifacts/*/stdout")).read_text()
    assert "answer=42 from_yaml=yes-yaml from_json=yes-json vaulted=4" in " ".join(stdout.split())
    command = json.loads(next(artifacts.glob("artifacts/*/command")).read_text())["command"]
    assert "--become-password-file" in command and "--vault-id" in command
    assert "env" not in json.loads(next(artifacts.glob("artifacts/*/command")).read_text())
    for path in [*(tmp_path / "state").rglob("*"), *artifacts.rglob("*")]:
        if path.is_file():
            data = path.read_bytes()
            assert BECOME.encode() not in data and VAULT.encode() not in data, path
    assert not list(artifacts.glob("extravars*.json"))
    assert set(Path(tempfile.gettempdir()).glob("umprov-secret-*")) == before
    assert BECOME not in result.output and VAULT not in result.output


def test_a_prompting_vault_setting_is_not_passed_on(monkeypatch):
    """umprov asks for LABEL@prompt itself and hands ansible-playbook a file: the setting must
    not reach ansible-playbook, which would wait on a prompt in ansible-runner's pty."""
    monkeypatch.setenv("ANSIBLE_VAULT_IDENTITY_LIST", "prod@prompt")
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", "/etc/vault-pass")
    env = umprov.provision.environment.child_environment()
    assert "ANSIBLE_VAULT_IDENTITY_LIST" not in env
    assert env["ANSIBLE_VAULT_PASSWORD_FILE"] == "/etc/vault-pass"
