"""`umprov status`: each host probed over SSH and through its engine (fakes: no network)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from docker.models.containers import ExecResult

import umprov.hosts.engine
import umprov.hosts.ssh
from tests.unit.fakes import FakeHost
from umprov import status
from umprov.errors import ExitCode, Unreachable
from umprov.hosts.render import records


class FakeContainer:
    labels = {"org.umprov.image": "umprov/pytorch-cuda:0.1.0"}
    attrs = {
        "State": {"Status": "running", "Running": True, "Health": {"Status": "healthy"}},
        "Config": {"Image": "sha256:abc"},
        "NetworkSettings": {"Ports": {"22/tcp": [{"HostIp": "127.0.0.1", "HostPort": "2222"}]}},
    }

    def exec_run(self, cmd: list[str], **_kw: Any) -> ExecResult:
        return ExecResult(0, b"2\n" if cmd[0] == "sh" else b"")


class FakeEngine:
    def __init__(self) -> None:
        self.containers = SimpleNamespace(get=lambda name: FakeContainer())
        self.closed = False

    def info(self) -> dict[str, Any]:
        return {"Runtimes": {"runc": {}, "nvidia": {}}, "ServerVersion": "26.1.5"}

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def fleet(monkeypatch: pytest.MonkeyPatch) -> None:
    """gpu1 answers everything; down refuses SSH."""

    def connect(host: Any, trust_new: bool = False) -> Any:
        if host.name == "down":
            raise Unreachable(f"{host.name}: cannot reach {host.address} over SSH (refused)")
        return SimpleNamespace(close=lambda: None)

    def run_command(_ssh: Any, _command: str, timeout: float) -> tuple[int, str, str]:
        return 0, "driver=580.95.05\ngpus=2\n", ""

    monkeypatch.setattr(umprov.hosts.ssh, "connect", connect)
    monkeypatch.setattr(umprov.hosts.ssh, "run_command", run_command)
    monkeypatch.setattr(umprov.hosts.engine, "docker_client",
                        lambda host, trust_new, ssh=None: FakeEngine())


def test_status_probes_each_host_and_keeps_the_json_shape(fleet: None) -> None:
    outcomes = status.probe([FakeHost(), FakeHost(name="down")], None)
    up, down = records(outcomes, status.HOST_FIELDS)
    assert list(up) == ["host", "reachable", "container", "driver", "host_gpus", "docker",
                        "nvidia_runtime", "state", "health", "image", "ports", "container_gpus",
                        "jupyter", "managed_memory", "managed_memory_pool"]
    assert up["managed_memory"] is False and up["managed_memory_pool"] is None
    assert up["driver"] == "580.95.05" and up["container_gpus"] == 2 and up["jupyter"] is True
    assert up["ports"] == {"22/tcp": ["127.0.0.1:2222"]} and up["nvidia_runtime"] is True
    assert down == {"host": "down", "reachable": False, "container": "umprov",
                    "error": "down: cannot reach 10.0.0.5 over SSH (refused)"}


def test_a_driver_that_does_not_answer_is_named(fleet: None, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(umprov.hosts.ssh, "run_command", lambda *_a, **_k: (
        0, "driver=NVIDIA-SMI has failed because it couldn't communicate\ngpus=0\n", ""))
    (outcome,) = status.probe([FakeHost()], "mine")
    assert outcome.ok and outcome.data["driver"] is None
    assert outcome.data["driver_error"].startswith("NVIDIA-SMI has failed")
    assert outcome.data["container"] == "mine"


def test_status_command_exits_11_when_a_host_is_unreachable(
    umprov_cli: Any, fleet: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import umprov.inventory

    hosts = [FakeHost(), FakeHost(name="down")]
    monkeypatch.setattr(umprov.inventory, "load_inventory",
                        lambda source: SimpleNamespace(select=lambda limit: hosts))
    result = umprov_cli("status", "hosts.yml", "--json")
    assert result.exit_code == ExitCode.HOSTS_UNREACHABLE
    assert [h["reachable"] for h in json.loads(result.stdout)["hosts"]] == [True, False]
    assert "umprov: 1 of 2 host(s) unreachable" in result.stderr
    assert "580.95.05" in result.stderr  # the table
