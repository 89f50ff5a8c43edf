"""`umprov lab down` forgets what umprov kept of the lab's hosts: their containers' pinned keys
and their verify history, which every later `umprov report` showed (issue 37, item 5 f);
other hosts' keys and history stay."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIC4xqZ1vUQ0n0Fvh5yq0i7XGkQm0sKQdLqJ6dW7b7c1T"


class _Client:
    """A Docker engine holding one host of lab 't'."""

    def __init__(self) -> None:
        host = SimpleNamespace(name="umprov-lab-t-1", remove=lambda **_kw: None,
                               labels={"umprov.lab": "t", "umprov.lab.index": "1"})
        self.containers = SimpleNamespace(list=lambda **_kw: [host])
        self.networks = SimpleNamespace(list=lambda **_kw: [])
        self.volumes = SimpleNamespace(get=self._no_volume, list=lambda **_kw: [])
        self.images = SimpleNamespace(list=lambda **_kw: [])

    @staticmethod
    def _no_volume(name: str) -> Any:
        from docker.errors import NotFound

        raise NotFound(name)


def test_lab_down_forgets_its_hosts_pinned_keys_and_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UMPROV_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("UMPROV_PROJECT_DIR", str(tmp_path / "project"))
    from umprov.hosts import ssh
    from umprov.verify import history
    from umprov_lab import lab

    ssh.pin_host_key(["umprov-lab-t-1"], KEY)
    ssh.pin_host_key(["umprov-gpu1"], KEY)
    history.save([{"host": "lab-t-1"}, {"host": "gpu1"}])
    assert {e.host for e in history.load()} == {"lab-t-1", "gpu1"}
    monkeypatch.setattr(lab, "docker_engine", lambda *_a, **_k: _Client())

    removed = lab.down("t")
    assert "umprov-lab-t-1" in removed
    assert ssh.pinned_keys("umprov-lab-t-1") == []
    assert ssh.pinned_keys("umprov-gpu1") == [KEY]
    assert {e.host for e in history.load()} == {"gpu1"}
    assert lab.down("t") == ["umprov-lab-t-1"]  # the container as the fake lists it, nothing more


def test_lab_down_removes_the_storage_of_hosts_whose_containers_are_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host container removed by hand (or a run killed between volume and container) left
    its engine's storage, which the next `lab up` of that name mounted as it was (seen: an
    image the test expected absent); another lab's storage stays."""
    monkeypatch.setenv("UMPROV_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("UMPROV_PROJECT_DIR", str(tmp_path / "project"))
    from umprov_lab import lab

    names = ["umprov-lab-t-2-docker", "umprov-lab-t-repo-data", "umprov-lab-t-x-1-docker",
             "umprov-lab-tt-1-docker", "umprov-lab-t-2-docker-old", "umprov-lab-t-2-other"]
    gone: list[str] = []
    client = _Client()
    client.containers = SimpleNamespace(list=lambda **_kw: [])
    client.volumes = SimpleNamespace(
        list=lambda **_kw: [SimpleNamespace(name=n) for n in names],
        get=lambda n: SimpleNamespace(remove=lambda **_kw: gone.append(n)))
    monkeypatch.setattr(lab, "docker_engine", lambda *_a, **_k: client)

    removed = lab.down("t")
    assert gone == ["umprov-lab-t-2-docker", "umprov-lab-t-repo-data"]
    assert removed == ["volume umprov-lab-t-2-docker", "volume umprov-lab-t-repo-data"]


def test_lab_down_removes_its_containers_storage_and_says_only_the_containers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UMPROV_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("UMPROV_PROJECT_DIR", str(tmp_path / "project"))
    from umprov_lab import lab

    gone: list[str] = []
    client = _Client()
    client.volumes = SimpleNamespace(
        list=lambda **_kw: [SimpleNamespace(name="umprov-lab-t-1-docker")],
        get=lambda n: SimpleNamespace(remove=lambda **_kw: gone.append(n)))
    monkeypatch.setattr(lab, "docker_engine", lambda *_a, **_k: client)
    assert lab.down("t") == ["umprov-lab-t-1"]
    assert gone == ["umprov-lab-t-1-docker"]
