"""The README's exit-code table holds (issue 19): every code it lists is an ExitCode, each one is
reached the way the table says, and every command maps each kind of error to the same code."""

from __future__ import annotations

import re
import socket
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import umprov.inventory
import umprov.provision
from tests.conftest import REPO
from tests.unit.test_trust_store import paramiko_server  # noqa: F401 - a fixture
from umprov.errors import (
    ConfigError,
    EnvironmentProblem,
    ExitCode,
    InventoryError,
    SchedulerFailed,
    Terminated,
    TrustError,
    UmprovError,
)
from umprov.verify import report

PUBKEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIC4xqZ1vUQ0n0Fvh5yq0i7XGkQm0sKQdLqJ6dW7b7c1T me\n"


def readme_table() -> dict[int, str]:
    text = (REPO / "README.md").read_text()
    section = text.split("### Exit codes", 1)[1].split("\n## ", 1)[0]
    return {int(m.group(1)): m.group(2).strip()
            for m in re.finditer(r"^\| (\d+) \| (.+?) \|$", section, re.MULTILINE)}


def test_the_table_lists_every_exit_code_and_nothing_else():
    assert set(readme_table()) == {int(code) for code in ExitCode}


@pytest.fixture
def inventory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  hosts:\n    gpu1: {ansible_host: 127.0.0.1, ansible_port: 2222}\n")
    return path


@pytest.fixture
def pubkey(tmp_path: Path) -> Path:
    path = tmp_path / "id.pub"
    path.write_text(PUBKEY)
    return path


def fake_playbook(monkeypatch: pytest.MonkeyPatch, events: list[dict[str, Any]],
                  stats: dict[str, Any]) -> None:
    """ansible-runner replaced: these events, then these play stats."""

    def start(private: Path, *_args: Any) -> Any:
        queue = _args[-1]
        for event in events:
            queue.put(event)
        queue.put(None)
        artifacts = private / "artifacts" / "x"
        artifacts.mkdir(parents=True)
        thread = threading.Thread(target=lambda: None)
        thread.start()
        return thread, SimpleNamespace(config=SimpleNamespace(artifact_dir=str(artifacts)),
                                       stats=stats, status="failed", rc=2,
                                       stdout=SimpleNamespace(read=lambda: "ERROR! it broke"))

    monkeypatch.setattr(umprov.provision.runner, "start", start)


def fake_verify(monkeypatch: pytest.MonkeyPatch, verdict: str) -> None:
    import umprov.verify.remote as remote

    def run(hosts: Any, opts: Any, progress: Any, forks: int | None = None) -> list[dict]:
        doc = report.failed_host_report(hosts[0].name, "gpu.health", "slow")
        doc["records"][0].update(verdict=verdict)
        doc.update(verdict=verdict)
        return [doc]

    monkeypatch.setattr(remote, "verify_hosts", run)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# How each code in the table is reached: the command line, and what it needs set up.
def scenario(code: int, inventory: Path, pubkey: Path, monkeypatch: pytest.MonkeyPatch,
             tmp_path: Path) -> list[str]:
    if code == ExitCode.OK:
        return ["inventory", "check", "gpu1,gpu2,"]
    if code == ExitCode.FAILED:  # ansible-playbook stopped before any host ran
        fake_playbook(monkeypatch, [], {})
        return ["provision", str(inventory)]
    if code == ExitCode.USAGE:
        return ["deploy", "--no-such-option"]
    if code == ExitCode.INVENTORY:
        return ["status", str(tmp_path / "missing.yml")]
    if code == ExitCode.CONFIG:
        return ["deploy", str(inventory), "--authorized-key", str(pubkey), "--shm-size", "lots"]
    if code == ExitCode.ENVIRONMENT:
        monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
        return ["image", "build"]
    if code == ExitCode.TRUST:
        return ["status", str(inventory)]
    if code == ExitCode.HOSTS_FAILED:
        fake_playbook(monkeypatch, [{"event": "runner_on_failed", "event_data": {
            "host": "gpu1", "task": "Install", "res": {"msg": "E: broken"}}}],
            {"ok": {"gpu1": 1}, "failures": {"gpu1": 1}})
        return ["provision", str(inventory)]
    if code == ExitCode.HOSTS_UNREACHABLE:
        inventory.write_text(f"all:\n  hosts:\n    gpu1: {{ansible_host: 127.0.0.1, "
                             f"ansible_port: {closed_port()}}}\n")
        return ["status", str(inventory)]
    if code in (ExitCode.VERIFY_WARN, ExitCode.VERIFY_FAIL):
        fake_verify(monkeypatch, "warn" if code == ExitCode.VERIFY_WARN else "fail")
        return ["verify", str(inventory)]
    if code == ExitCode.SCHEDULER:  # srun refused the job (the Slurm launcher's run, faked)
        import umprov.verify.multinode as multinode

        def refused(*_a: Any, **_k: Any) -> list[dict]:
            raise SchedulerFailed("ctl: srun failed (exit 1): srun: error: Invalid partition")

        monkeypatch.setattr(multinode, "verify_multinode", refused)
        inventory.write_text("all:\n  hosts:\n    gpu1: {ansible_host: 10.0.0.1}\n"
                             "    gpu2: {ansible_host: 10.0.0.2}\n  children:\n"
                             "    slurm_controller:\n      hosts:\n"
                             "        ctl: {ansible_host: 10.0.0.3}\n")
        return ["verify", str(inventory), "--multi-node", "--launcher", "slurm"]
    raise AssertionError(code)


