"""`umprov deploy --pull` from the lab's private registry, TLS verified against a CA that the
docker_engine role gave the hosts; faults: an unknown tag, a host without the CA."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.lab.conftest import LAB_IMAGE_TAG, clear_lab, cli, lab_name, ssh

pytestmark = [pytest.mark.lab, pytest.mark.cost(280)]

NAME = lab_name("pytest-pull", "UMPROV_TEST_PULL_LAB")
LOCAL_TAG = LAB_IMAGE_TAG
REPO = "umprov/pytorch-cuda"
TAG = "pytest-pull"

LAB: dict[str, Any] = {}


def deploy(image: str, *args: str) -> tuple[Any, dict[str, Any]]:
    result = cli("deploy", str(LAB["inventory"]), "--pull", "--image", image,
                 "--authorized-key", str(LAB["pubkey"]), "--json", *args)
    data = json.loads(result.stdout) if result.stdout.strip() else {}
    return result, {h["host"]: h for h in data.get("hosts", [])}


def host_ssh(index: int, command: str) -> Any:
    host = LAB["hosts"][index]
    return ssh(LAB["key"], LAB["known_hosts"], host["port"], command)


@pytest.fixture(scope="module", autouse=True)
def lab(docker_client: Any, request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    clear_lab(NAME)
    up = cli("lab", "up", "--hosts", "2", "--name", NAME, "--registry", "--json",
              "--from-image", request.getfixturevalue("docker_host_image"))
    assert up.exit_code == 0, up.stderr
    data = json.loads(up.stdout)
    assert data["registry"]["address"] == f"umprov-lab-{NAME}-registry:5000"
    checked = cli("inventory", "check", data["inventory"])
    assert checked.exit_code == 0, checked.stderr
    # Docker and the registry's CA on the hosts, through the docker_engine role.
    provisioned = cli("provision", data["inventory"], "--only", "docker", "--json")
    assert provisioned.exit_code == 0, provisioned.stdout[-2000:] + provisioned.stderr[-2000:]
    # After the lab is up and provisioned, as before: a worker waiting for another's build
    # (lab_image holds a lock) has its hosts ready meanwhile.
    image_id = request.getfixturevalue("lab_image")["image_id"]
    # Into the registry from this machine, over its loopback port.
    local_repo = f"{data['registry']['local']}/{REPO}"
    docker_client.images.get(LOCAL_TAG).tag(local_repo, TAG)
    for line in docker_client.images.push(local_repo, tag=TAG, stream=True, decode=True):
        assert "error" not in line, line
    key = Path(data["key_file"])
    LAB.update(inventory=Path(data["inventory"]), key=key, pubkey=key.with_suffix(".pub"),
               known_hosts=Path(data["known_hosts"]), hosts=data["hosts"],
               names=[h["name"] for h in data["hosts"]], image_id=image_id,
               image=f"{data['registry']['address']}/{REPO}:{TAG}", registry=data["registry"])
    yield LAB
    docker_client.images.remove(f"{local_repo}:{TAG}")
    cli("lab", "down", "--name", NAME)


def test_the_role_installed_the_registry_ca() -> None:
    ca = Path(LAB["registry"]["ca_file"]).read_text().strip()
    for index in range(2):
        done = host_ssh(index, f"cat /etc/docker/certs.d/{LAB['registry']['address']}/ca.crt")
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == ca


def test_pull_deploys_both_hosts_with_the_same_image_id() -> None:
    result, hosts = deploy(LAB["image"])
    assert result.exit_code == 0, result.stderr
    assert set(hosts) == set(LAB["names"])
    for host in hosts.values():
        assert host["ok"] and host["status"] == "created", host
        assert host["image_id"] == LAB["image_id"]
        assert host["pushed_bytes"] == 0
    assert f"pulling {LAB['image']}" in result.stderr
    # The host holds the image under the registry's name, and the container runs it.
    short = LAB["image_id"].split(":")[1][:12]
    for index in range(2):
        done = host_ssh(index, f"docker image inspect --format '{{{{.Id}}}}' {LAB['image']}; "
                               "docker ps --format '{{.Image}} {{.State}}'")
        assert done.returncode == 0, done.stderr
        assert done.stdout.split("\n")[0] == LAB["image_id"]
        assert f"{short} running" in done.stdout, done.stdout


def test_pull_again_changes_nothing() -> None:
    before = {n: h["container_id"] for n, h in deploy(LAB["image"])[1].items()}
    result, hosts = deploy(LAB["image"])
    assert result.exit_code == 0, result.stderr
    assert {n: h["container_id"] for n, h in hosts.items()} == before
    assert all(h["status"] == "unchanged" for h in hosts.values())


def test_unknown_tag_fails_each_host_clearly() -> None:
    missing = LAB["image"].rsplit(":", 1)[0] + ":no-such-tag"
    result, hosts = deploy(missing)
    assert result.exit_code == 10, result.stderr
    for host in hosts.values():
        assert not host["ok"] and host["status"] == "failed"
        assert host["message"].startswith(f"pulling {missing} failed: ")
        assert "not found" in host["message"] or "unknown" in host["message"], host["message"]
        assert "\n" not in host["message"]


def test_a_host_without_the_ca_refuses_the_registry_and_provision_restores_it() -> None:
    first, second = LAB["names"]
    gone = host_ssh(1, "sudo rm -rf /etc/docker/certs.d")
    assert gone.returncode == 0, gone.stderr
    result, hosts = deploy(LAB["image"])
    assert result.exit_code == 10, result.stderr
    assert hosts[first]["ok"] and hosts[first]["status"] == "unchanged"
    assert hosts[second]["status"] == "failed"
    assert "certificate signed by unknown authority" in hosts[second]["message"]
    # The role puts the CA back (and changes nothing on the other host).
    again = cli("provision", str(LAB["inventory"]), "--only", "docker", "--json")
    assert again.exit_code == 0, again.stderr
    changed = {h["host"]: h["changed"] for h in json.loads(again.stdout)["hosts"]}
    assert changed[second] >= 1 and changed[first] == 0, changed
    result, hosts = deploy(LAB["image"])
    assert result.exit_code == 0, result.stderr
    assert all(h["ok"] for h in hosts.values())
