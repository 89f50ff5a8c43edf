"""What a deploy leaves open, and only when asked: the Jupyter token never in an environment,
a warning when the ports face the network, no agent forwarding into the container by default."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import REPO
from tests.unit.fakes import FakeHost
from tests.unit.test_interrupt_aftermath import FakeEngine
from umprov.deploy import options, outcome, rollout
from umprov.deploy import spec as specs

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIC4xqZ1vUQ0n0Fvh5yq0i7XGkQm0sKQdLqJ6dW7b7c1T me@laptop"
IMAGE = REPO / "docker" / "pytorch-cuda"
INVENTORY = """\
all:
  hosts:
    gpu1: {ansible_host: 10.0.0.5}
    gpu2: {ansible_host: 10.0.0.6, umprov_bind: 10.0.0.6}
    gpu3: {ansible_host: 10.0.0.7}
"""


@pytest.fixture(autouse=True)
def _state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UMPROV_STATE_DIR", str(tmp_path / "state"))


# --- the Jupyter token -----------------------------------------------------------------------


class Recording(FakeEngine):
    """The fake engine, keeping what the container was created with and what was put in it."""

    def __init__(self) -> None:
        super().__init__()
        self.created: list[dict[str, Any]] = []
        self.archives: list[bytes] = []
        create = self.containers.create

        def record(**kwargs: Any) -> Any:
            self.created.append(kwargs)
            container = create(**kwargs)
            put = container.put_archive
            container.put_archive = lambda path, data: (self.archives.append(data), put(path, data))
            return container

        self.containers.create = record


def test_the_token_reaches_the_container_as_a_root_only_file_never_in_its_config() -> None:
    engine = Recording()
    opts = options.DeployOptions(image="img:1", gpus="none", authorized_keys=KEY)
    host = FakeHost()
    result = outcome.new_outcome(host.name)
    rollout.rollout(engine, host, options.settings_for(host, opts), opts, "sha256:img", result)
    from umprov.deploy.state import stored_token

    token = stored_token(host.name)
    assert token and len(token) >= 32
    (kwargs,) = engine.created
    assert token not in json.dumps(kwargs, default=str)  # environment, labels, command: no token
    assert "JUPYTER_TOKEN" not in kwargs["environment"]
    assert kwargs["environment"]["JUPYTER_TOKEN_FILE"] == specs.TOKEN_PATH
    (archive,) = engine.archives
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        (member,) = tar.getmembers()
        assert (member.mode, member.uid) == (0o400, 0)
        assert tar.extractfile(member).read().decode() == token


def test_jupyter_reads_its_token_from_the_file_and_drops_one_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token_file = tmp_path / "jupyter_token"
    token_file.write_text("t" * 43 + "\n")
    monkeypatch.setenv("JUPYTER_TOKEN_FILE", str(token_file))
    monkeypatch.setenv("JUPYTER_TOKEN", "set-by-hand-" + "x" * 20)
    config = _load_jupyter_config()
    assert config.IdentityProvider.token == "t" * 43
    import os

    assert "JUPYTER_TOKEN" not in os.environ
    token_file.write_text("short\n")
    with pytest.raises(SystemExit, match="no token"):
        _load_jupyter_config()


def _load_jupyter_config() -> Any:
    """The image's jupyter_server_config.py, run as Jupyter runs it (get_config provided)."""

    class Config(SimpleNamespace):
        def __getattr__(self, name: str) -> Any:
            setattr(self, name, SimpleNamespace())
            return getattr(self, name)

    config = Config()
    source = (IMAGE / "jupyter_server_config.py").read_text()
    exec(compile(source, "jupyter_server_config.py", "exec"), {"get_config": lambda: config})  # noqa: S102
    return config


