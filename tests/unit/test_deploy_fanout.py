"""Deploy over an inventory larger than --forks: at most --forks connections open at any time
(threads and files stay flat as the fleet grows), every connection closed, and a push that
reaches every host lacking the image, --forks hosts to a stream; a host that holds the image
under another name gets the deployed name too."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from tests.unit.fakes import FakeHost
from umprov.deploy import options, run

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIC4xqZ1vUQ0n0Fvh5yq0i7XGkQm0sKQdLqJ6dW7b7c1T me@laptop"
IMAGE_ID = "sha256:" + "a" * 64


class Engines:
    """Fake engines over SSH: which hosts hold the image, how many clients are open."""

    def __init__(self, holding: set[str], tags: list[str] | None = None,
                 overlap: bool = False) -> None:
        self.holding = holding
        self.overlap = overlap
        self.tags = tags or []
        self.tagged: list[tuple[str, str, str]] = []
        self.lock = threading.Condition()
        self.open = 0
        self.most_open = 0
        self.connects: dict[str, int] = {}

    def client(self, host: Any, **_: Any) -> Any:
        engines = self

        class Images:
            def get(self, ref: str) -> Any:
                from docker.errors import ImageNotFound

                if host.name not in engines.holding:
                    raise ImageNotFound(ref)
                return Image(ref)

        class Image:
            def __init__(self, ref: str) -> None:
                self.id, self.tags = ref, list(engines.tags)

            def tag(self, repo: str, tag: str) -> None:
                engines.tagged.append((host.name, repo, tag))

        class Client:
            images = Images()
            closed = False

            def close(self) -> None:
                with engines.lock:
                    if not self.closed:
                        self.closed = True
                        engines.open -= 1

        with self.lock:
            self.open += 1
            self.most_open = max(self.most_open, self.open)
            self.connects[host.name] = self.connects.get(host.name, 0) + 1
            self.lock.notify_all()
            # Hold on until a second connection is open (or 1 s): workers that run side by
            # side always overlap here, however busy the machine; serial ones never do.
            if self.overlap:
                self.lock.wait_for(lambda: self.open > 1, timeout=1.0)
        return Client()


@pytest.fixture
def engines(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    from umprov.hosts import engine

    monkeypatch.setenv("UMPROV_STATE_DIR", str(tmp_path / "state"))

    def make(holding: set[str], tags: list[str] | None = None, overlap: bool = False) -> Engines:
        fake = Engines(holding, tags, overlap)
        monkeypatch.setattr(engine, "docker_client", fake.client)

        def rollout(client: Any, host: Any, settings: Any, opts: Any, image_id: str,
                    outcome: Any, *_: Any, **__: Any) -> None:
            assert not client.closed and image_id == IMAGE_ID
            outcome.state = "unchanged"

        monkeypatch.setattr(run, "rollout", rollout)
        return fake

    return make


def hosts(count: int) -> list[FakeHost]:
    return [FakeHost(name=f"gpu{i:03d}") for i in range(count)]


def test_a_fleet_larger_than_forks_never_holds_more_than_forks_connections(engines) -> None:
    fleet = hosts(60)
    fake = engines({h.name for h in fleet}, overlap=True)
    opts = options.DeployOptions(image=IMAGE_ID, authorized_keys=KEY)
    done = run.deploy(fleet, opts, forks=4)
    assert [o.state for o in done] == ["unchanged"] * 60
    assert fake.most_open <= 4, f"{fake.most_open} connections open at once, --forks 4"
    assert fake.most_open >= 2, "the hosts were deployed one at a time"
    assert fake.open == 0, "a connection was left open"
    assert set(fake.connects.values()) == {1}


def test_a_push_reaches_every_host_that_lacks_the_image_forks_at_a_time(
    engines, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = hosts(11)
    holding = {h.name for h in fleet[:3]}
    fake = engines(set(holding))
    batches: list[list[str]] = []

    def push_image(states: list[Any], local_client: Any, pool: Any, progress: Any) -> None:
        assert all(st.client is not None and not st.client.closed for st in states)
        batches.append([st.name for st in states])
        for st in states:
            st.image_id = IMAGE_ID
            fake.holding.add(st.name)

    monkeypatch.setattr(run, "push_image", push_image)
    monkeypatch.setattr(run, "_local_image_id", lambda *_: IMAGE_ID)
    opts = options.DeployOptions(image=IMAGE_ID, authorized_keys=KEY, delivery="push")
    done = run.deploy(fleet, opts, local_client=object(), forks=3)
    assert [o.state for o in done] == ["unchanged"] * 11
    assert [len(b) for b in batches] == [3, 3, 2]
    assert sorted(n for b in batches for n in b) == sorted(h.name for h in fleet[3:])
    assert fake.most_open <= 3 and fake.open == 0
    # a host that lacked the image is connected again for its push; the others once
    assert {n for n, c in fake.connects.items() if c == 2} == {h.name for h in fleet[3:]}


@pytest.mark.parametrize(("held", "image", "tagged"), [
    (["other/name:1"], "umprov/pytorch-cuda:0.1.0", [("umprov/pytorch-cuda", "0.1.0")]),
    (["other/name:1"], "registry.example.com:5000/team/pt", [("registry.example.com:5000/team/pt",
                                                               "latest")]),
    (["umprov/pytorch-cuda:0.1.0"], "umprov/pytorch-cuda:0.1.0", []),
])
def test_a_host_holding_the_pushed_image_under_another_name_gets_its_name(
    engines, monkeypatch: pytest.MonkeyPatch, held: list[str], image: str,
    tagged: list[tuple[str, str]]
) -> None:
    fake = engines({"gpu000"}, tags=held)
    monkeypatch.setattr(run, "_local_image_id", lambda *_: IMAGE_ID)
    opts = options.DeployOptions(image=image, authorized_keys=KEY, delivery="push")
    (done,) = run.deploy(hosts(1), opts, local_client=object())
    assert done.state == "unchanged", done.detail
    assert fake.tagged == [("gpu000", *t) for t in tagged]
