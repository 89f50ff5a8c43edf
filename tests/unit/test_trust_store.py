"""One trust store (issue 19): `trust`, `provision` (OpenSSH under ansible-playbook), `deploy`,
`status` and `verify` read and write the same known_hosts files, and an unknown or changed
host key exits 6 in every command with the same one-line message.

No SSH server: the seams are umprov.hosts.ssh's (the key a server presents, paramiko's connect
consulting umprov's policy) and ansible-runner's events (what OpenSSH printed).
"""

from __future__ import annotations

import io
import json
import shlex
import subprocess
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import paramiko
import pytest

import umprov.provision
from umprov.errors import ExitCode
from umprov.hosts import ssh
from umprov.provision import host_key_refused

PORT = 2222
PATTERN = f"[127.0.0.1]:{PORT}"


def _key() -> paramiko.PKey:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    return paramiko.Ed25519Key.from_private_key(io.StringIO(pem.decode()))


KEY = _key()


@pytest.fixture
def inventory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """One host on 127.0.0.1:2222 whose server presents KEY (a stand-in for its sshd)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ANSIBLE_SSH_ARGS", raising=False)
    monkeypatch.setattr(ssh, "scan_host_key", lambda address, port, timeout=15.0: KEY)
    path = tmp_path / "hosts.yml"
    path.write_text(f"all:\n  hosts:\n    gpu1:\n      ansible_host: 127.0.0.1\n"
                    f"      ansible_port: {PORT}\n      ansible_user: ops\n")
    return path


@pytest.fixture
def paramiko_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """paramiko's connect as it behaves against a server presenting KEY: a key the client knows
    passes, a different one is BadHostKeyException, an unknown one goes to umprov's policy."""

    def connect(self: paramiko.SSHClient, hostname: str, port: int = 22, **_kw: Any) -> None:
        pattern = ssh.host_pattern(hostname, port)
        known = self.get_host_keys().lookup(pattern)
        if known and KEY.get_name() in known and known[KEY.get_name()] != KEY:
            raise paramiko.BadHostKeyException(hostname, KEY, known[KEY.get_name()])
        if not known:
            self._policy.missing_host_key(self, pattern, KEY)
        raise paramiko.AuthenticationException("the stand-in server lets nobody in")

    monkeypatch.setattr(paramiko.SSHClient, "connect", connect)


@pytest.fixture
def key_option(command: str, tmp_path: Path) -> list[str]:
    """The options `umprov COMMAND` needs besides the inventory: deploy's --authorized-key."""
    if command != "deploy":
        return []
    pub = tmp_path / "id.pub"
    pub.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIC4xqZ1vUQ0n0Fvh5yq0i7XGkQm0sKQdLqJ6dW7b7c1T "
                   "me\n")
    return ["--authorized-key", str(pub)]


def provision_run(monkeypatch: pytest.MonkeyPatch, stderr: str) -> dict[str, Any]:
    """provision's ansible-runner replaced by one whose only host was refused by OpenSSH with
    ``stderr``; what ansible-playbook was given is returned."""
    seen: dict[str, Any] = {}

    def start(private: Path, play_path: Path, limit: Any, options: list[str],
              envvars: dict[str, str], cancel: Any, events: Any) -> Any:
        seen.update(options=options, envvars=envvars)
        msg = f"Failed to connect to the host via ssh: {stderr}"
        events.put({"event": "runner_on_unreachable",
                    "event_data": {"host": "gpu1", "task": "Gathering Facts",
                                   "res": {"msg": msg, "unreachable": True}}})
        events.put(None)
        artifacts = private / "artifacts" / "x"
        artifacts.mkdir(parents=True)
        thread = threading.Thread(target=lambda: None)
        thread.start()
        runner = SimpleNamespace(config=SimpleNamespace(artifact_dir=str(artifacts)),
                                 stats={"dark": {"gpu1": 1}}, status="failed", rc=4)
        return thread, runner

    monkeypatch.setattr(umprov.provision.runner, "start", start)
    return seen


