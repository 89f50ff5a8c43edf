"""umprov.deploy: options, the container spec, its hash, results (no Docker, no network)."""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.unit.fakes import FakeHost as _FakeHost
from umprov import deploy
from umprov.errors import ConfigError, ExitCode


def FakeHost(**fields: Any) -> _FakeHost:  # noqa: N802 - stands in for the class
    """A GPU host with a key file."""
    return _FakeHost(**{"key_file": "/keys/ops", **fields})

ANY = "0.0.0.0"  # noqa: S104 (a value under test, nothing binds)
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIC4xqZ1vUQ0n0Fvh5yq0i7XGkQm0sKQdLqJ6dW7b7c1T me@laptop"


@pytest.fixture(autouse=True)
def _state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UMPROV_STATE_DIR", str(tmp_path / "state"))


def settings(**kw: Any) -> deploy.HostSettings:
    base = deploy.HostSettings("img:1", "all", 2222, 8888, "127.0.0.1", "umprov")
    return replace(base, **kw)


# --- options ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("all", "all"), ("ALL", "all"), ("none", "none"), ("0,1", ["0", "1"]), (" 3 ", ["3"]),
     ("GPU-8d1b-22", ["GPU-8d1b-22"])],
)
def test_parse_gpus(text: str, expected: Any):
    assert deploy.parse_gpus(text) == expected


@pytest.mark.parametrize("text", ["", "0,,x", "-1", "0,0", "gpu0"])
def test_parse_gpus_rejects(text: str):
    with pytest.raises(ConfigError):
        deploy.parse_gpus(text)


def test_ports_and_bind_checked():
    assert deploy.check_port("2222", "--ssh-port") == 2222
    for bad in (0, 70000, "x"):
        with pytest.raises(ConfigError):
            deploy.check_port(bad, "--ssh-port")
    assert deploy.check_bind(ANY) == ANY
    assert deploy.check_bind("[::1]") == "::1"
    with pytest.raises(ConfigError):
        deploy.check_bind("localhost")


def test_public_key_checked():
    assert deploy.check_public_key(KEY + "\n\n", "k.pub") == KEY
    with pytest.raises(ConfigError, match="private key"):
        deploy.check_public_key("-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n", "k")
    with pytest.raises(ConfigError, match="no public key"):
        deploy.check_public_key("# only a comment\n", "k.pub")


def test_settings_precedence_cli_over_vars_over_defaults():
    host = FakeHost(vars={"umprov_image": "var:img", "umprov_ssh_port": 2300,
                          "umprov_gpus": "none", "umprov_bind": ANY})
    s = deploy.settings_for(host, deploy.DeployOptions())
    assert (s.image, s.ssh_port, s.jupyter_port, s.gpus, s.bind) == (
        "var:img", 2300, 8888, "none", ANY)
    s = deploy.settings_for(host, deploy.DeployOptions(image="cli:img", ssh_port=2400, gpus="0"))
    assert (s.image, s.ssh_port, s.gpus) == ("cli:img", 2400, ["0"])
    assert s.raise_limits is True
    lab = deploy.settings_for(FakeHost(vars={"umprov_container_limits": False}), deploy.DeployOptions(image="i"))
    assert lab.raise_limits is False and lab.gpus == "all" and lab.bind == "127.0.0.1"


def test_settings_errors():
    with pytest.raises(ConfigError, match="no image"):
        deploy.settings_for(FakeHost(), deploy.DeployOptions())
    with pytest.raises(ConfigError, match="both 2222"):
        deploy.settings_for(FakeHost(), deploy.DeployOptions(image="i", jupyter_port=2222))
    with pytest.raises(ConfigError, match="not valid"):
        deploy.settings_for(FakeHost(), deploy.DeployOptions(image="i", name="bad name"))


# --- the spec and its hash -------------------------------------------------------------------


def test_spec_hash_is_stable_and_sensitive():
    spec = deploy.container_spec(settings(), "sha256:aaa", KEY)
    same = deploy.container_spec(settings(), "sha256:aaa", KEY)
    assert deploy.spec_hash(spec) == deploy.spec_hash(same)
    assert deploy.spec_hash(spec) == deploy.spec_hash(json.loads(json.dumps(spec)))
    changes = [
        deploy.container_spec(settings(ssh_port=2223), "sha256:aaa", KEY),
        deploy.container_spec(settings(bind=ANY), "sha256:aaa", KEY),
        deploy.container_spec(settings(gpus=["0"]), "sha256:aaa", KEY),
        deploy.container_spec(settings(), "sha256:bbb", KEY),
        deploy.container_spec(settings(), "sha256:aaa", KEY + "x"),
        deploy.container_spec(settings(raise_limits=False), "sha256:aaa", KEY),
    ]
    hashes = {deploy.spec_hash(c) for c in changes}
    assert deploy.spec_hash(spec) not in hashes and len(hashes) == len(changes)


def test_spec_holds_no_secret():
    spec = deploy.container_spec(settings(), "sha256:aaa", KEY)
    assert "password" not in json.dumps(spec).lower()
    assert spec["environment"]["JUPYTER_TOKEN_FILE"] == deploy.TOKEN_PATH
    assert "JUPYTER_TOKEN" not in spec["environment"]


