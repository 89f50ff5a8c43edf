"""umprov.deploy: options, the container spec, its hash, local state, messages (no Docker,
no network)."""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.unit.fakes import FakeHost as _FakeHost
from umprov.deploy import options, state, stream
from umprov.deploy import spec as specs
from umprov.deploy.rollout import start_failure
from umprov.errors import ConfigError


def FakeHost(**fields: Any) -> _FakeHost:  # noqa: N802 - stands in for the class
    """A GPU host with a key file."""
    return _FakeHost(**{"key_file": "/keys/ops", **fields})

ANY = "0.0.0.0"  # noqa: S104 (a value under test, nothing binds)
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIC4xqZ1vUQ0n0Fvh5yq0i7XGkQm0sKQdLqJ6dW7b7c1T me@laptop"


@pytest.fixture(autouse=True)
def _state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UMPROV_STATE_DIR", str(tmp_path / "state"))


def settings(**kw: Any) -> options.HostSettings:
    base = options.HostSettings("img:1", "all", 2222, 8888, "127.0.0.1", "umprov")
    return replace(base, **kw)


# --- options ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("all", "all"), ("ALL", "all"), ("none", "none"), ("0,1", ["0", "1"]), (" 3 ", ["3"]),
     ("GPU-8d1b-22", ["GPU-8d1b-22"])],
)
def test_parse_gpus(text: str, expected: Any):
    assert options.parse_gpus(text) == expected


@pytest.mark.parametrize("text", ["", "0,,x", "-1", "0,0", "gpu0"])
def test_parse_gpus_rejects(text: str):
    with pytest.raises(ConfigError):
        options.parse_gpus(text)


def test_ports_and_bind_checked():
    assert options.check_port("2222", "--ssh-port") == 2222
    for bad in (0, 70000, "x"):
        with pytest.raises(ConfigError):
            options.check_port(bad, "--ssh-port")
    assert options.check_bind(ANY) == ANY
    assert options.check_bind("[::1]") == "::1"
    with pytest.raises(ConfigError):
        options.check_bind("localhost")


def test_public_key_checked():
    assert options.check_public_key(KEY + "\n\n", "k.pub") == KEY
    with pytest.raises(ConfigError, match="private key"):
        options.check_public_key("-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n", "k")
    with pytest.raises(ConfigError, match="no public key"):
        options.check_public_key("# only a comment\n", "k.pub")


def test_settings_precedence_cli_over_vars_over_defaults():
    host = FakeHost(vars={"umprov_image": "var:img", "umprov_ssh_port": 2300,
                          "umprov_gpus": "none", "umprov_bind": ANY})
    s = options.settings_for(host, options.DeployOptions())
    assert (s.image, s.ssh_port, s.jupyter_port, s.gpus, s.bind) == (
        "var:img", 2300, 8888, "none", ANY)
    s = options.settings_for(host, options.DeployOptions(image="cli:img", ssh_port=2400, gpus="0"))
    assert (s.image, s.ssh_port, s.gpus) == ("cli:img", 2400, ["0"])
    assert s.raise_limits is True
    lab = options.settings_for(FakeHost(vars={"umprov_container_limits": False}),
                               options.DeployOptions(image="i"))
    assert lab.raise_limits is False and lab.gpus == "all" and lab.bind == "127.0.0.1"
    for word, raised in (("no", False), ("off", False), ("yes", True), ("true", True)):
        host = FakeHost(vars={"umprov_container_limits": word})  # an INI value stays a string
        assert options.settings_for(host, options.DeployOptions(image="i")).raise_limits is raised


def test_settings_errors():
    # No image anywhere is no longer an error (issue 19): the tag `umprov image build` gives.
    from umprov.image import DEFAULT_TAG

    assert options.settings_for(FakeHost(), options.DeployOptions()).image == DEFAULT_TAG
    with pytest.raises(ConfigError, match="is not an image reference"):
        options.settings_for(FakeHost(vars={"umprov_image": "Bad Image"}), options.DeployOptions())
    with pytest.raises(ConfigError, match="both 2222"):
        options.settings_for(FakeHost(), options.DeployOptions(image="i", jupyter_port=2222))
    with pytest.raises(ConfigError, match="not valid"):
        options.settings_for(FakeHost(), options.DeployOptions(image="i", name="bad name"))