UNKNOWN_STDERR = ("No ED25519 host key is known for [127.0.0.1]:2222 and you have requested "
                  "strict checking.\r\nHost key verification failed.")


def test_trust_then_every_command_finds_the_key(inventory, umprov_cli, monkeypatch,
                                                paramiko_server):
    """`umprov trust` records in the file provision's OpenSSH reads (ssh-keygen finds it there)
    and that paramiko's commands read: neither refuses the key afterwards."""
    result = umprov_cli("trust", "gpu1", "-i", str(inventory), "--yes")
    assert result.exit_code == 0, result.stderr
    recorded = ssh.umprov_known_hosts()
    seen = provision_run(monkeypatch, "Permission denied (publickey).")
    umprov_cli("provision", str(inventory))
    ssh_args = shlex.split(seen["envvars"]["ANSIBLE_SSH_ARGS"])
    files = next(a for a in ssh_args if a.startswith("UserKnownHostsFile=")).split("=", 1)[1]
    assert str(recorded) in files.split() and "StrictHostKeyChecking=yes" in ssh_args
    found = subprocess.run(["ssh-keygen", "-F", PATTERN, "-f", str(recorded)],
                           capture_output=True, text=True, check=False)
    assert found.returncode == 0 and KEY.get_base64() in found.stdout
    # paramiko's side: the key is known, so the login itself is what fails (exit 11, not 6).
    status = umprov_cli("status", str(inventory), "--json")
    assert status.exit_code == ExitCode.HOSTS_UNREACHABLE, status.stderr
    assert "refused (the stand-in server lets nobody in)" in status.stderr


def test_provision_keeps_ansible_cfg_ssh_args_and_puts_trust_first(inventory, monkeypatch,
                                                                   umprov_cli):
    seen = provision_run(monkeypatch, "Permission denied (publickey).")
    umprov_cli("provision", str(inventory))
    args = seen["envvars"]["ANSIBLE_SSH_ARGS"]
    assert args.startswith("-o ControlMaster=auto -o ControlPersist=60s")  # umprov's ansible.cfg
    assert "UserKnownHostsFile=" in args and "UpdateHostKeys=no" in args
    assert seen["envvars"]["ANSIBLE_BECOME_ASK_PASS"] == "False"


@pytest.mark.parametrize("command", ["provision", "deploy", "status", "verify"])
def test_unknown_key_exits_6_with_the_same_message_everywhere(
    command, inventory, umprov_cli, monkeypatch, paramiko_server, key_option
):
    provision_run(monkeypatch, UNKNOWN_STDERR)
    result = umprov_cli(command, str(inventory), *key_option)
    assert result.exit_code == ExitCode.TRUST, result.stderr
    expected = (f"umprov: gpu1: host key for {PATTERN} is not known (ED25519 "
                f"{ssh.fingerprint(KEY)}); run `umprov trust gpu1` to check and record it, or "
                "pass --trust-new-hosts")
    assert expected in result.stderr.splitlines(), result.stderr


@pytest.mark.parametrize("command", ["provision", "deploy", "status", "verify"])
def test_changed_key_exits_6_with_the_same_message_everywhere(
    command, inventory, umprov_cli, monkeypatch, paramiko_server, key_option
):
    other = _key()
    ssh.record_host_key(PATTERN, other)
    provision_run(monkeypatch, "@@@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @@@\r\n"
                               "Host key verification failed.")
    result = umprov_cli(command, str(inventory), *key_option)
    assert result.exit_code == ExitCode.TRUST, result.stderr
    line = next(x for x in result.stderr.splitlines() if x.startswith("umprov: gpu1: "))
    assert line.startswith(f"umprov: gpu1: HOST KEY CHANGED for {PATTERN}: it presents ED25519 "
                           f"{ssh.fingerprint(KEY)} but {ssh.umprov_known_hosts()} records ED25519 "
                           f"{ssh.fingerprint(other)}")


