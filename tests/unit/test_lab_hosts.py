"""Lab hosts' SSH host keys as the lab reads them for known_hosts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from umprov.errors import UmprovError
from umprov_lab import hosts

KEY = b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBx root@lab-x-1\n"


class Container:
    """Answers exec_run with the outputs given, one per call."""

    name = "umprov-lab-x-1"

    def __init__(self, *outputs: bytes) -> None:
        self.outputs = list(outputs)
        self.calls = 0

    def exec_run(self, cmd, **_kw):
        self.calls += 1
        return SimpleNamespace(exit_code=0, output=self.outputs.pop(0))


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch):
    monkeypatch.setattr(hosts.time, "sleep", lambda _s: None)


def test_an_empty_read_is_asked_again() -> None:
    container = Container(b"", KEY)
    assert hosts.host_keys(container) == ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBx"]
    assert container.calls == 2


def test_a_host_without_a_readable_key_is_refused_not_left_out() -> None:
    with pytest.raises(UmprovError, match="umprov-lab-x-1: no SSH host key could be read"):
        hosts.host_keys(Container(b"", b"\n", b""))


def test_a_container_removed_while_labs_are_listed_is_left_out():
    """`lab status` beside another lab's `lab down` on the same engine: the engine lists a
    container, then it is gone before it is inspected. It is left out, not an error."""
    from docker.errors import NotFound
    from docker.models.containers import ContainerCollection

    from umprov_lab.hosts import lab_containers

    class Api:
        def containers(self, **_kw):
            return [{"Id": "kept"}, {"Id": "gone"}]

        def inspect_container(self, ident):
            if ident == "gone":
                raise NotFound("No such container: gone")
            return {"Id": ident, "Name": "/umprov-lab-a-1", "Config": {"Labels": {}}}

    class Client:
        api = Api()

        @property
        def containers(self):
            return ContainerCollection(client=self)

    assert [c.name for c in lab_containers(Client())] == ["umprov-lab-a-1"]


class Networks:
    """docker's networks API as it answers after two `lab up` of one name raced: twins."""

    def __init__(self, *containers: int) -> None:
        self.items = [SimpleNamespace(name="umprov-lab-x", attrs={"Containers": dict.fromkeys(
            range(n))}, removed=False) for n in containers]
        for net in self.items:
            net.remove = lambda net=net: self._remove(net)
        self.created = 0

    def _remove(self, net) -> None:
        from docker.errors import APIError

        if net.attrs["Containers"]:
            raise APIError("network has active endpoints")
        self.items.remove(net)

    def list(self, names, greedy):
        assert greedy  # without it the API leaves Containers empty
        return [n for n in self.items if n.name in names] + [SimpleNamespace(name="other")]

    def create(self, name, **_kw) -> None:
        self.created += 1
        self.items.append(SimpleNamespace(name=name, attrs={"Containers": {}}))


def test_twin_networks_of_a_lab_are_made_one_keeping_the_one_in_use() -> None:
    networks = Networks(0, 3, 0)
    client = SimpleNamespace(networks=networks)
    assert hosts.ensure_network(client, "x") is False
    assert [len(n.attrs["Containers"]) for n in networks.items] == [3]
    assert networks.created == 0


def test_twin_networks_both_in_use_stop_with_the_way_out() -> None:
    client = SimpleNamespace(networks=Networks(2, 1))
    with pytest.raises(UmprovError, match="umprov lab down --name x"):
        hosts.ensure_network(client, "x")


def test_a_missing_network_is_created_once() -> None:
    networks = Networks()
    assert hosts.ensure_network(SimpleNamespace(networks=networks), "x") is True
    assert networks.created == 1
