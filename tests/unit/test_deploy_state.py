"""What deploy writes on this machine for a host: its files stay inside the state folders
whatever the host is called, and no inventory value adds a directive to its ssh_config."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.unit.fakes import FakeHost
from umprov.deploy import options, state
from umprov.errors import ConfigError, EngineDown, ExitCode
from umprov.paths import safe_name

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIC4xqZ1vUQ0n0Fvh5yq0i7XGkQm0sKQdLqJ6dW7b7c1T me@laptop"
UNSAFE_NAMES = ["../x", "a/b", "/etc/passwd", "..", ".hidden", "", "gpu 1", "gpu*", "a\nb",
                "x" * 201, "-oProxyCommand=x", "gpu,1", "fe80::1"]


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("UMPROV_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def settings(**kw: Any) -> options.HostSettings:
    return replace(options.HostSettings("img:1", "all", 2222, 8888, "127.0.0.1", "umprov"), **kw)


def ssh_resolved(conf: str, alias: str, tmp_path: Path) -> dict[str, list[str]]:
    """What OpenSSH itself makes of the file (`ssh -G`: parsed, nothing contacted)."""
    if shutil.which("ssh") is None:
        pytest.skip("no OpenSSH client here")
    path = tmp_path / "ssh.conf"
    path.write_text(conf)
    proc = subprocess.run(["ssh", "-G", "-F", str(path), alias], capture_output=True, text=True,
                          check=True, timeout=30)
    out: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition(" ")
        out.setdefault(key, []).append(value)
    return out


# --- host names and the files named after them -------------------------------------------------


@pytest.mark.parametrize("name", ["gpu1", "gpu-01.example.com", "10.0.0.5", "node_7", "GPU.A-1"])
def test_ordinary_host_names_name_their_files_as_they_are(name: str, state_dir: Path) -> None:
    assert safe_name(name) == name
    assert state.token_path(name) == state_dir / "tokens" / f"{name}.token"
    assert state.ssh_config_path(name) == state_dir / "ssh" / f"{name}.conf"
    assert state.connection_path(name) == state_dir / "connections" / f"{name}.json"
    assert state.container_alias(name) == f"umprov-{name}"


@pytest.mark.parametrize("name", UNSAFE_NAMES)
def test_a_host_name_that_could_leave_the_state_folder_is_refused(name: str) -> None:
    for path_of in (state.token_path, state.ssh_config_path, state.connection_path,
                    state.container_alias, state.load_connection, state.stored_token):
        with pytest.raises(ConfigError, match="cannot name umprov's files") as err:
            path_of(name)
        assert err.value.exit_code == ExitCode.CONFIG
        assert "\n" not in str(err.value)


def test_status_connect_refuses_a_path_as_host_name(umprov_cli, tmp_path: Path) -> None:
    secret = tmp_path / "x.token"
    secret.write_text("not yours\n")
    result = umprov_cli("status", "--connect", "../../x")
    assert result.exit_code == ExitCode.CONFIG, result.output
    assert "'../../x' cannot name umprov's files" in result.stderr
    assert "not yours" not in result.output


def test_deploy_touches_no_host_whose_name_cannot_name_its_files(
    monkeypatch: pytest.MonkeyPatch, state_dir: Path
) -> None:
    from umprov.deploy import run
    from umprov.hosts import engine

    contacted: list[str] = []

    def docker_client(host: Any, **_: Any) -> Any:
        contacted.append(host.name)
        raise EngineDown("stop here")

    monkeypatch.setattr(engine, "docker_client", docker_client)
    opts = options.DeployOptions(image="img:1", authorized_keys=KEY)
    hosts = [FakeHost(name="../evil"), FakeHost(name="gpu1")]
    bad, good = run.deploy(hosts, opts)
    assert contacted == ["gpu1"]
    assert bad.state == "failed" and "'../evil' cannot name umprov's files" in bad.detail
    assert good.detail == "stop here"
    assert not list(state_dir.parent.glob("evil*")), "a file was written outside the state dir"


# --- ssh_config values -------------------------------------------------------------------------


INJECTIONS = [
    ("address", "10.0.0.5\n  ProxyCommand touch /tmp/pwned"),
    ("address", '10.0.0.5" ProxyCommand "x'),
    ("user", "ops\nHost *\n  ProxyCommand x"),
    ("user", "o%hps"),
    ("key_file", "/keys/id\r\nLocalCommand x"),
    ("key_file", "/keys/id\\\" x"),
    ("key_file", "${HOME}/.ssh/id"),
    ("known_hosts", "/kh\tx\0"),
]


@pytest.mark.parametrize(("field", "value"), INJECTIONS)
def test_an_inventory_value_that_would_add_a_directive_is_refused_naming_host_and_value(
    field: str, value: str
) -> None:
    host = FakeHost(**{"key_file": "/keys/ops", field: value})
    with pytest.raises(ConfigError) as err:
        state.check_host(host, settings(), None)
    message = str(err.value)
    assert message.startswith("gpu1: ") and "\n" not in message
    assert repr(value)[:10] in message  # the value, as Python writes it: escapes visible


def test_values_with_spaces_hashes_and_percents_stay_one_argument(tmp_path: Path) -> None:
    host = FakeHost(key_file="/home/me/My Keys/id #1", known_hosts="/srv/known hosts",
                    address="gpu1.example.com", user="ops")
    conf = state.render_ssh_config(host, settings(), "umprov", "/home/me/100%/id_ed25519")
    ssh = ssh_resolved(conf, "umprov-gpu1", tmp_path)
    # -G shows IdentityFile before its %-tokens are expanded: "%%" is a literal "%" at use.
    assert ssh["identityfile"] == ["/home/me/100%%/id_ed25519"]
    assert ssh["proxyjump"] == ["umprov-gpu1-host"]
    assert ssh["hostname"] == ["127.0.0.1"] and ssh["port"] == ["2222"]
    jump = ssh_resolved(conf, "umprov-gpu1-host", tmp_path)
    assert jump["identityfile"] == ["/home/me/My Keys/id #1"]
    assert jump["hostname"] == ["gpu1.example.com"] and jump["user"] == ["ops"]
    assert '"/srv/known hosts"' in conf and "/srv/known hosts" in jump["userknownhostsfile"][0]
    assert "proxycommand" not in jump and "localcommand" not in jump


def test_the_container_user_from_the_image_label_is_checked_too() -> None:
    with pytest.raises(ConfigError, match="container user"):
        state.render_ssh_config(FakeHost(), settings(), "umprov\nProxyCommand x", None)


# --- known_hosts names ----------------------------------------------------------------------


@pytest.mark.parametrize("pattern", ["a b", "x\n* ssh-ed25519 AAAA", "*", "gpu?", "!gpu", "a,b",
                                     "#x", ""])
def test_a_known_hosts_name_that_would_match_other_hosts_is_never_recorded(
    pattern: str, tmp_path: Path
) -> None:
    from umprov.hosts.ssh import record_host_key

    known = tmp_path / "known_hosts"
    pkey = _a_key()
    with pytest.raises(ConfigError, match="known_hosts name"):
        record_host_key(pattern, pkey, known)
    assert not known.exists() or known.read_text() == ""
    record_host_key("[10.0.0.5]:2222", pkey, known)
    assert known.read_text().startswith("[10.0.0.5]:2222 ecdsa-")


def _a_key() -> Any:
    import paramiko

    return paramiko.ECDSAKey.generate()
