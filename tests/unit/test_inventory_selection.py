"""Which hosts a command runs on: --limit as ansible-playbook takes it (Ansible's own pattern
matching), never every host for an empty pattern, and never "success" on an inventory that
holds no host at all."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from umprov.errors import ConfigError, ExitCode, InventoryError, UmprovError
from umprov.inventory import load_inventory

FLEET = """
all:
  children:
    gpu_hosts:
      hosts:
        gpu01: {ansible_host: 127.0.0.1, ansible_port: 9}
        gpu02: {ansible_host: 127.0.0.2, ansible_port: 9}
        gpu03: {ansible_host: 127.0.0.3, ansible_port: 9}
    hgx:
      hosts:
        gpu02:
        gpu03:
"""
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIC4xqZ1vUQ0n0Fvh5yq0i7XGkQm0sKQdLqJ6dW7b7c1T me@laptop"


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text).lstrip())
    return path


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    return write(tmp_path / "hosts.yml", FLEET)


@pytest.fixture
def pubkey(tmp_path: Path) -> Path:
    return write(tmp_path / "id_ed25519.pub", KEY + "\n")


# --- an empty pattern is refused, never "every host" -------------------------------------------


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (("provision", "{inv}", "--limit", ""), "--limit"),
        (("deploy", "{inv}", "-l", " "), "--limit"),
        (("verify", "{inv}", "--hosts", ""), "--limit"),
        (("status", "{inv}", "--limit", "\t"), "--limit"),
        (("status", "--connect", ""), "--connect"),
        (("trust", "", "-i", "{inv}", "--yes"), "HOST"),
        (("image", "build", "--host", " "), "--host"),
    ],
)
def test_an_empty_host_or_pattern_is_a_config_error_naming_the_option(
    umprov_cli: Any, fleet: Path, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...],
    option: str,
) -> None:
    import umprov.inventory

    def no_load(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("the inventory was read: the empty value went on")

    monkeypatch.setattr(umprov.inventory, "load_inventory", no_load)
    result = umprov_cli(*(a.replace("{inv}", str(fleet)) for a in args))
    assert result.exit_code == ExitCode.CONFIG, result.output
    assert result.stderr.startswith(f"umprov: error: {option} is empty: name a host")
    assert result.stderr.count("\n") == 1 and result.stdout == ""


def test_select_refuses_an_empty_pattern_and_takes_none_for_every_host(fleet: Path) -> None:
    inv = load_inventory(str(fleet))
    assert len(inv.select(None)) == 3
    for empty in ("", "  "):
        with pytest.raises(ConfigError, match="empty host pattern"):
            inv.select(empty)


# --- Ansible's patterns, as ansible-playbook --limit takes them --------------------------------


@pytest.mark.parametrize(
    ("pattern", "names"),
    [
        ("all", ["gpu01", "gpu02", "gpu03"]),
        ("*", ["gpu01", "gpu02", "gpu03"]),
        ("gpu_hosts:!hgx", ["gpu01"]),
        ("hgx:&gpu_hosts", ["gpu02", "gpu03"]),
        ("gpu_hosts[0]", ["gpu01"]),
        ("gpu_hosts[1:]", ["gpu02", "gpu03"]),
        ("~gpu0[13]", ["gpu01", "gpu03"]),
        ("gpu03,gpu01", ["gpu01", "gpu03"]),  # inventory order, as a play runs them
        ("gpu01:gpu02", ["gpu01", "gpu02"]),
        ("gpu0*:!gpu02", ["gpu01", "gpu03"]),
        ("hgx", ["gpu02", "gpu03"]),
    ],
)
def test_select_takes_ansible_patterns(fleet: Path, pattern: str, names: list[str]) -> None:
    assert [h.name for h in load_inventory(str(fleet)).select(pattern)] == names


def test_select_reads_a_limit_file_as_ansible_does(fleet: Path, tmp_path: Path) -> None:
    limit = write(tmp_path / "retry", "gpu03\ngpu01\n")
    assert [h.name for h in load_inventory(str(fleet)).select(f"@{limit}")] == ["gpu01", "gpu03"]
    with pytest.raises(ConfigError, match="Unable to find limit file"):
        load_inventory(str(fleet)).select(f"@{tmp_path / 'none'}")


@pytest.mark.parametrize("pattern", ["cpu", "gpu_hosts:&cpu", "hgx:!gpu_hosts", "localhost"])
def test_a_pattern_that_matches_no_host_names_it_and_the_file(fleet: Path, pattern: str) -> None:
    with pytest.raises(InventoryError) as err:
        load_inventory(str(fleet)).select(pattern)
    assert str(err.value) == f"{fleet}: no host matches '{pattern}'"
    assert err.value.exit_code == ExitCode.INVENTORY


class Stop(UmprovError):
    """Raised where a command would first touch a host: the hosts it got are recorded."""


def _recorder(got: list[str], hosts_arg: int = 0) -> Any:
    def record(*args: Any, **_kwargs: Any) -> Any:
        got.extend(h.name for h in args[hosts_arg])
        raise Stop("stopped before any host")
    return record


@pytest.mark.parametrize("command", ["deploy", "status", "verify"])
@pytest.mark.parametrize(("pattern", "names"), [("gpu_hosts:!hgx", ["gpu01"]),
                                                ("all", ["gpu01", "gpu02", "gpu03"]),
                                                ("hgx[1]", ["gpu03"])])
def test_every_command_runs_on_the_hosts_an_ansible_pattern_selects(
    umprov_cli: Any, fleet: Path, pubkey: Path, monkeypatch: pytest.MonkeyPatch, command: str,
    pattern: str, names: list[str],
) -> None:
    import umprov.deploy.run
    import umprov.status
    import umprov.verify.remote

    got: list[str] = []
    target = {"deploy": umprov.deploy.run, "status": umprov.status,
              "verify": umprov.verify.remote}[command]
    name = {"deploy": "deploy", "status": "probe", "verify": "verify_hosts"}[command]
    monkeypatch.setattr(target, name, _recorder(got))
    extra = ["--authorized-key", str(pubkey)] if command == "deploy" else []
    result = umprov_cli(command, str(fleet), "--limit", pattern, *extra)
    assert "stopped before any host" in result.stderr, result.stderr
    assert got == names


def test_provision_hands_an_ansible_pattern_to_ansible_playbook(
    umprov_cli: Any, fleet: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import umprov.provision

    got: dict[str, Any] = {}

    def run_playbook(inv: Any, **kwargs: Any) -> Any:
        got.update(kwargs, hosts=[h.name for h in inv.select(kwargs["limit"])])
        raise Stop("stopped before any host")

    monkeypatch.setattr(umprov.provision, "run_playbook", run_playbook)
    result = umprov_cli("provision", str(fleet), "--limit", "gpu_hosts:!hgx")
    assert "stopped before any host" in result.stderr, result.stderr
    assert got["limit"] == "gpu_hosts:!hgx" and got["hosts"] == ["gpu01"]
    nothing = umprov_cli("provision", str(fleet), "--limit", "hgx:&nosuch")
    assert nothing.exit_code == ExitCode.INVENTORY
    assert nothing.stderr == f"umprov: error: {fleet}: no host matches 'hgx:&nosuch'\n"


# --- an inventory without hosts is an error, never "0 host(s), valid" --------------------------


@pytest.mark.parametrize("body", ["", "all: {}\n", "all:\n  children:\n    gpu_hosts: {}\n",
                                  "[gpu_hosts]\n"])
def test_an_inventory_without_hosts_is_an_inventory_error(tmp_path: Path, body: str) -> None:
    path = write(tmp_path / ("hosts.ini" if body.startswith("[") else "hosts.yml"), body)
    with pytest.raises(InventoryError) as err:
        load_inventory(str(path))
    assert str(err.value) == f"{path}: no hosts"


def test_a_misspelt_group_key_is_named_when_it_leaves_no_host(tmp_path: Path) -> None:
    path = write(tmp_path / "hosts.yml", "all:\n  hsots_here:\n    gpu01: {}\n")
    with pytest.raises(InventoryError) as err:
        load_inventory(str(path))
    assert str(err.value) == (f"{path}: no hosts (Ansible skipped 'hsots_here' in group 'all': "
                              "a group holds only vars, children and hosts)")


@pytest.mark.parametrize("command", [("inventory", "check"), ("deploy",), ("status",),
                                     ("verify",), ("provision",)])
def test_no_command_succeeds_on_an_inventory_without_hosts(
    umprov_cli: Any, tmp_path: Path, pubkey: Path, command: tuple[str, ...]
) -> None:
    path = write(tmp_path / "empty.yml", "all:\n  hosst:\n    gpu01: {}\n")
    extra = ["--authorized-key", str(pubkey)] if command == ("deploy",) else []
    result = umprov_cli(*command, str(path), *extra)
    assert result.exit_code == ExitCode.INVENTORY, result.output
    assert result.stderr.startswith(f"umprov: error: {path}: no hosts")
    assert result.stderr.count("\n") == 1 and result.stdout == ""
