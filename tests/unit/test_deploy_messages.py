"""What deploy tells people (issue 37, item 5): one word for one cause (an unreachable host is
'unreachable', as exit 11 means), "connecting" once a host, tunnel ports in inventory order
whichever host finishes first."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from tests.unit.fakes import FakeHost
from umprov.deploy import options, run, state
from umprov.errors import ExitCode
from umprov.hosts.results import HostOutcome

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIC4xqZ1vUQ0n0Fvh5yq0i7XGkQm0sKQdLqJ6dW7b7c1T me@laptop"
IMAGE_ID = "sha256:" + "a" * 64
OPTS = options.DeployOptions(image="img:1", authorized_keys=KEY)


@pytest.fixture(autouse=True)
def _state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UMPROV_STATE_DIR", str(tmp_path / "state"))


def test_an_unreachable_host_is_called_unreachable(umprov_cli, tmp_path, monkeypatch):
    pub = tmp_path / "id_ed25519.pub"
    pub.write_text(KEY + "\n")
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    gpu1: {ansible_host: 10.0.0.1}\n"
                         "    gpu2: {ansible_host: 10.0.0.2}\n")
    outcomes = [HostOutcome("gpu1", "unchanged", data=_data()),
                HostOutcome("gpu2", "unreachable", "connection refused", data=_data())]
    monkeypatch.setattr("umprov.deploy.run.deploy", lambda *_a, **_k: outcomes)
    result = umprov_cli("deploy", str(inventory), "--authorized-key", str(pub))
    assert result.exit_code == ExitCode.HOSTS_UNREACHABLE
    assert "umprov: 1 of 2 host(s) unreachable\n" in result.stderr
    assert "failed" not in result.stderr


def test_each_cause_is_counted_in_its_own_word(capsys):
    from umprov.output import say_problems

    say_problems([HostOutcome("a", "failed"), HostOutcome("b", "unreachable"),
                  HostOutcome("c", "unreachable"), HostOutcome("d", "created")])
    assert capsys.readouterr().err == ("umprov: 1 of 4 host(s) failed, "
                                       "2 of 4 host(s) unreachable\n")


def _data() -> dict[str, Any]:
    from umprov.deploy.outcome import new_outcome

    return new_outcome("x").data


class _Images:
    def __init__(self, held: set[str], name: str) -> None:
        self.held, self.name = held, name

    def get(self, ref: str) -> Any:
        from docker.errors import ImageNotFound

        if self.name not in self.held:
            raise ImageNotFound(ref)
        return type("Image", (), {"id": ref, "tags": ["img:1"]})()


def _fake_engines(monkeypatch: pytest.MonkeyPatch, held: set[str]) -> None:
    class Client:
        def __init__(self, host: Any, **_: Any) -> None:
            self.images = _Images(held, host.name)

        def close(self) -> None:
            pass

    monkeypatch.setattr("umprov.hosts.engine.docker_client", Client)


def test_a_pushed_host_says_connecting_once(monkeypatch):
    """A host that lacks the image is connected twice (again for the push): one line says so."""
    held: set[str] = set()
    _fake_engines(monkeypatch, held)

    def push_image(states: list[Any], *_: Any) -> None:
        for st in states:
            st.image_id = IMAGE_ID
            held.add(st.name)

    monkeypatch.setattr(run, "push_image", push_image)
    monkeypatch.setattr(run, "_local_image_id", lambda *_: IMAGE_ID)
    monkeypatch.setattr(run, "rollout", lambda *_a, **_k: None)
    said: list[tuple[str, str]] = []
    hosts = [FakeHost(name="lab-1"), FakeHost(name="lab-2")]
    run.deploy(hosts, options.DeployOptions(image="img:1", authorized_keys=KEY,
                                            delivery="push"),
               progress=lambda host, msg: said.append((host, msg)), local_client=object())
    assert sorted(h for h, msg in said if msg == "connecting") == ["lab-1", "lab-2"]


def test_tunnel_ports_follow_the_inventory_not_the_finishing_order(monkeypatch):
    """lab-2 finishes first; lab-1 still gets the first port."""
    _fake_engines(monkeypatch, {"lab-1", "lab-2"})
    second_done = threading.Event()
    ports: dict[str, int] = {}

    def rollout(_client: Any, host: Any, *_: Any, **__: Any) -> None:
        if host.name == "lab-1":
            second_done.wait(5)
        ports[host.name] = state.tunnel_port(host.name)
        if host.name == "lab-2":
            second_done.set()

    monkeypatch.setattr(run, "rollout", rollout)
    run.deploy([FakeHost(name="lab-1"), FakeHost(name="lab-2")], OPTS, forks=2)
    assert ports == {"lab-1": state.TUNNEL_BASE, "lab-2": state.TUNNEL_BASE + 1}
    # a host keeps its port; a new one gets the next free one
    assert state.reserve_tunnel_ports(["lab-3", "lab-1"]) == {
        "lab-3": state.TUNNEL_BASE + 2, "lab-1": state.TUNNEL_BASE}