def test_provision_trust_new_hosts_records_first_contact_only(inventory, umprov_cli,
                                                              monkeypatch):
    provision_run(monkeypatch, "Permission denied (publickey).")
    umprov_cli("provision", str(inventory), "--trust-new-hosts")
    known = ssh.load_known_hosts([ssh.umprov_known_hosts()])
    assert ssh.check_key(known, PATTERN, KEY).state == "known"
    # A different key later is refused, never recorded over the first.
    monkeypatch.setattr(ssh, "scan_host_key", lambda address, port, timeout=15.0: _key())
    result = umprov_cli("provision", str(inventory), "--trust-new-hosts")
    assert result.exit_code == ExitCode.TRUST and "HOST KEY CHANGED" in result.stderr


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--playbook", "stie.yml", "playbook not found: "),
    ("--strategy", "mitogen", "--strategy mitogen: the mitogen package is not installed")])
def test_provision_records_no_key_when_an_option_is_bad(inventory, umprov_cli, monkeypatch,
                                                        option, value, message):
    import umprov.provision.environment

    monkeypatch.setattr(umprov.provision.environment, "mitogen_strategy_dir", lambda: None)
    monkeypatch.setattr(ssh, "record_new_host_keys", lambda hosts: pytest.fail("recorded"))
    result = umprov_cli("provision", str(inventory), "--trust-new-hosts", option, value)
    assert result.exit_code == ExitCode.CONFIG, result.stderr
    assert message in result.stderr


@pytest.mark.parametrize(
    ("text", "refused"),
    [
        ("Failed to connect to the host via ssh: Host key verification failed.", True),
        (UNKNOWN_STDERR, True),
        ("Stream(ssh...): Host key checking is enabled, and SSH reported an unrecognized or "
         "mismatching host key.", True),
        ("Failed to connect to the host via ssh: ssh: connect to host 10.0.0.1 port 22: "
         "Connection refused", False),
        ("Permission denied (publickey).", False),
    ],
)
def test_openssh_and_mitogen_words_for_a_refused_key(text, refused):
    assert host_key_refused(text) is refused


def test_ssh_args_name_every_hosts_file_once_quoted(tmp_path, monkeypatch):
    monkeypatch.setenv("UMPROV_STATE_DIR", str(tmp_path / "state dir"))
    hosts = [SimpleNamespace(name=n, address="10.0.0.1", port=22, user=None, key_file=None,
                             known_hosts=str(tmp_path / "lab_known_hosts")) for n in "ab"]
    args = shlex.split(ssh.ansible_ssh_args(hosts, "-C"))
    assert args[0] == "-C"
    files = args[args.index("-o") + 1].removeprefix("UserKnownHostsFile=")
    assert files.count("lab_known_hosts") == 1
    assert f'"{tmp_path / "state dir" / "known_hosts"}"' in files
    # OpenSSH itself reads the option as three files (ssh -G parses, connects nowhere).
    shown = subprocess.run(["ssh", "-G", *args, "somehost"], capture_output=True, text=True,
                           check=False).stdout
    line = next(x for x in shown.splitlines() if x.startswith("userknownhostsfile "))
    assert line.split(" ", 1)[1] == " ".join(
        [str(tmp_path / "lab_known_hosts"), str(Path.home() / ".ssh" / "known_hosts"),
         str(tmp_path / "state dir" / "known_hosts")])
    assert json.dumps(args)  # plain strings


@pytest.mark.parametrize("address", ["gpu1:99999", "[::1]:0", "gpu1:", "a b"])
def test_trust_refuses_an_address_with_no_port_to_reach_before_any_contact(
        address: str, umprov_cli, monkeypatch) -> None:
    monkeypatch.setattr(ssh, "presented_key", lambda *_a: pytest.fail("contacted a host"))
    result = umprov_cli("trust", address, "--yes")
    assert result.exit_code == ExitCode.CONFIG, result.stderr
    assert result.stderr.count("\n") == 1 and f"'{address}' is not an address" in result.stderr