SIGNALS = {
    ExitCode.INTERNAL: RuntimeError("a bug"),
    ExitCode.HANGUP: Terminated("SIGHUP"),
    ExitCode.INTERRUPTED: KeyboardInterrupt(),
    ExitCode.TERMINATED: Terminated("SIGTERM"),
}


@pytest.mark.parametrize("code", sorted(readme_table()))
def test_each_code_is_reached_as_the_table_says(
    code, inventory, pubkey, umprov_cli, monkeypatch, tmp_path, request
):
    if code == ExitCode.TRUST:  # a server presenting a key nobody recorded
        request.getfixturevalue("paramiko_server")
    if code in SIGNALS:  # raised inside a command, as the signal handler raises it
        def interrupted(*_args: Any, **_kwargs: Any) -> Any:
            raise SIGNALS[code]

        monkeypatch.setattr(umprov.inventory, "load_inventory", interrupted)
        args = ["status", str(inventory)]
    else:
        args = scenario(code, inventory, pubkey, monkeypatch, tmp_path)
    result = umprov_cli(*args)
    assert result.exit_code == code, (readme_table()[code], result.stderr)
    assert "Traceback" not in result.output
    if code not in (ExitCode.OK, ExitCode.HOSTS_FAILED, ExitCode.VERIFY_WARN,
                    ExitCode.VERIFY_FAIL):  # those end with their table
        assert result.stderr.strip().splitlines()[-1].startswith("umprov: ")


COMMANDS = {
    "inventory check": ["inventory", "check", "hosts.yml"],
    "provision": ["provision", "hosts.yml"],
    "deploy": ["deploy", "hosts.yml", "--authorized-key", "PUBKEY"],
    "status": ["status", "hosts.yml"],
    "verify": ["verify", "hosts.yml"],
    "trust": ["trust", "gpu1", "-i", "hosts.yml"],
    "image build": ["image", "build", "--host", "gpu1", "-i", "hosts.yml"],
}
ERRORS = [InventoryError("bad inventory"), ConfigError("bad value"),
          EnvironmentProblem("no tool"), TrustError("host key for x is not known"),
          UmprovError("work failed")]


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_every_command_maps_each_error_to_its_code(command, error, umprov_cli, monkeypatch,
                                                  pubkey):
    def failing(*_args: Any, **_kwargs: Any) -> Any:
        raise error

    monkeypatch.setattr(umprov.inventory, "load_inventory", failing)
    args = [str(pubkey) if a == "PUBKEY" else a for a in COMMANDS[command]]
    result = umprov_cli(*args)
    assert result.exit_code == error.exit_code, result.stderr
    assert result.stderr == f"umprov: error: {error}\n"


def test_an_error_before_the_inventory_is_read_beats_it(umprov_cli, pubkey):
    """Bad option values come first: exit 4 although the inventory does not exist either."""
    for args in (["deploy", "nowhere.yml", "--authorized-key", str(pubkey), "--push", "--pull"],
                 ["deploy", "nowhere.yml", "--authorized-key", str(pubkey), "--name", "a b"],
                 ["status", "nowhere.yml", "--name", "-x"],
                 ["verify", "nowhere.yml", "--image", "Not An Image"],
                 ["provision", "nowhere.yml", "-e", "not a pair"]):
        result = umprov_cli(*args)
        assert result.exit_code == ExitCode.CONFIG, (args, result.stderr)
        assert "inventory not found" not in result.stderr
