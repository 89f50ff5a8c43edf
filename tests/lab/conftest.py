"""Lab tier: real Docker engine, real systemd hosts, real sshd, real Ansible."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.lab


def lab_name(default: str, override: str | None = None) -> str:
    """A module's lab name: the env var `override` if set, else UMPROV_TEST_LAB_PREFIX + default,
    so that a run beside someone else's (`UMPROV_TEST_LAB_PREFIX=e-`) touches none of theirs."""
    if override and os.environ.get(override):
        return os.environ[override]
    return os.environ.get("UMPROV_TEST_LAB_PREFIX", "") + default


def cli(*args: str, input: str | None = None) -> Any:
    """`umprov ARGS` in-process through the CLI's error boundary, as the tests' user runs it."""
    from click.testing import CliRunner

    from tests.conftest import _Boundary

    return CliRunner().invoke(_Boundary("umprov"), list(args), input=input,
                              catch_exceptions=False)


def clear_lab(name: str) -> None:
    """A module's lab starts fresh: one of that name left by a run that was killed (its hosts'
    containers, their engines' storage as the kill found it) is taken down first, or `lab up`
    would take it up as it is (seen in CI: a host with another run's container, another whose
    engine had lost a layer mid-pull). UMPROV_KEEP_LAB=1 keeps it (a re-run completes it)."""
    if not os.environ.get("UMPROV_KEEP_LAB"):
        cli("lab", "down", "--name", name)


@contextlib.contextmanager
def docker_seed_host(name: str, *up_args: str) -> Iterator[dict[str, Any]]:
    """A one-host lab (`lab up ARGS`) with Docker provisioned (`provision --only docker`), its
    `lab up --json` document; taken down on leaving."""
    try:
        clear_lab(name)
        up = cli("lab", "up", "--hosts", "1", "--name", name, "--json", *up_args)
        assert up.exit_code == 0, up.stderr
        data = json.loads(up.stdout)
        prov = cli("provision", data["inventory"], "--only", "docker", "--json")
        assert prov.exit_code == 0, prov.stdout[-2000:] + prov.stderr[-2000:]
        yield data
    finally:
        cli("lab", "down", "--name", name)


# The lab's PyTorch image, built once per test run (lab_image) and deployed by several modules.
LAB_IMAGE_TAG = f"umprov/pytorch-cuda:{lab_name('pytest-lab')}"