@pytest.mark.parametrize(("host_vars", "message"), [
    ({"umprov_bind": "999.1.1.1"}, "gpu1: umprov_bind must be an IP address"),
    ({"umprov_gpus": "0,0,x"}, "gpu1: umprov_gpus: 'x' is not a GPU index"),
    ({"umprov_gpus": "0,0"}, "gpu1: umprov_gpus lists a GPU twice"),
])
def test_a_bad_host_variable_is_named_never_an_option_not_given(host_vars, message):
    with pytest.raises(ConfigError) as err:
        options.settings_for(FakeHost(vars=host_vars), options.DeployOptions(image="i"))
    assert str(err.value).startswith(message), str(err.value)
    assert "--" not in str(err.value)


@pytest.mark.parametrize(("value", "expected"), [(0, ["0"]), (3, ["3"]), ("0", ["0"]),
                                                 ("", "all"), (None, "all")])
def test_umprov_gpus_zero_is_gpu_zero_never_all(value, expected):
    host = FakeHost(vars={"umprov_gpus": value})
    assert options.settings_for(host, options.DeployOptions(image="i")).gpus == expected


# --- the spec and its hash -------------------------------------------------------------------


def test_spec_hash_is_stable_and_sensitive():
    spec = specs.container_spec(settings(), "sha256:aaa", KEY)
    same = specs.container_spec(settings(), "sha256:aaa", KEY)
    assert specs.spec_hash(spec) == specs.spec_hash(same)
    assert specs.spec_hash(spec) == specs.spec_hash(json.loads(json.dumps(spec)))
    changes = [
        specs.container_spec(settings(ssh_port=2223), "sha256:aaa", KEY),
        specs.container_spec(settings(bind=ANY), "sha256:aaa", KEY),
        specs.container_spec(settings(gpus=["0"]), "sha256:aaa", KEY),
        specs.container_spec(settings(), "sha256:bbb", KEY),
        specs.container_spec(settings(), "sha256:aaa", KEY + "x"),
        specs.container_spec(settings(raise_limits=False), "sha256:aaa", KEY),
    ]
    hashes = {specs.spec_hash(c) for c in changes}
    assert specs.spec_hash(spec) not in hashes and len(hashes) == len(changes)


def test_spec_holds_no_secret():
    spec = specs.container_spec(settings(), "sha256:aaa", KEY)
    assert "password" not in json.dumps(spec).lower()
    assert spec["environment"]["JUPYTER_TOKEN_FILE"] == specs.TOKEN_PATH
    assert "JUPYTER_TOKEN" not in spec["environment"]


def test_create_kwargs_gpus_limits_and_ports():
    from docker.types import DeviceRequest

    spec = specs.container_spec(settings(), "sha256:aaa", KEY)
    labels = specs.labels_for(spec, "img:1")
    kw = specs.create_kwargs(spec, labels)
    assert kw["runtime"] == "nvidia"
    (req,) = kw["device_requests"]
    assert isinstance(req, DeviceRequest) and req["Count"] == -1
    assert req["Capabilities"] == [["gpu"]]
    assert kw["ports"] == {"22/tcp": ("127.0.0.1", 2222), "8888/tcp": ("127.0.0.1", 8888)}
    assert {u["Name"]: (u["Soft"], u["Hard"]) for u in kw["ulimits"]}["memlock"] == (-1, -1)
    assert kw["shm_size"] == "16g" and kw["restart_policy"] == {"Name": "unless-stopped"}
    assert kw["volumes"]["umprov-workspace"] == {"bind": "/workspace", "mode": "rw"}
    assert kw["volumes"]["umprov-ssh-keys"]["bind"] == "/etc/ssh/keys"
    assert labels["org.umprov.spec-hash"] == specs.spec_hash(spec)
    assert labels["org.umprov.version"]

    some = specs.create_kwargs(specs.container_spec(settings(gpus=["0", "1"]), "x", KEY), {})
    assert some["device_requests"][0]["DeviceIDs"] == ["0", "1"]
    none = specs.create_kwargs(
        specs.container_spec(settings(gpus="none", raise_limits=False), "x", KEY), {})
    assert "runtime" not in none and "device_requests" not in none and none["ulimits"] == []


def test_token_goes_in_as_a_root_only_file():
    data = specs.token_tar("s3cret-token-value")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        (member,) = tar.getmembers()
        assert member.name == specs.TOKEN_PATH.lstrip("/")
        assert member.mode == 0o400 and member.uid == 0
        assert tar.extractfile(member).read() == b"s3cret-token-value"


