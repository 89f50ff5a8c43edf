"""Stand-ins shared by the unit tests."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class FakeHost:
    """What umprov reads of an inventory host (umprov.hosts.HostLike), without an inventory."""

    name: str = "gpu1"
    address: str = "10.0.0.5"
    port: int = 22
    user: str | None = "ops"
    key_file: str | None = None
    known_hosts: str | None = None
    vars: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# The docker SDK of multi-node verification: engines that start throwaway containers


class ExecResult:
    def __init__(self, code: int, out: str) -> None:
        self.exit_code, self.output = code, out.encode()


ExecHook = Callable[["FakeContainer", str], "tuple[int, str] | None"]


class FakeContainer:
    """A throwaway container: answers the agent's probe, keeps what is copied in, and lets a
    test's hook answer any other command (text: the command joined with spaces)."""

    def __init__(self, host: str, name: str, fleet: Fleet) -> None:
        self.host, self.name, self.fleet = host, name, fleet
        self.files: dict[str, bytes] = {}

    def exec_run(self, cmd: list[str], demux: bool = False, **_kw: object) -> ExecResult:
        text = " ".join(cmd)
        answer = self.fleet.exec_hook(self, text) if self.fleet.exec_hook else None
        if answer is not None:
            return ExecResult(*answer)
        if "--net-info" in text:
            return ExecResult(0, 'PY=/usr/bin/python3\n0\n{"route": {"ip": "10.9.0.2", '
                                 '"ifname": "eth0"}, "addresses": {}}')
        return ExecResult(0, "")

    def put_archive(self, path: str, data: bytes) -> bool:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for member in tar.getmembers():
                handle = tar.extractfile(member)
                if handle is not None:
                    self.files[f"{path}/{member.name}"] = handle.read()
        return True

    def remove(self, force: bool = False) -> None:
        self.fleet.append(f"removed {self.host}:{self.name}")


class _Image:
    id = "sha256:feed"


class _Deployed:
    image = _Image()
    attrs = {"Config": {"Image": "umprov/pytorch-cuda:x"}, "HostConfig": {}}


class _Containers:
    def __init__(self, host: str, fleet: Fleet) -> None:
        self.host, self.fleet = host, fleet

    def get(self, name: str) -> _Deployed:
        return _Deployed()

    def run(self, **kw: Any) -> FakeContainer:
        assert kw["network_mode"] == "host"
        self.fleet.append(f"started {self.host}")
        box = FakeContainer(self.host, str(kw["name"]), self.fleet)
        self.fleet.containers[self.host] = box
        return box

    def list(self, **kw: object) -> list:
        return []


class _Client:
    def __init__(self, host: str, fleet: Fleet) -> None:
        self.containers = _Containers(host, fleet)

    def ping(self) -> bool:
        return True

    def close(self) -> None:
        pass


class Fleet(list):
    """What the fake engines did, in order ("started a", "removed a:NAME"), and the containers
    they started, by host."""

    def __init__(self, exec_hook: ExecHook | None = None) -> None:
        super().__init__()
        self.exec_hook = exec_hook
        self.containers: dict[str, FakeContainer] = {}


class EngineHost:
    """An inventory host as multi-node verification reads it."""

    def __init__(self, name: str, address: str = "127.0.0.1", groups: tuple[str, ...] = (),
                 **host_vars: object) -> None:
        self.name, self.address, self.port, self.groups = name, address, 22, groups
        self.user, self.key_file, self.known_hosts = "ops", None, None
        self.vars = {"umprov_container_limits": False, **host_vars}


def fake_fleet(monkeypatch: Any, tmp_path: Path, down: set[str],
               exec_hook: ExecHook | None = None) -> Fleet:
    """Every host's engine a fake one (hosts in ``down`` unreachable)."""
    import umprov.hosts.engine
    from umprov.errors import Unreachable

    monkeypatch.setenv("UMPROV_STATE_DIR", str(tmp_path / "state"))  # the agent's zipapp cache
    fleet = Fleet(exec_hook)

    def client(host: EngineHost, **_kw: object) -> _Client:
        if host.name in down:
            raise Unreachable(f"{host.name}: connection refused")
        return _Client(host.name, fleet)

    monkeypatch.setattr(umprov.hosts.engine, "docker_client", client)
    return fleet