def test_create_kwargs_gpus_limits_and_ports():
    from docker.types import DeviceRequest

    spec = deploy.container_spec(settings(), "sha256:aaa", KEY)
    labels = deploy.labels_for(spec, "img:1")
    kw = deploy.create_kwargs(spec, labels)
    assert kw["runtime"] == "nvidia"
    (req,) = kw["device_requests"]
    assert isinstance(req, DeviceRequest) and req["Count"] == -1
    assert req["Capabilities"] == [["gpu"]]
    assert kw["ports"] == {"22/tcp": ("127.0.0.1", 2222), "8888/tcp": ("127.0.0.1", 8888)}
    assert {u["Name"]: (u["Soft"], u["Hard"]) for u in kw["ulimits"]}["memlock"] == (-1, -1)
    assert kw["shm_size"] == "16g" and kw["restart_policy"] == {"Name": "unless-stopped"}
    assert kw["volumes"]["umprov-workspace"] == {"bind": "/workspace", "mode": "rw"}
    assert kw["volumes"]["umprov-ssh-keys"]["bind"] == "/etc/ssh/keys"
    assert labels["org.umprov.spec-hash"] == deploy.spec_hash(spec)
    assert labels["org.umprov.version"]

    some = deploy.create_kwargs(deploy.container_spec(settings(gpus=["0", "1"]), "x", KEY), {})
    assert some["device_requests"][0]["DeviceIDs"] == ["0", "1"]
    none = deploy.create_kwargs(
        deploy.container_spec(settings(gpus="none", raise_limits=False), "x", KEY), {})
    assert "runtime" not in none and "device_requests" not in none and none["ulimits"] == []


def test_token_goes_in_as_a_root_only_file():
    data = deploy._token_tar("s3cret-token-value")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        (member,) = tar.getmembers()
        assert member.name == deploy.TOKEN_PATH.lstrip("/")
        assert member.mode == 0o400 and member.uid == 0
        assert tar.extractfile(member).read() == b"s3cret-token-value"


# --- where the container is reached, pinned keys, ssh config -------------------------------


def test_loopback_bind_goes_through_the_host():
    host = FakeHost()
    s = settings()
    assert deploy.container_address(host, s) == ("127.0.0.1", True)
    assert deploy.key_patterns(host, s) == ["umprov-gpu1"]
    conf = deploy.render_ssh_config(host, s, "umprov", "/keys/me")
    assert "ProxyJump umprov-gpu1-host" in conf
    assert "StrictHostKeyChecking yes" in conf and "StrictHostKeyChecking no" not in conf
    assert "HostKeyAlias umprov-gpu1" in conf and "HostName 10.0.0.5" in conf


def test_public_bind_pins_the_address_too():
    host = FakeHost()
    s = settings(bind=ANY)
    assert deploy.container_address(host, s) == ("10.0.0.5", False)
    assert deploy.key_patterns(host, s) == ["umprov-gpu1", "[10.0.0.5]:2222"]
    assert "ProxyJump" not in deploy.render_ssh_config(host, s, "umprov", None)


# --- results ---------------------------------------------------------------------------------


def test_exit_codes():
    ok = deploy.HostResult("a", status="unchanged")
    down = deploy.HostResult("b", status="unreachable")
    untrusted = deploy.HostResult("c", status="untrusted")
    failed = deploy.HostResult("d", status="failed")
    assert deploy.exit_code([ok]) == ExitCode.OK
    assert deploy.exit_code([ok, down]) == ExitCode.HOSTS_UNREACHABLE
    assert deploy.exit_code([ok, down, untrusted]) == ExitCode.TRUST
    assert deploy.exit_code([ok, down, failed]) == ExitCode.HOSTS_FAILED


def test_port_message():
    class Err(Exception):
        explanation = ("driver failed programming external connectivity on endpoint umprov: "
                       "Bind for 127.0.0.1:2222 failed: port is already allocated")

    msg = deploy._port_message(Err(), settings())
    assert msg == "port 2222 on 127.0.0.1 is already in use on the host"


def test_broadcast_feeds_every_host_and_survives_a_dropped_one():
    import threading

    b = deploy._Broadcast(["a", "b"], depth=2)
    got: dict[str, bytes] = {}
    counters = {"a": [0], "b": [0]}

    def eat(name: str, stop_after: int | None) -> None:
        out = b""
        for i, chunk in enumerate(b.consume(name, counters[name])):
            out += chunk
            if stop_after is not None and i >= stop_after:
                b.drop(name)
                break
        got[name] = out

    threads = [threading.Thread(target=eat, args=("a", None)),
               threading.Thread(target=eat, args=("b", 1))]
    for t in threads:
        t.start()
    b.produce(iter([bytes([i]) * 10 for i in range(50)]))
    for t in threads:
        t.join(timeout=10)
    assert got["a"] == b"".join(bytes([i]) * 10 for i in range(50))
    assert counters["a"][0] == 500 and len(got["b"]) == 20
