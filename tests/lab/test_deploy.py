"""`umprov lab image` + `umprov deploy --push` against two lab hosts, end to end.

Real OpenSSH and Jupyter clients against the deployed containers; faults: unknown and changed
host keys, Docker stopped on one host, a port taken, a nonexistent image.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.lab.conftest import LAB_IMAGE_TAG, clear_lab, cli, lab_name, ssh

pytestmark = [pytest.mark.lab, pytest.mark.cost(680)]

# UMPROV_TEST_DEPLOY_LAB: another lab name, for runs beside someone else's.
NAME = lab_name("pytest-deploy", "UMPROV_TEST_DEPLOY_LAB")
TAG = LAB_IMAGE_TAG


def deploy(*args: str) -> tuple[Any, dict[str, Any]]:
    result = cli("deploy", str(LAB["inventory"]), "--image", TAG, "--authorized-key",
                 str(LAB["pubkey"]), "--json", *args)
    data = json.loads(result.stdout) if result.stdout.strip() else {}
    return result, {h["host"]: h for h in data.get("hosts", [])}


LAB: dict[str, Any] = {}


def _ensure_docker(inventory: str) -> None:
    """Docker on the lab hosts through the real docker_engine role (`provision --only docker`)."""
    result = cli("provision", inventory, "--only", "docker", "--json")
    assert result.exit_code == 0, result.stdout[-2000:] + result.stderr[-2000:]


@pytest.fixture(scope="module", autouse=True)
def lab(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    clear_lab(NAME)
    up = cli("lab", "up", "--hosts", "2", "--name", NAME, "--json",
              "--from-image", request.getfixturevalue("docker_host_image"))
    assert up.exit_code == 0, up.stderr
    data = json.loads(up.stdout)
    key, known = Path(data["key_file"]), Path(data["known_hosts"])
    _ensure_docker(data["inventory"])
    # After the lab is up and provisioned, as before: a worker waiting for another's build
    # (lab_image holds a lock) has its hosts ready meanwhile.
    lab_image = request.getfixturevalue("lab_image")
    LAB.update(
        inventory=Path(data["inventory"]), key=key, known_hosts=known, hosts=data["hosts"],
        names=[h["name"] for h in data["hosts"]], pubkey=key.with_suffix(".pub"),
        image=lab_image,
    )
    yield LAB
    cli("lab", "down", "--name", NAME)


@pytest.fixture(scope="module")
def first_deploy(lab: dict[str, Any]) -> dict[str, Any]:
    result, hosts = deploy("--push")
    assert result.exit_code == 0, result.stderr
    return hosts


def container_ssh(host: str, command: str, *extra: str) -> subprocess.CompletedProcess[str]:
    from umprov.deploy.state import container_alias, ssh_config_path

    return subprocess.run(
        ["ssh", "-F", str(ssh_config_path(host)), "-o", "BatchMode=yes", "-o", "ConnectTimeout=15",
         *extra, container_alias(host), command],
        capture_output=True, text=True, timeout=90,
    )


def test_push_deploys_both_hosts(first_deploy: dict[str, Any]) -> None:
    assert set(first_deploy) == set(LAB["names"])
    for host in first_deploy.values():
        assert host["ok"] and host["status"] in ("created", "replaced", "unchanged")
        assert host["image_id"] == LAB["image"]["image_id"]


def test_token_stored_private_and_never_printed(first_deploy: dict[str, Any]) -> None:
    from umprov.deploy.state import token_path

    for name in LAB["names"]:
        path = token_path(name)
        assert oct(path.stat().st_mode & 0o777) == "0o600"
        token = path.read_text().strip()
        assert len(token) >= 32
        assert token not in json.dumps(first_deploy)


def test_openssh_login_as_user_runs_torch(first_deploy: dict[str, Any]) -> None:
    for name in LAB["names"]:
        done = container_ssh(name, 'id -un; python -c "import torch; print(torch.__version__)"')
        assert done.returncode == 0, done.stderr
        user, version = done.stdout.split()
        assert user == "umprov" and version.startswith("2.")


def test_password_and_root_logins_refused(first_deploy: dict[str, Any]) -> None:
    name = LAB["names"][0]
    pw = container_ssh(name, "true", "-o", "PubkeyAuthentication=no",
                       "-o", "PreferredAuthentications=password,keyboard-interactive")
    assert pw.returncode == 255 and "Permission denied (publickey)" in pw.stderr
    root = container_ssh(name, "true", "-l", "root")
    assert root.returncode == 255 and "Permission denied" in root.stderr


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def jupyter(first_deploy: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """A tunnel to the first host's Jupyter (published on that host's loopback)."""
    from umprov.deploy.state import jump_alias, load_connection, ssh_config_path, token_path

    name = LAB["names"][0]
    conn = load_connection(name)
    assert conn is not None
    port = _free_port()
    proc = subprocess.Popen(
        ["ssh", "-F", str(ssh_config_path(name)), "-o", "BatchMode=yes",
         "-o", "ExitOnForwardFailure=yes", "-N",
         "-L", f"127.0.0.1:{port}:127.0.0.1:{conn['jupyter_port']}", jump_alias(name)],
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{base}/api", timeout=2).close()  # noqa: S310
            break
        except OSError:
            assert time.monotonic() < deadline, "tunnel to Jupyter did not come up"
            time.sleep(0.3)
    try:
        yield base, token_path(name).read_text().strip()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_jupyter_refuses_without_token(jupyter: tuple[str, str]) -> None:
    base, _token = jupyter
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{base}/api/kernels", timeout=10)  # noqa: S310
    assert err.value.code == 403
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{base}/api/kernels?token=wrong-token-value", timeout=10)  # noqa: S310
    assert err.value.code == 403


def test_jupyter_kernel_runs_torch_with_token(jupyter: tuple[str, str]) -> None:
    import uuid

    import websocket

    base, token = jupyter
    headers = {"Authorization": f"token {token}", "Content-Type": "application/json"}
    req = urllib.request.Request(  # noqa: S310 (http to our own tunnel)
        f"{base}/api/kernels", data=b"{}", headers=headers, method="POST"
    )
    with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310
        kernel = json.loads(resp.read())
    ws = websocket.create_connection(
        f"ws://{base.removeprefix('http://')}/api/kernels/{kernel['id']}/channels",
        header=[f"Authorization: token {token}"], timeout=60,
    )
    try:
        msg_id = uuid.uuid4().hex
        # The kernel must not inherit the token: `!env` would print it into the notebook.
        code = (
            "import os, torch\n"
            "(int(torch.arange(10).sum().item() * 3), 'JUPYTER_TOKEN' in os.environ)"
        )
        ws.send(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "test",
                       "session": uuid.uuid4().hex, "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell",
            "content": {"code": code, "silent": False, "store_history": False,
                        "user_expressions": {}, "allow_stdin": False, "stop_on_error": True},
        }))
        result = None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            msg = json.loads(ws.recv())
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "execute_result":
                result = msg["content"]["data"]["text/plain"]
            if msg["msg_type"] == "error":
                pytest.fail(f"kernel error: {msg['content']}")
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle" and result:
                break
        assert result == "(135, False)"
    finally:
        ws.close()
        urllib.request.urlopen(urllib.request.Request(  # noqa: S310
            f"{base}/api/kernels/{kernel['id']}", headers=headers, method="DELETE"), timeout=30)


def test_redeploy_unchanged_keeps_containers(first_deploy: dict[str, Any]) -> None:
    before = {n: h["container_id"] for n, h in deploy()[1].items()}
    result, hosts = deploy()
    assert result.exit_code == 0, result.stderr
    assert {n: h["status"] for n, h in hosts.items()} == dict.fromkeys(LAB["names"], "unchanged")
    assert {n: h["container_id"] for n, h in hosts.items()} == before
    assert all(h["pushed_bytes"] == 0 for h in hosts.values())
    # --push again: the hosts have that image ID, nothing is sent
    result, hosts = deploy("--push")
    assert result.exit_code == 0 and all(h["pushed_bytes"] == 0 for h in hosts.values())
    assert {n: h["container_id"] for n, h in hosts.items()} == before


def test_changed_port_replaces_and_pins_again(first_deploy: dict[str, Any]) -> None:
    name = LAB["names"][0]
    before = deploy("--limit", name)[1][name]["container_id"]
    result, hosts = deploy("--limit", name, "--ssh-port", "2224")
    assert result.exit_code == 0, result.stderr
    assert hosts[name]["status"] == "replaced" and hosts[name]["container_id"] != before
    done = container_ssh(name, "true")  # the config and the pinned key follow the new port
    assert done.returncode == 0, done.stderr
    result, hosts = deploy("--limit", name)  # back to the default port: replaced again
    assert hosts[name]["status"] == "replaced"


def test_ssh_logins_get_the_pool_switch_and_the_given_environment(
    first_deploy: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """After deploy --managed-memory --env, an SSH login into the container (a command, and a
    login shell, whose /etc/profile resets PATH) reads what docker exec reads: the switch, the
    pool's settings, a value with spaces, quotes, a backslash and $ taken from umprov's own
    environment, and the image's venv first on PATH. The lab's image lacks the pool: deploy
    says so. No value reaches the output or the container's labels; switching back says why."""
    name, port = LAB["names"][0], LAB["hosts"][0]["port"]
    secret = "two words \"quoted\" \\ and $HOME 'single'"
    monkeypatch.setenv("UMPROV_TEST_SECRET", secret)
    result, hosts = deploy("--limit", name, "--managed-memory", "--env",
                           "UMPROV_MANAGED_RESERVOIR=8g", "--env", "UMPROV_TEST_SECRET")
    assert result.exit_code == 0, result.stderr
    host = hosts[name]
    assert host["status"] == "replaced", host
    assert host["changed"] == ["managed memory on", "env UMPROV_MANAGED_RESERVOIR added",
                               "env UMPROV_TEST_SECRET added"]
    assert host["managed_memory"] is True and host["managed_memory_pool"] is False
    assert "was built without it" in host["warnings"][0]
    names = "UMPROV_MANAGED_MEMORY UMPROV_MANAGED_RESERVOIR UMPROV_TEST_SECRET"
    for command in (f"printenv {names}; command -v python",
                    f"bash -lc 'printenv {names}; command -v python'"):
        done = container_ssh(name, command)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == ["1", "8g", secret, "/opt/umprov-venv/bin/python"]
    labels = ssh(LAB["key"], LAB["known_hosts"], port,
                 "docker inspect -f '{{json .Config.Labels}}' umprov")
    assert labels.returncode == 0 and "org.umprov.spec-parts" in labels.stdout
    status = cli("status", str(LAB["inventory"]), "--limit", name, "--json")
    (row,) = json.loads(status.stdout)["hosts"]
    assert row["managed_memory"] is True and row["managed_memory_pool"] is False
    for text in (result.stdout, result.stderr, labels.stdout, status.stdout, status.stderr):
        assert "quoted" not in text
    result, hosts = deploy("--limit", name)
    assert hosts[name]["status"] == "replaced" and hosts[name]["managed_memory"] is False
    assert "managed memory off" in hosts[name]["message"]