@contextlib.contextmanager
def image_build_lock() -> Iterator[None]:
    """One lab image build at a time on this machine: side-by-side workers (or another
    checkout's run) building it at once would each spend minutes of CPU on the same layers."""
    with open(Path(tempfile.gettempdir()) / "umprov-test-lab-image.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


@pytest.fixture(scope="session")
def lab_image(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`umprov lab image`'s JSON for LAB_IMAGE_TAG, built by the first worker that asks;
    the others of the same run read its document (their base temp's parent is shared)."""
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "lab-image.json"
    with image_build_lock():
        if not shared.exists():
            built = cli("lab", "image", "--tag", LAB_IMAGE_TAG, "--json")
            assert built.exit_code == 0, built.stderr
            shared.write_text(built.stdout)
        return json.loads(shared.read_text())


# What decides what `provision --only docker` leaves on a host: the roles, the playbooks, the
# variables the lab writes, and the host image it starts from.
_SEED_INPUTS = ("roles", "playbooks", "lab/umprov_lab/inventory.py",
                "lab/umprov_lab/stand_in_repo.py", "ansible.cfg")


def docker_host_tag() -> str:
    """The snapshot's tag: a digest of what makes it, so a changed role makes a new one."""
    import hashlib

    from umprov_lab.host_image import recipe_tag

    digest = hashlib.sha256(recipe_tag().encode())
    for top in _SEED_INPUTS:
        root = REPO / top
        for path in sorted(root.rglob("*") if root.is_dir() else [root]):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return f"umprov-lab-host:docker-{digest.hexdigest()[:12]}"


@pytest.fixture(scope="session")
def docker_host_image() -> str:
    """A lab host that `provision --only docker` converged, saved by `umprov lab snapshot`, for
    the modules whose tests run on Docker rather than install it (deploy, multinode, pull):
    they start their hosts from it and their own `provision --only docker` finds little to do.
    Made once per machine and kept (keyed by docker_host_tag); workers wait on one lock."""
    tag = docker_host_tag()
    with open(Path(tempfile.gettempdir()) / "umprov-test-lab-seed.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode:
            seed = lab_name("pytest-seed")
            with docker_seed_host(seed):
                saved = cli("lab", "snapshot", "--name", seed, "--tag", tag)
                assert saved.exit_code == 0, saved.stderr
    return tag


# A Docker engine's storage (/var/lib/docker, a volume per lab host) that already holds the lab
# image: hosts started with a copy of it find the image there, so `deploy --push` sends nothing.
# For the modules whose subject is not the push (multi-node, inventories, most of the secrets
# sweep): pushing 1.3 GB over SSH to every host was most of their set-up time.
ENGINE_SEED_LABEL = "org.umprov.test.engine-seed"


def _engine_seed_name(lab_image_id: str) -> str:
    import hashlib

    key = f"{docker_host_tag()}|{lab_image_id}".encode()
    return f"umprov-test-engine-{hashlib.sha256(key).hexdigest()[:12]}"


# Written into the seed volume once its copy is whole: a run killed while copying (no except
# clause runs on SIGKILL) leaves a volume without it, which the next run makes again.
SEED_DONE = "/v/.umprov-test-seed-done"


def _in_volume(volume: str, image: str, *argv: str) -> bool:
    """``argv`` in a container with ``volume`` at /v; whether it exited 0."""
    return subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", argv[0],
                           "-v", f"{volume}:/v", image, *argv[1:]],
                          capture_output=True, timeout=120).returncode == 0


def _copy_volume(source: str, dests: list[str], image: str) -> None:
    """``source``'s files into each volume of ``dests`` (made if missing), side by side, as they
    are: overlay2's whiteouts and trusted.* attributes need MKNOD and SYS_ADMIN to copy."""
    mounts = [arg for i, dest in enumerate(dests) for arg in ("-v", f"{dest}:/to/{i}")]
    script = ('set -e; for d in /to/*; do cp -a /from/. "$d"/ & pids="$pids $!"; done; '
              'for p in $pids; do wait "$p"; done')
    done = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--cap-add", "SYS_ADMIN",
         "--entrypoint", "sh", "-v", f"{source}:/from:ro", *mounts, image, "-c", script],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"copying volume {source} to {dests}: {done.stderr[-2000:]}"


@pytest.fixture(scope="session")
def engine_seed(docker_host_image: str, lab_image: dict[str, Any]) -> str:
    """The name of a volume holding a stopped engine's storage with LAB_IMAGE_TAG loaded, made
    once per machine for this snapshot and image (older ones removed); workers wait on a lock.
    Made the way a user's host gets the image: `deploy --push` to a lab host of the snapshot."""
    from umprov_lab.layout import container_name

    volume = _engine_seed_name(lab_image["image_id"])
    with open(Path(tempfile.gettempdir()) / "umprov-test-engine-seed.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if subprocess.run(["docker", "volume", "inspect", volume], capture_output=True
                          ).returncode == 0 and _in_volume(volume, docker_host_image, "test",
                                                           "-e", SEED_DONE):
            return volume
        seed = lab_name("pytest-engine")
        try:
            with docker_seed_host(seed, "--from-image", docker_host_image) as data:
                pub = str(Path(data["key_file"]).with_suffix(".pub"))
                dep = cli("deploy", data["inventory"], "--image", LAB_IMAGE_TAG, "--push",
                          "--authorized-key", pub, "--json")
                assert dep.exit_code == 0, dep.stderr[-2000:]
                host = container_name(seed, 1)
                # No container in the copy (hosts deploy their own), the engine stopped cleanly.
                stop = subprocess.run(
                    ["docker", "exec", host, "sh", "-c", "docker rm -f $(docker ps -aq) "
                     ">/dev/null 2>&1; docker volume prune -f >/dev/null; systemctl stop "
                     "docker.socket docker.service containerd.service"],
                    capture_output=True, text=True, timeout=120)
                assert stop.returncode == 0, stop.stdout + stop.stderr
                for old in subprocess.run(
                        ["docker", "volume", "ls", "-q", "--filter", f"label={ENGINE_SEED_LABEL}"],
                        capture_output=True, text=True).stdout.split():
                    subprocess.run(["docker", "volume", "rm", old], capture_output=True)
                subprocess.run(["docker", "volume", "rm", volume], capture_output=True)
                subprocess.run(["docker", "volume", "create", "--label", ENGINE_SEED_LABEL,
                                volume], check=True, capture_output=True)
                _copy_volume(f"{host}-docker", [volume], docker_host_image)
                assert _in_volume(volume, docker_host_image, "touch", SEED_DONE)
        except BaseException:
            subprocess.run(["docker", "volume", "rm", volume], capture_output=True)
            raise
    return volume


def seed_engines(seed: str, lab: str, indexes: Iterable[int], image: str) -> None:
    """Give hosts ``indexes`` of lab ``lab``, before `lab up` creates them, a copy of the seeded
    engine storage (the volume a host mounts at /var/lib/docker is used if it exists)."""
    from umprov_lab.layout import container_name

    volumes = []
    for index in indexes:
        if subprocess.run(["docker", "container", "inspect", container_name(lab, index)],
                          capture_output=True).returncode == 0:
            continue  # a host kept from before (UMPROV_KEEP_LAB): its engine is in use
        volume = f"{container_name(lab, index)}-docker"
        subprocess.run(["docker", "volume", "rm", "-f", volume], capture_output=True)
        volumes.append(volume)
    if volumes:
        _copy_volume(seed, volumes, image)


class SlurmLab:
    """A lab with a Slurm cluster (`umprov lab up --slurm`): its `lab up --json` document, and
    Slurm's own commands run on its controller."""

    def __init__(self, up: dict[str, Any]) -> None:
        self.up = up
        self.name: str = up["lab"]
        self.inventory = Path(up["inventory"])
        self.controller: str = up["slurm"]["controller"]
        self.nodes: list[str] = up["slurm"]["nodes"]
        self.key_file = Path(up["key_file"])
        self.known_hosts = Path(up["known_hosts"])
        self.ports = {h["name"]: h["port"] for h in up["hosts"]}

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``argv`` on the controller as root (scontrol, sinfo, squeue, sbatch)."""
        done = subprocess.run(["docker", "exec", self.controller, *argv], capture_output=True,
                              text=True, timeout=60)
        if check:
            assert done.returncode == 0, f"{argv}: {done.stdout}{done.stderr}"
        return done

    def nodes_now(self) -> dict[str, tuple[str, str]]:
        """sinfo's view, node -> (state, reason): ``sinfo -h -N -o '%N|%T|%E'``."""
        out = self.run("sinfo", "-h", "-N", "-o", "%N|%T|%E").stdout
        rows = [line.split("|", 2) for line in out.splitlines() if line.count("|") == 2]
        return {node: (state, "" if reason == "none" else reason) for node, state, reason in rows}

    def nodes_responding(self, within: float = 45) -> dict[str, tuple[str, str]]:
        """``nodes_now`` once no state carries sinfo's `*` (slurmctld's last ping of the node
        failed: seen for a while on a host restarted earlier, never from a drain or resume),
        or after ``within`` seconds (SlurmdTimeout and a margin), whatever it says then."""
        deadline = time.monotonic() + within
        now = self.nodes_now()
        while any(s.endswith("*") for s, _ in now.values()) and time.monotonic() < deadline:
            time.sleep(1)
            now = self.nodes_now()
        return now

    def ssh(self, node: str, command: str) -> subprocess.CompletedProcess[str]:
        return ssh(self.key_file, self.known_hosts, self.ports[node], command)


def slurm_lab_up(name: str, hosts: int) -> SlurmLab:
    """`umprov lab up --slurm` (idempotent: completes a lab of that name left from before)."""
    from click.testing import CliRunner

    from tests.conftest import _Boundary

    up = CliRunner().invoke(_Boundary("umprov"), ["lab", "up", "--slurm", "--name", name,
                                                  "--hosts", str(hosts), "--json"],
                            catch_exceptions=False)
    assert up.exit_code == 0, up.stderr[-3000:]
    return SlurmLab(json.loads(up.stdout))


@pytest.fixture(scope="module")
def slurm_lab(request: pytest.FixtureRequest) -> Iterator[SlurmLab]:
    """One Slurm lab for the module: its name from the module's SLURM_LAB (default
    "pytest-slurm", with UMPROV_TEST_LAB_PREFIX), its size from SLURM_HOSTS (default 4), its
    hosts' engines holding the lab image if SLURM_SEED_ENGINES.
    Taken down afterwards unless UMPROV_KEEP_LAB=1 (then a re-run completes it: faster)."""
    from click.testing import CliRunner

    from tests.conftest import _Boundary

    name = lab_name(getattr(request.module, "SLURM_LAB", "pytest-slurm"))
    hosts = getattr(request.module, "SLURM_HOSTS", 4)
    clear_lab(name)
    if getattr(request.module, "SLURM_SEED_ENGINES", False):  # see engine_seed
        seed_engines(request.getfixturevalue("engine_seed"), name, range(1, hosts + 1),
                     request.getfixturevalue("docker_host_image"))
    lab = slurm_lab_up(name, hosts)
    yield lab
    if not os.environ.get("UMPROV_KEEP_LAB"):
        CliRunner().invoke(_Boundary("umprov"), ["lab", "down", "--name", name],
                           catch_exceptions=False)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/lab/" in str(item.fspath):
            item.add_marker(pytest.mark.lab)


@pytest.fixture(scope="session", autouse=True)
def _project_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    mp = pytest.MonkeyPatch()
    mp.setenv("UMPROV_PROJECT_DIR", str(REPO))
    mp.setenv("UMPROV_STATE_DIR", str(tmp_path_factory.mktemp("state")))
    yield
    mp.undo()


@pytest.fixture(scope="session")
def docker_client():
    from umprov_lab.engine import docker_engine

    return docker_engine()


def ssh_command(key: Path, known_hosts: Path, port: int, user: str = "lab") -> list[str]:
    return [
        "ssh",
        "-i",
        str(key),
        "-p",
        str(port),
        "-o",
        f"UserKnownHostsFile={known_hosts}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "ConnectTimeout=10",
        f"{user}@127.0.0.1",
    ]


def ssh(key: Path, known_hosts: Path, port: int, command: str, user: str = "lab"):
    return subprocess.run(
        [*ssh_command(key, known_hosts, port, user), command],
        capture_output=True,
        text=True,
        timeout=60,
    )


# A test that signals umprov must not depend on how pytest was started: a shell starts
# background jobs with SIGINT ignored, nohup ignores SIGHUP, and both survive exec, so
# `nohup make test &` would turn the interrupt tests into runs that cannot be interrupted.
_DEFAULT_SIGNALS = (
    "import os, signal, sys\n"
    "for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):\n"
    "    signal.signal(s, signal.SIG_DFL)\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'umprov', *sys.argv[1:]])\n"
)


def umprov_argv(*args: str) -> list[str]:
    """argv for `python -m umprov ARGS` with SIGINT, SIGHUP and SIGTERM at their defaults."""
    import sys

    return [sys.executable, "-c", _DEFAULT_SIGNALS, *args]


def sigint_when(proc: subprocess.Popen, ready: Callable[[], bool], *, within: float,
                exit_within: float, what: str, then_s: float = 0.0) -> str:
    """Once ``ready()`` (asked while ``proc`` runs, for up to ``within`` s, and ``then_s`` s
    more), SIGINT to ``proc``; it must end with 130 within ``exit_within`` s (else it is killed).
    Returns its stderr."""
    import signal
    import time

    try:
        deadline = time.monotonic() + within
        while not ready():
            assert proc.poll() is None, f"umprov ended (code {proc.returncode}) before {what}"
            assert time.monotonic() < deadline, f"no {what} within {within:.0f} s"
            time.sleep(0.3)
        time.sleep(then_s)
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=exit_within)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-3000:]
    return err
