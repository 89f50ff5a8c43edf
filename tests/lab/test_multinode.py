"""`umprov verify --multi-node --backend gloo` over three lab hosts, end to end.

Real torchrun with its c10d rendezvous, in throwaway host-network containers of the deployed
image on each lab host (docker SDK over verified SSH); then Docker stopped on one host: it is
named as not joining, within the timeout, and nothing is left running anywhere.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.lab.conftest import (
    LAB_IMAGE_TAG,
    clear_lab,
    cli,
    lab_name,
    seed_engines,
    sigint_when,
    umprov_argv,
)

pytestmark = [pytest.mark.lab, pytest.mark.cost(380)]

NAME = lab_name("pytest-mn")
TAG = LAB_IMAGE_TAG
TIMEOUT = 60
LAB: dict[str, Any] = {}


@pytest.fixture(scope="module", autouse=True)
def lab(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    snapshot = request.getfixturevalue("docker_host_image")
    # The hosts' engines start with the lab image: the push is test_deploy's subject, not ours.
    clear_lab(NAME)
    seed_engines(request.getfixturevalue("engine_seed"), NAME, range(1, 4), snapshot)
    up = cli("lab", "up", "--hosts", "3", "--name", NAME, "--json", "--from-image", snapshot)
    assert up.exit_code == 0, up.stderr
    data = json.loads(up.stdout)
    try:
        inventory = data["inventory"]
        prov = cli("provision", inventory, "--only", "docker", "--json")
        assert prov.exit_code == 0, prov.stdout[-2000:] + prov.stderr[-2000:]
        pub = Path(data["key_file"]).with_suffix(".pub")
        dep = cli("deploy", inventory, "--image", TAG, "--authorized-key", str(pub), "--push",
                  "--json")
        assert dep.exit_code == 0, dep.stderr[-2000:]
        assert [h["pushed_bytes"] for h in json.loads(dep.stdout)["hosts"]] == [0, 0, 0]
        LAB.update(inventory=inventory, hosts=data["hosts"],
                   names=[h["name"] for h in data["hosts"]])
        yield LAB
    finally:
        cli("lab", "down", "--name", NAME)


def verify(*extra: str) -> tuple[Any, dict[str, dict], float]:
    t0 = time.monotonic()
    result = cli("verify", LAB["inventory"], "--multi-node", "--backend", "gloo", "--timeout",
                 str(TIMEOUT), "--json", *extra)
    wall = time.monotonic() - t0
    data = json.loads(result.stdout) if result.stdout.strip() else {"hosts": []}
    return result, {d["host"]: d for d in data["hosts"]}, wall


def lab_container(docker_client: Any, index: int) -> Any:
    return docker_client.containers.get(LAB["hosts"][index]["container"])


def leftovers(docker_client: Any, skip: int | None = None) -> list[str]:
    """Multi-node containers or torchrun processes on every reachable lab host."""
    found = []
    for i, h in enumerate(LAB["hosts"]):
        if i == skip:
            continue
        box = lab_container(docker_client, i)
        rc, out = box.exec_run(["sh", "-c", "docker ps -aq --filter label=org.umprov.multinode;"
                                " ps -eo args | grep '[t]orch.distributed.run' || true"])
        if out.strip():
            found.append(f"{h['name']}: {out.decode().strip()}")
    return found


def by_check(doc: dict) -> dict[str, dict]:
    return {r["check"]: r for r in doc["records"]}


def test_gloo_job_over_three_hosts(docker_client: Any) -> None:
    result, hosts, wall = verify()
    assert result.exit_code == 0, result.stderr[-3000:]
    assert set(hosts) == set(LAB["names"])
    nodes = set()
    for name, doc in hosts.items():
        checks = by_check(doc)
        assert doc["mode"] == "multi-node" and doc["verdict"] == "pass", (name, doc["records"])
        assert checks["multinode.join"]["verdict"] == "pass"
        for check in ("multinode.all_reduce", "multinode.all_gather"):
            assert checks[check]["verdict"] == "pass" and checks[check]["measured"] == 0
        bw = checks["multinode.busbw"]
        assert bw["verdict"] == "skip" and bw["measured"] > 0  # gloo: measured, not judged
        facts = doc["facts"]
        assert facts["world_size"] == 3 and facts["nnodes"] == 3 and facts["backend"] == "gloo"
        assert facts["network_mode"] == "host" and facts["env"]["NCCL_NVLS_ENABLE"] == "0"
        assert not facts["rendezvous"].startswith("127.")  # the first host's lab address
        nodes.add(facts["local_addr"])
    assert len(nodes) == 3  # three hosts, three addresses: really across the lab network
    print(f"\nmulti-node gloo, 3 hosts: {wall:.1f} s; "
          + json.dumps({n: d["facts"]["timings"] for n, d in hosts.items()}))
    assert leftovers(docker_client) == []


def test_host_with_docker_stopped_is_named(docker_client: Any) -> None:
    victim = 2
    box = lab_container(docker_client, victim)
    rc, out = box.exec_run(["systemctl", "stop", "docker.socket", "docker.service"])
    assert rc == 0, out
    try:
        result, hosts, wall = verify()
    finally:
        box.exec_run(["systemctl", "start", "docker.socket", "docker.service"])
    assert result.exit_code == 13, result.stderr[-3000:]
    assert wall < TIMEOUT + 60
    name = LAB["names"][victim]
    join = by_check(hosts[name])["multinode.join"]
    assert join["verdict"] == "fail" and join["detail"].startswith("did not join"), join
    for other in LAB["names"]:
        if other != name:
            detail = by_check(hosts[other])["multinode.join"]["detail"]
            assert f"{name} did not join" in detail, detail
    assert leftovers(docker_client, skip=victim) == []


def test_ctrl_c_leaves_nothing_running(docker_client: Any) -> None:
    """SIGINT to a real `umprov verify --multi-node` once its containers exist: exit 130, and
    no container or torchrun process on any host."""
    import os
    import subprocess

    first = lab_container(docker_client, 0)
    proc = subprocess.Popen(  # noqa: S603
        umprov_argv("verify", LAB["inventory"], "--multi-node",
                    "--backend", "gloo", "--timeout", str(TIMEOUT)),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=dict(os.environ))

    def container_started() -> bool:
        _rc, out = first.exec_run(["sh", "-c", "docker ps -q --filter label=org.umprov.multinode"])
        return bool(out.strip())

    sigint_when(proc, container_started, within=90, exit_within=120,
                what="multi-node container", then_s=1.5)  # torchrun starting or running
    assert leftovers(docker_client) == []


def test_unreachable_rendezvous_fails_every_host_within_bounds(docker_client: Any) -> None:
    """Every host reachable, but the rendezvous endpoint is not: each host's torchrun gives up
    on the store, each is named as not joining, within its bounds; nothing left running."""
    t0 = time.monotonic()
    result = cli("verify", LAB["inventory"], "--multi-node", "--backend", "gloo", "--timeout",
                 "20", "--rendezvous", "198.51.100.1:29400", "--json")
    wall = time.monotonic() - t0
    assert result.exit_code == 13, result.stderr[-3000:]
    assert wall < 20 * 3 + 90
    for doc in json.loads(result.stdout)["hosts"]:
        join = by_check(doc)["multinode.join"]
        assert join["verdict"] == "fail" and join["detail"].startswith("did not join"), join
        assert doc["facts"]["rendezvous"] == "198.51.100.1:29400"
    assert leftovers(docker_client) == []
