"""`umprov deploy`, `status --connect`, `trust` and `image build` option handling, in-process."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIC4xqZ1vUQ0n0Fvh5yq0i7XGkQm0sKQdLqJ6dW7b7c1T me@laptop"


@pytest.fixture
def pubkey(tmp_path: Path) -> Path:
    path = tmp_path / "id_ed25519.pub"
    path.write_text(KEY + "\n")
    return path


def test_deploy_help_lists_the_options(umprov_cli):
    result = umprov_cli("deploy", "--help")
    assert result.exit_code == 0
    for opt in ("--image", "--pull", "--push", "--gpus", "--ssh-port", "--jupyter-port", "--bind",
                "--authorized-key", "--force", "--json", "--trust-new-hosts"):
        assert opt in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpus", "zero"], "not a GPU index"),
        (["--ssh-port", "0"], "--ssh-port must be from 1 to 65535"),
        (["--jupyter-port", "99999"], "--jupyter-port must be from 1 to 65535"),
        (["--bind", "everywhere"], "--bind must be an IP address"),
    ],
)
def test_deploy_rejects_bad_options_before_any_host(umprov_cli, pubkey, args, message):
    result = umprov_cli("deploy", "nowhere.yml", "--authorized-key", str(pubkey), *args)
    assert result.exit_code == 4, result.stderr
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_deploy_refuses_a_private_key(umprov_cli, tmp_path):
    key = tmp_path / "id_ed25519"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nxx\n-----END OPENSSH PRIVATE KEY-----\n")
    result = umprov_cli("deploy", "nowhere.yml", "--authorized-key", str(key))
    assert result.exit_code == 4 and "private key" in result.stderr


def test_deploy_missing_inventory_is_an_inventory_error(umprov_cli, pubkey):
    result = umprov_cli("deploy", "no/such/inventory.yml", "--authorized-key", str(pubkey))
    assert result.exit_code == 3 and "inventory not found" in result.stderr


def test_status_connect_without_deploy(umprov_cli):
    result = umprov_cli("status", "--connect", "gpu1")
    assert result.exit_code == 4 and "nothing deployed" in result.stderr


def test_status_connect_prints_token_only_when_asked(umprov_cli, tmp_path):
    from umprov.deploy import options, state

    host = type("H", (), {"name": "gpu1", "address": "10.0.0.5", "port": 22, "user": "ops",
                          "key_file": None, "known_hosts": None, "vars": {}})()
    settings = options.HostSettings("img", "all", 2222, 8888, "127.0.0.1", "umprov")
    state.record_connection(host, settings, "umprov", None)
    from umprov.paths import write_private

    write_private(state.token_path("gpu1"), "tok-" + "x" * 40 + "\n")
    result = umprov_cli("status", "--connect", "gpu1")
    assert result.exit_code == 0
    assert "ssh -F" in result.stdout and "umprov-gpu1" in result.stdout
    assert "token=tok-" in result.stdout and "-L 18888:127.0.0.1:8888" in result.stdout
    assert "http://127.0.0.1:18888/lab?token=tok-" in result.stdout


def test_status_connect_json_is_data_and_a_damaged_record_is_one_line(umprov_cli):
    from umprov.deploy import options, state
    from umprov.paths import write_private

    host = type("H", (), {"name": "gpu1", "address": "10.0.0.5", "port": 22, "user": "ops",
                          "key_file": None, "known_hosts": None, "vars": {}})()
    settings = options.HostSettings("img", "all", 2222, 8888, "127.0.0.1", "umprov")
    state.record_connection(host, settings, "umprov", None)
    write_private(state.token_path("gpu1"), "tok-1\n")
    result = umprov_cli("status", "--connect", "gpu1", "--json")
    assert result.exit_code == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["host"] == "gpu1" and info["ssh"].endswith(" umprov-gpu1")
    assert info["tunnel"].startswith("ssh -F ") and "-L 18888:127.0.0.1:8888" in info["tunnel"]
    assert info["jupyter_url"] == "http://127.0.0.1:18888/lab?token=tok-1"
    record = state.connection_path("gpu1")
    tunnel = dict(json.loads(record.read_text()), via_host=True)
    tunnel.pop("jump_alias")
    for damage in ('{"host": "gpu1", "addr', '["gpu1"]', '{"host": "gpu1"}', json.dumps(tunnel)):
        record.write_text(damage)
        result = umprov_cli("status", "--connect", "gpu1")
        assert result.exit_code == 4, result.stderr
        assert result.stderr.count("\n") == 1 and str(record) in result.stderr
        assert "re-run umprov deploy" in result.stderr


def test_each_hosts_tunnel_has_its_own_local_port_kept_across_deploys(umprov_cli):
    """Two hosts' Jupyter tunnels open at once: each host gets a local port of its own, and
    keeps it when deployed again."""
    from umprov.deploy import options, state

    settings = options.HostSettings("img", "all", 2222, 8888, "127.0.0.1", "umprov")

    def record(name: str) -> int:
        host = type("H", (), {"name": name, "address": "10.0.0.5", "port": 22, "user": "ops",
                              "key_file": None, "known_hosts": None, "vars": {}})()
        return state.record_connection(host, settings, "umprov", None)["tunnel_port"]

    # A record an older umprov wrote (no tunnel port) is no obstacle (make demo failed on it).
    import json

    from umprov.paths import write_atomic

    write_atomic(state.connection_path("gpu0"), json.dumps({"host": "gpu0"}), 0o600)
    ports = {name: record(name) for name in ("gpu1", "gpu2", "gpu3")}
    assert sorted(ports.values()) == [18888, 18889, 18890]
    assert record("gpu2") == ports["gpu2"] and record("gpu1") == ports["gpu1"]


def test_tunnel_ports_come_from_one_index_built_once_from_older_records(umprov_cli):
    """Records an older umprov wrote keep their ports (the index is built from them once);
    `forget` (lab down) gives a port back; concurrent deploys never share one."""
    import json
    import threading

    from umprov.deploy import state
    from umprov.paths import write_atomic

    write_atomic(state.connection_path("old"), json.dumps({"host": "old", "tunnel_port": 18888}))
    assert state.tunnel_port("new") == 18889
    assert json.loads(state.tunnel_ports_path().read_text()) == {"new": 18889, "old": 18888}
    state.connection_path("old").unlink()  # the index, not the records, holds the ports now
    assert state.tunnel_port("old") == 18888
    state.forget("old")
    assert state.tunnel_port("newer") == 18888
    got: list[int] = []
    threads = [threading.Thread(target=lambda i=i: got.append(state.tunnel_port(f"h{i}")))
               for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(18890, 18906))


def test_trust_needs_an_address_or_inventory(umprov_cli):
    result = umprov_cli("trust", "not an address")
    assert result.exit_code == 4


def test_image_build_help(umprov_cli):
    result = umprov_cli("image", "build", "--help")
    assert result.exit_code == 0
    assert "--base" in result.stdout and "--tag" in result.stdout
    assert "--torch-wheel" in result.stdout
    assert "--lab" not in result.stdout  # the lab's image: `umprov lab image` (umprov-lab)


def test_image_requirements_and_platforms():
    from umprov import image

    assert image.requirements(None) == ["jupyterlab", "ipykernel", "numpy", "pip"]
    wheel = Path("/w/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
    assert image.requirements(wheel)[0] == "torch==2.13.0+cpu"
    plats = image.Target("3.11", "2.36").platforms()
    assert "manylinux2014_x86_64" in plats and "manylinux_2_36_x86_64" in plats
    assert "manylinux_2_37_x86_64" not in plats
    assert image.Target("3.11", "2.36").abi == "cp311"


# Option values checked before any host is contacted (issue 19).


@pytest.fixture
def no_contact(monkeypatch):
    """No SSH connection is made (each attempt is recorded and refused); the test checks the
    list is still empty at its end."""
    import paramiko

    contacts: list[str] = []

    def refuse(_client, hostname, *_args, **_kwargs):
        contacts.append(hostname)
        raise paramiko.SSHException("no contact in this test")

    monkeypatch.setattr(paramiko.SSHClient, "connect", refuse)
    yield
    assert contacts == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--push", "--pull"], "--push and --pull: choose one"),
        (["--shm-size", "lots"], "--shm-size: 'lots' is not a size such as 16g"),
        (["--name", "bad name"], "--name: 'bad name' is not valid as a container name"),
        (["--image", "Not/Valid Image"], "is not an image reference"),
    ],
)
def test_deploy_option_values_checked_before_hosts(umprov_cli, pubkey, tmp_path, no_contact,
                                                   args, message):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    gpu1: {ansible_host: 10.0.0.1}\n")
    result = umprov_cli("deploy", str(inventory), "--authorized-key", str(pubkey), *args)
    assert result.exit_code == 4, result.stderr
    assert message in result.stderr and result.stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("host_vars", "code", "message"),
    [
        # One value: the inventory's own check, as `umprov inventory check` makes it (exit 3).
        ("umprov_image: 'No Such/Image!'", 3,
         "hosts.yml:4: variable 'umprov_image' on host 'gpu2': 'No Such/Image!' is not an image"),
        ("umprov_container_name: '-x'", 3,
         "hosts.yml:4: variable 'umprov_container_name' on host 'gpu2': '-x' is not valid"),
        # Two values that clash: deploy's (exit 4).
        ("{umprov_ssh_port: 8888, umprov_jupyter_port: 8888}", 4, "both 8888"),
    ],
)
def test_deploy_host_values_checked_before_any_host(umprov_cli, pubkey, tmp_path, no_contact,
                                                    host_vars, code, message):
    inventory = tmp_path / "hosts.yml"
    text = host_vars if host_vars.startswith("{") else "{" + host_vars + "}"
    inventory.write_text("all:\n  hosts:\n    gpu1: {ansible_host: 10.0.0.1}\n"
                         f"    gpu2: {text}\n")
    result = umprov_cli("deploy", str(inventory), "--authorized-key", str(pubkey))
    assert result.exit_code == code, result.stderr
    assert message in result.stderr and result.stderr.count("\n") == 1


def test_deploy_defaults_to_the_image_image_build_tags():
    from tests.unit.fakes import FakeHost
    from umprov.deploy.options import DeployOptions, settings_for
    from umprov.image import DEFAULT_TAG

    assert settings_for(FakeHost(), DeployOptions()).image == DEFAULT_TAG
    host = FakeHost(vars={"umprov_image": "registry.example.com/mine:1"})
    assert settings_for(host, DeployOptions()).image == "registry.example.com/mine:1"
    assert settings_for(host, DeployOptions(image="x/y:2")).image == "x/y:2"


@pytest.mark.parametrize(("args", "message"), [
    (["status", "hosts.yml", "--name", "a/b"], "--name: 'a/b' is not valid as a container name"),
    (["verify", "hosts.yml", "--image", "a b"], "--image: 'a b' is not an image"),
    (["image", "build", "--tag", "bad tag"], "--tag: 'bad tag' is not an image reference"),
    (["image", "build", "--base", "::"], "--base: '::' is not an image reference"),
    (["image", "build", "--python", "3.x"], "--python '3.x': not a Python version"),
    (["image", "build", "--torch-wheel", "pyproject.toml"], "not a torch wheel file name"),
])
def test_other_commands_check_their_values_first(umprov_cli, no_contact, args, message):
    result = umprov_cli(*args)
    assert result.exit_code == 4, result.stderr
    assert message in result.stderr


def test_image_build_refuses_a_missing_torch_wheel_before_any_engine(umprov_cli, no_contact):
    result = umprov_cli("image", "build", "--torch-wheel", "no/such/torch-2.9.0-x.whl")
    assert result.exit_code == 4 and "does not exist" in result.stderr


def test_a_failed_download_for_another_target_keeps_the_wheel_cache(tmp_path, monkeypatch):
    from umprov import image
    from umprov.errors import EnvironmentProblem

    cache = tmp_path / "wheels"
    cache.mkdir()
    (cache / "torch-2.9.0-cp311-x.whl").write_text("a wheel")
    (cache / ".target.json").write_text('{"python": "3.11"}')
    calls: list[list[str]] = []

    def pip(cmd, **_kw):
        calls.append(cmd)
        dest = Path(cmd[cmd.index("--dest") + 1])
        (dest / "half.whl").write_text("half")
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: no such version\n")

    monkeypatch.setattr(image.subprocess, "run", pip)
    target = image.Target(python="3.12", glibc="2.36")
    with pytest.raises(EnvironmentProblem, match="no such version"):
        image.download_wheels(cache, ["numpy"], target, find_links=[])
    assert sorted(p.name for p in cache.iterdir()) == [".target.json", "torch-2.9.0-cp311-x.whl"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wheels"]  # no half-made folder left

    def pip_ok(cmd, **_kw):
        dest = Path(cmd[cmd.index("--dest") + 1])
        (dest / "numpy-2-cp312-x.whl").write_text("new")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(image.subprocess, "run", pip_ok)
    assert image.download_wheels(cache, ["numpy"], target, find_links=[]) == 1
    assert sorted(p.name for p in cache.iterdir()) == [
        ".target.json", "numpy-2-cp312-x.whl", "requirements.txt"]


def test_deploy_touches_no_host_when_one_name_cannot_name_its_files(
        umprov_cli, pubkey, tmp_path, no_contact, monkeypatch):
    import umprov.deploy.run

    def deploy(*_args, **_kwargs):
        raise AssertionError("a host was deployed to")

    monkeypatch.setattr(umprov.deploy.run, "deploy", deploy)
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    gpu1: {ansible_host: 10.0.0.1}\n"
                         "    ../evil: {ansible_host: 10.0.0.2}\n")
    result = umprov_cli("deploy", str(inventory), "--authorized-key", str(pubkey))
    assert result.exit_code == 4, result.output
    assert result.stderr.startswith("umprov: error: ../evil: host name '../evil' cannot")