def test_unknown_host_key_refused(first_deploy: dict[str, Any], tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    inv = _inventory_copy(tmp_path, known_hosts=empty)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("UMPROV_STATE_DIR", str(tmp_path / "state"))
    result = cli("deploy", str(inv), "--image", TAG, "--authorized-key", str(LAB["pubkey"]))
    assert result.exit_code == 6, result.stderr
    port = LAB["hosts"][0]["port"]
    assert f"host key for [127.0.0.1]:{port} is not known" in result.stderr
    assert "umprov trust" in result.stderr and "--trust-new-hosts" in result.stderr


def test_changed_host_key_refused(first_deploy: dict[str, Any], tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    wrong = tmp_path / "known_hosts"
    other = "AAAAC3NzaC1lZDI1NTE5AAAAIC4xqZ1vUQ0n0Fvh5yq0i7XGkQm0sKQdLqJ6dW7b7c1T"
    wrong.write_text("".join(f"[127.0.0.1]:{h['port']} ssh-ed25519 {other}\n" for h in LAB["hosts"]))
    inv = _inventory_copy(tmp_path, known_hosts=wrong)
    monkeypatch.setenv("HOME", str(tmp_path))
    result = cli("deploy", str(inv), "--image", TAG, "--authorized-key", str(LAB["pubkey"]),
                 "--trust-new-hosts")
    assert result.exit_code == 6, result.stderr
    assert "HOST KEY CHANGED" in result.stderr and str(wrong) in result.stderr


def _inventory_copy(tmp_path: Path, *, known_hosts: Path) -> Path:
    import yaml

    data = yaml.safe_load(LAB["inventory"].read_text())
    group = data["all"]["children"]["gpu_hosts"]
    group["vars"]["umprov_known_hosts"] = str(known_hosts)
    group["vars"].pop("ansible_ssh_common_args", None)
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_docker_stopped_on_one_host(first_deploy: dict[str, Any]) -> None:
    down, up = LAB["hosts"][0], LAB["hosts"][1]
    stop = ssh(LAB["key"], LAB["known_hosts"], down["port"],
               "sudo systemctl stop docker.socket docker.service")
    assert stop.returncode == 0, stop.stderr
    try:
        result, hosts = deploy()
        assert result.exit_code == 10, result.stderr
        assert hosts[down["name"]]["status"] == "failed"
        assert "Docker engine not answering" in hosts[down["name"]]["message"]
        assert hosts[up["name"]]["ok"]
    finally:
        ssh(LAB["key"], LAB["known_hosts"], down["port"], "sudo systemctl start docker")
    deadline = time.monotonic() + 60
    while ssh(LAB["key"], LAB["known_hosts"], down["port"], "docker ps -q").returncode != 0:
        assert time.monotonic() < deadline
        time.sleep(1)


def test_port_taken_fails_clearly_and_keeps_the_old_container(first_deploy: dict[str, Any]) -> None:
    name = LAB["names"][0]
    first = deploy("--limit", name)[1][name]
    assert first["ok"] and first["container_id"], first  # its reason, should it fail (seen once)
    before = first["container_id"]
    # The lab host's own sshd listens on port 22 of every address.
    result, hosts = deploy("--limit", name, "--ssh-port", "22")
    assert result.exit_code == 10
    assert "port 22 on 127.0.0.1 is already in use on the host" in hosts[name]["message"]
    result, hosts = deploy("--limit", name)
    assert hosts[name]["status"] == "unchanged" and hosts[name]["container_id"] == before


def test_nonexistent_image(first_deploy: dict[str, Any]) -> None:
    result = cli("deploy", str(LAB["inventory"]), "--image", "umprov/no-such-image:0",
                 "--authorized-key", str(LAB["pubkey"]), "--json")
    assert result.exit_code == 10
    hosts = json.loads(result.stdout)["hosts"]
    assert all("umprov/no-such-image:0 is not on the host" in h["message"] for h in hosts)
    result = cli("deploy", str(LAB["inventory"]), "--image", "umprov/no-such-image:0", "--push",
                 "--authorized-key", str(LAB["pubkey"]), "--json")
    assert result.exit_code == 10
    assert "not on this machine's engine" in result.stdout


def test_status_reports_each_host(first_deploy: dict[str, Any]) -> None:
    result = cli("status", str(LAB["inventory"]), "--json")
    assert result.exit_code == 0, result.stderr
    rows = {r["host"]: r for r in json.loads(result.stdout)["hosts"]}
    for name in LAB["names"]:
        row = rows[name]
        # the row whole where it fails: a probe's error is in its "message" (CI saw a reachable
        # host with no engine facts once, under load, and no word of why)
        assert row["reachable"] and row.get("docker") and row.get("state") == "running", row
        assert row["jupyter"] is True and row["nvidia_runtime"] is False, row
    connect = cli("status", "--connect", LAB["names"][0])
    assert connect.exit_code == 0 and "token=" in connect.stdout
    assert os.environ.get("UMPROV_STATE_DIR")


def test_verify_in_deployed_containers_reports_no_gpu_honestly(
    first_deploy: dict[str, Any], tmp_path: Path
) -> None:
    """The agent runs in each deployed container through docker exec; the lab has no GPU."""
    junit, prom = tmp_path / "verify.xml", tmp_path / "prom"
    result = cli("verify", str(LAB["inventory"]), "--json", "--junit", str(junit),
                 "--prometheus", str(prom))
    assert result.exit_code == 13, result.stderr  # a failure, never a pass
    data = json.loads(result.stdout)
    assert data["verdict"] == "fail"
    assert sorted(h["host"] for h in data["hosts"]) == sorted(LAB["names"])
    for report in data["hosts"]:
        failed = [r for r in report["records"] if r["verdict"] == "fail"]
        assert [r["check"] for r in failed] == ["host.gpu_visible"]
        assert "no NVIDIA GPU visible" in failed[0]["detail"]
        assert "/dev/nvidia-uvm" in failed[0]["detail"]
    assert junit.read_text().count("<failure") == 2
    text = (prom / "umprov_verify.prom").read_text()
    for name in LAB["names"]:
        assert f'umprov_verify_host_verdict{{host="{name}"' in text


def test_verify_image_runs_the_agent_in_a_container_of_its_own_and_leaves_none(
    first_deploy: dict[str, Any],
) -> None:
    """--image: a throwaway container per host; no NVIDIA runtime on the lab hosts, so the one
    asked for with GPUs is refused at its start, and the agent runs in one without, saying so."""
    result = cli("verify", str(LAB["inventory"]), "--image", TAG, "--json")
    assert result.exit_code == 13, result.stderr
    data = json.loads(result.stdout)
    assert sorted(h["host"] for h in data["hosts"]) == sorted(LAB["names"])
    for report in data["hosts"]:
        failed = [r for r in report["records"] if r["verdict"] == "fail"]
        assert [r["check"] for r in failed] == ["host.gpu_visible"], failed
        assert "the container could not get GPUs" in failed[0]["detail"], failed[0]["detail"]
    for host in LAB["hosts"]:
        left = ssh(LAB["key"], LAB["known_hosts"], host["port"],
                   "docker ps -a --filter label=org.umprov.verify --format '{{.Names}}'")
        assert left.returncode == 0 and left.stdout.strip() == "", (host["name"], left.stdout)


def test_incremental_push_sends_only_the_new_layer(first_deploy: dict[str, Any],
                                                   docker_client: Any) -> None:
    """v2 = the pushed image plus one small layer: only that layer crosses to the host (which
    holds v1's layers since the first push), the host loads v2's exact ID and runs it.

    Last in this file on purpose: it leaves the first host's container on v2.
    """
    import io
    import tarfile

    name, port = LAB["names"][0], LAB["hosts"][0]["port"]
    v2_tag, marker = f"{TAG}-{NAME}-v2", f"v2-{time.time_ns()}"
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for path, data in (("Dockerfile", f"FROM {TAG}\nCOPY v2.txt /etc/umprov-v2.txt\n"),
                           ("v2.txt", marker + "\n")):
            info = tarfile.TarInfo(path)
            info.size = len(data.encode())
            tar.addfile(info, io.BytesIO(data.encode()))
    context.seek(0)
    v2, _logs = docker_client.images.build(fileobj=context, custom_context=True, tag=v2_tag,
                                           rm=True)
    try:
        result = cli("deploy", str(LAB["inventory"]), "--limit", name, "--image", v2_tag,
                     "--push", "--authorized-key", str(LAB["pubkey"]), "--json")
        assert result.exit_code == 0, result.stderr
        host = json.loads(result.stdout)["hosts"][0]
        assert host["ok"] and host["status"] == "replaced"
        # v1's layers (about 1.27 GB as saved) stay home; the new layer and the metadata cross.
        assert host["skipped_bytes"] > 0.9 * LAB["image"]["size_bytes"]
        assert 0 < host["pushed_bytes"] < 1_000_000
        assert "already on the host" in result.stderr
        assert host["image_id"] == v2.id
        on_host = ssh(LAB["key"], LAB["known_hosts"], port,
                      f"docker image inspect -f '{{{{.Id}}}}' {v2_tag}; "
                      "docker inspect -f '{{.Image}}' umprov; "
                      "docker exec umprov cat /etc/umprov-v2.txt")
        assert on_host.returncode == 0, on_host.stderr
        assert on_host.stdout.split() == [v2.id, v2.id, marker]
    finally:
        docker_client.images.remove(v2_tag, noprune=False)