# --- where the container is reached, pinned keys, ssh config -------------------------------


def test_loopback_bind_goes_through_the_host():
    host = FakeHost()
    s = settings()
    assert state.container_address(host, s) == ("127.0.0.1", True)
    assert state.key_patterns(host, s) == ["umprov-gpu1"]
    conf = state.render_ssh_config(host, s, "umprov", "/keys/me")
    assert "ProxyJump umprov-gpu1-host" in conf
    assert "StrictHostKeyChecking yes" in conf and "StrictHostKeyChecking no" not in conf
    assert "HostKeyAlias umprov-gpu1" in conf and "HostName 10.0.0.5" in conf


def test_public_bind_pins_the_address_too():
    host = FakeHost()
    s = settings(bind=ANY)
    assert state.container_address(host, s) == ("10.0.0.5", False)
    assert state.key_patterns(host, s) == ["umprov-gpu1", "[10.0.0.5]:2222"]
    assert "ProxyJump" not in state.render_ssh_config(host, s, "umprov", None)


# --- messages --------------------------------------------------------------------------------


def test_port_message():
    class Err(Exception):
        explanation = ("driver failed programming external connectivity on endpoint umprov: "
                       "Bind for 127.0.0.1:2222 failed: port is already allocated")

    msg = str(start_failure(Err(), settings()))
    assert msg == "port 2222 on 127.0.0.1 is already in use on the host"


def test_broadcast_feeds_every_host_and_survives_a_dropped_one():
    import threading

    b = stream.Broadcast(["a", "b"], depth=2)
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


def test_a_hosts_json_record_keeps_its_shape():
    from umprov.deploy.outcome import HOST_FIELDS, new_outcome
    from umprov.hosts.render import records

    outcome = new_outcome("gpu1")
    outcome.state, outcome.data["push_seconds"] = "created", 1.23456
    assert records([outcome], HOST_FIELDS) == [{
        "host": "gpu1", "ok": True, "status": "created", "message": "", "container_id": None,
        "image_id": None, "ssh": None, "jupyter": None, "pushed_bytes": 0, "push_seconds": 1.23,
        "push_stream_seconds": 0.0, "skipped_bytes": 0, "seconds": 0.0,
        "managed_memory": None, "managed_memory_pool": None, "changed": [], "warnings": [],
    }]
    assert list(records([outcome], HOST_FIELDS)[0])[:4] == ["host", "ok", "status", "message"]


def test_key_paths_given_relative_are_stored_absolute(tmp_path, monkeypatch):
    """`deploy --authorized-key .lab/x/id_ed25519.pub` from the project folder: the ssh config
    it writes names the private half by its absolute path, so ssh works from any folder."""
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "id_ed25519.pub").write_text(KEY + "\n")
    (tmp_path / "keys" / "id_ed25519").write_text("private\n")
    monkeypatch.chdir(tmp_path)
    opts = options.checked(options.DeployOptions(), Path("keys/id_ed25519.pub"))
    assert opts.identity_file == str(tmp_path / "keys" / "id_ed25519")
    from umprov.hosts.ssh import known_hosts_files

    host = FakeHost(known_hosts="lab/known_hosts")
    assert known_hosts_files(host)[0] == tmp_path / "lab" / "known_hosts"


def test_managed_memory_is_in_the_spec_only_when_asked():
    """--managed-memory (or umprov_managed_memory) sets UMPROV_MANAGED_MEMORY=1, so switching it
    replaces the container; off, the spec (and its hash) is what it always was."""
    host = FakeHost(vars={"umprov_managed_memory": True})
    on = options.settings_for(host, options.DeployOptions())
    off = options.settings_for(host, options.DeployOptions(managed_memory=False))
    assert on.managed_memory and not off.managed_memory
    spec_on = specs.container_spec(on, "sha256:x", KEY)
    spec_off = specs.container_spec(off, "sha256:x", KEY)
    assert spec_on["environment"]["UMPROV_MANAGED_MEMORY"] == "1"
    assert "UMPROV_MANAGED_MEMORY" not in spec_off["environment"]
    assert specs.spec_hash(spec_on) != specs.spec_hash(spec_off)
    default = options.settings_for(FakeHost(), options.DeployOptions())
    assert not default.managed_memory