def test_the_entrypoint_gives_jupyter_a_file_never_the_token_itself() -> None:
    entrypoint = (IMAGE / "entrypoint.sh").read_text()
    start = entrypoint[entrypoint.index("# --- Jupyter as the user"):]
    start = start[: start.index("jupyter_pid=$!")]
    assert 'JUPYTER_TOKEN_FILE="$token_file"' in start
    assert "JUPYTER_TOKEN=" not in start and "$token" not in start.replace("$token_file", "")
    assert "chmod 0600" in entrypoint and 'chown "$uid:$gid" "$token_file.tmp"' in entrypoint


# --- agent forwarding ------------------------------------------------------------------------


def test_sshd_in_the_image_forwards_no_agent_unless_deploy_asks() -> None:
    lines = (IMAGE / "sshd_config").read_text().splitlines()
    assert "AllowAgentForwarding no" in lines and "AllowAgentForwarding yes" not in lines
    assert '-o "AllowAgentForwarding=$agent_forwarding"' in (IMAGE / "entrypoint.sh").read_text()
    settings = options.HostSettings("img:1", "all", 2222, 8888, "127.0.0.1", "umprov")
    default = specs.container_spec(settings, "sha256:a", KEY)
    asked = specs.container_spec(settings, "sha256:a", KEY, agent_forwarding=True)
    assert "SSH_ALLOW_AGENT_FORWARDING" not in default["environment"]
    assert asked["environment"]["SSH_ALLOW_AGENT_FORWARDING"] == "yes"
    assert specs.spec_hash(default) != specs.spec_hash(asked)


# --- the command line: the bind warning and the agent option ---------------------------------


@pytest.fixture
def deploy_cli(umprov_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """`umprov deploy INVENTORY --authorized-key KEY ARGS...` up to the hosts, which it never
    reaches; what the run was asked is in .asked."""
    from umprov.deploy import run

    inventory = tmp_path / "hosts.yml"
    inventory.write_text(INVENTORY)
    key = tmp_path / "id_ed25519.pub"
    key.write_text(KEY + "\n")
    asked: list[Any] = []

    def deploy(hosts: list[Any], opts: Any, **_: Any) -> list[Any]:
        asked.append(opts)
        done = [outcome.new_outcome(h.name) for h in hosts]
        for o in done:
            o.state = "unchanged"
        return done

    monkeypatch.setattr(run, "deploy", deploy)

    def invoke(*args: str) -> Any:
        return umprov_cli("deploy", str(inventory), "--authorized-key", str(key), "--image",
                          "img:1", *args)

    invoke.asked = asked  # type: ignore[attr-defined]
    return invoke


def test_any_bind_but_loopback_warns_that_ssh_and_jupyter_face_the_network(deploy_cli) -> None:
    result = deploy_cli("--bind", "0.0.0.0")  # noqa: S104 (nothing binds in this test)
    assert result.exit_code == 0, result.stderr
    warnings = [ln for ln in result.stderr.splitlines() if "warning" in ln]
    assert len(warnings) == 1, warnings
    assert "gpu1, gpu2, gpu3" in warnings[0] and "published on 0.0.0.0" in warnings[0]
    assert "reachable from the network" in warnings[0] and "Jupyter" in warnings[0]


def test_a_hosts_own_public_bind_warns_for_that_host_alone(deploy_cli) -> None:
    result = deploy_cli()
    warnings = [ln for ln in result.stderr.splitlines() if "warning" in ln]
    assert warnings == [ln for ln in warnings if "gpu2" in ln and "10.0.0.6" in ln]
    assert len(warnings) == 1 and "gpu1" not in warnings[0]


@pytest.mark.parametrize("bind", ["127.0.0.1", "::1"])
def test_loopback_binds_warn_nothing(deploy_cli, bind: str) -> None:
    result = deploy_cli("--bind", bind)
    assert result.exit_code == 0, result.stderr
    assert "warning" not in result.stderr


def test_agent_forwarding_is_off_unless_asked(deploy_cli) -> None:
    assert deploy_cli().exit_code == 0
    assert deploy_cli("--allow-agent-forwarding").exit_code == 0
    assert [o.agent_forwarding for o in deploy_cli.asked] == [False, True]
