"""The key deploy lets into each host's container: --authorized-key, else the host's
umprov_authorized_key (a lab's inventory names the lab's key), else the user's own in ~/.ssh;
a missing one stops the run before any host is contacted (issue 37, item 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.unit.fakes import FakeHost
from umprov.deploy import options, run
from umprov.errors import ConfigError

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIC4xqZ1vUQ0n0Fvh5yq0i7XGkQm0sKQdLqJ6dW7b7c1T lab"
MINE = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIC4xqZ1vUQ0n0Fvh5yq0i7XGkQm0sKQdLqJ6dW7b7c1T me"


@pytest.fixture
def no_home_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home without ~/.ssh, as on a machine where umprov was just installed with pipx."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("UMPROV_STATE_DIR", str(tmp_path / "state"))
    return home


def lab_key(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "id_ed25519").write_text("private\n")
    (folder / "id_ed25519.pub").write_text(KEY + "\n")
    return folder / "id_ed25519.pub"


def test_a_hosts_umprov_authorized_key_logs_in_with_its_private_half(tmp_path, no_home_key):
    pub = lab_key(tmp_path / "state" / ".lab" / "t")
    opts = options.for_host(FakeHost(vars={"umprov_authorized_key": str(pub)}),
                            options.checked(options.DeployOptions(), None))
    assert opts.authorized_keys == KEY
    assert opts.identity_file == str(pub.with_suffix(""))


def test_authorized_key_on_the_command_line_wins_over_the_hosts(tmp_path, no_home_key):
    pub = lab_key(tmp_path / "lab")
    mine = tmp_path / "mine.pub"
    mine.write_text(MINE + "\n")
    opts = options.checked(options.DeployOptions(), mine)
    assert options.for_host(FakeHost(vars={"umprov_authorized_key": str(pub)}),
                            opts).authorized_keys == MINE


def test_a_missing_key_names_the_host_and_the_variable(tmp_path, no_home_key):
    with pytest.raises(ConfigError, match=r"gpu1: umprov_authorized_key .*nowhere\.pub: No such"):
        options.for_host(FakeHost(vars={"umprov_authorized_key": str(tmp_path / "nowhere.pub")}),
                         options.DeployOptions())
    with pytest.raises(ConfigError, match="no public key found in ~/.ssh .*umprov_authorized_key"):
        options.for_host(FakeHost(), options.DeployOptions())


def test_deploy_gives_each_host_its_own_key(tmp_path, no_home_key, monkeypatch):
    """Two hosts, one naming the lab's key, one the user's (in ~/.ssh): each container gets its
    own, and the ssh config of each names its private half."""
    pub = lab_key(tmp_path / "lab")
    lab_key(no_home_key / ".ssh")
    (no_home_key / ".ssh" / "id_ed25519.pub").write_text(MINE + "\n")
    seen: dict[str, tuple[str, str | None]] = {}

    def rollout(_client: Any, host: Any, _settings: Any, opts: Any, *_: Any, **__: Any) -> None:
        seen[host.name] = (opts.authorized_keys, opts.identity_file)

    monkeypatch.setattr(run, "rollout", rollout)
    monkeypatch.setattr("umprov.hosts.engine.docker_client", lambda *_a, **_k: _Engine())
    hosts = [FakeHost(name="lab-1", vars={"umprov_authorized_key": str(pub)}),
             FakeHost(name="gpu1")]
    run.deploy(hosts, options.DeployOptions(image="img:1"))
    assert seen == {"lab-1": (KEY, str(tmp_path / "lab" / "id_ed25519")),
                    "gpu1": (MINE, str(no_home_key / ".ssh" / "id_ed25519"))}


class _Engine:
    class images:  # noqa: N801 - the docker SDK's attribute
        @staticmethod
        def get(ref: str) -> Any:
            return type("Image", (), {"id": "sha256:" + "a" * 64, "tags": [ref]})()

    def close(self) -> None:
        pass


def test_deploy_to_an_inventory_with_its_key_needs_none_in_home(umprov_cli, tmp_path,
                                                                no_home_key, monkeypatch):
    """`umprov deploy lab/NAME` from a pipx install: no ~/.ssh key, no --authorized-key; the
    inventory's key is read before any host is contacted, a missing one stops it (exit 4)."""
    pub = lab_key(tmp_path / "lab")
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    gpu1: {ansible_host: 10.0.0.1}\n"
                         f"  vars: {{umprov_authorized_key: {pub}}}\n")
    checked: list[str] = []
    monkeypatch.setattr("umprov.deploy.run.deploy",
                        lambda hosts, opts, **_: checked.extend(h.name for h in hosts) or [])
    result = umprov_cli("deploy", str(inventory))
    assert result.exit_code == 0, result.stderr
    assert checked == ["gpu1"]
    inventory.write_text("all:\n  hosts:\n    gpu1: {ansible_host: 10.0.0.1}\n")
    result = umprov_cli("deploy", str(inventory))
    assert result.exit_code == 4
    assert "no public key found in ~/.ssh" in result.stderr and result.stderr.count("\n") == 1
