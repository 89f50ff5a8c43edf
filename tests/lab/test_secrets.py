"""Secrets sweep, trust and load (4 hosts), through the real `umprov` processes, one lab.

One lab (`secsweep`, 4 hosts) runs the flow `make demo` runs, each step a real `umprov` process
with a private UMPROV_STATE_DIR and canary secrets in its environment and on its command line
(`provision -e ansible_become_password=...`): lab up, inventory check, provision (the full
site.yml), lab image (skipped when the tag is already on the engine, as the image is the
same), deploy --push (hosts 1-3 already hold the image: tests/lab/conftest.py's engine_seed;
host 4 is sent it), a second deploy, status, status --connect and verify. stdout and stderr
of each are kept. The hosts start from the Docker-converged snapshot (tests/lab/conftest.py's
docker_host_image): the Docker role finds its work done, the other roles converge from scratch
(installing Docker from scratch is test_provision's and the snapshot's own run). The first
deploy and one status run with stderr on a pseudo-terminal, so what rich draws (live progress,
tables) is swept as well as the plain text that CI logs show (provision runs plain: that is
where failure messages are printed).

Then the real secret values are read: the lab's SSH private key, the lab hosts' private host
keys (through the local engine), each deployed container's private host key and each Jupyter
token (through the lab host), and the canaries. Each one, and every 24-character slice of it,
is searched with `grep -F` in every captured output, every file of the state dir (ansible-runner
artifacts, logs, known_hosts, ssh configs), the verify reports, `.lab/NAME` and the inventory,
and in `docker inspect`, `docker top` and `docker logs` of every deployed container. The only
hits allowed are the files whose job is to hold that secret (the key file, the token file, the
output of `status --connect`, which prints the token on purpose).

The load check rides on the same runs: each of the 4 hosts appears exactly once in the JSON and
in the summary table of provision and of deploy. The trust checks use the deployed containers:
the login user and the Jupyter server are not root; a container key replaced by umprov is
pinned again, a key changed behind umprov's back is refused by the printed OpenSSH login.

UMPROV_KEEP_LAB=1 leaves the lab up for the next run (provision and deploy then find nothing to
do, which still sweeps every output).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import select
import shlex
import stat
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.lab.conftest import (
    LAB_IMAGE_TAG,
    clear_lab,
    image_build_lock,
    lab_name,
    seed_engines,
    ssh,
)

pytestmark = [pytest.mark.lab, pytest.mark.cost(550)]

NAME = lab_name("secsweep")
HOSTS = 4
TAG = LAB_IMAGE_TAG
SLICE = 24
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[\]PX^_].*?(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")

# Canary secrets, new each run: in the environment of every command (names ansible-runner would
# record, were they passed on) and, for the sudo password, on provision's command line.
CANARIES = {
    "GITHUB_TOKEN": secrets.token_hex(20),
    "AWS_SECRET_ACCESS_KEY": secrets.token_urlsafe(30),
    "UMPROV_SWEEP_PASSWORD": secrets.token_urlsafe(24),
    "ANSIBLE_BECOME_PASSWORD": secrets.token_urlsafe(24),
}
BECOME_CANARY = secrets.token_urlsafe(24)


@dataclass
class Run:
    """One `umprov` process: its arguments, exit code, outputs and wall time."""

    label: str
    args: list[str]
    rc: int
    stdout: str
    stderr: str
    seconds: float
    tty: bool

    def json(self) -> Any:
        return json.loads(self.stdout)

    def explain(self) -> str:
        return f"umprov {' '.join(self.args)}: exit {self.rc}\n{plain(self.stderr)[-3000:]}"


@dataclass
class Flow:
    state: Path
    outputs: Path
    reports: Path
    lab: dict[str, Any]
    runs: dict[str, Run] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [h["name"] for h in self.lab["hosts"]]

    @property
    def key(self) -> Path:
        return Path(self.lab["key_file"])

    @property
    def known_hosts(self) -> Path:
        return Path(self.lab["known_hosts"])

    def port(self, host: str) -> int:
        return next(h["port"] for h in self.lab["hosts"] if h["name"] == host)

    def on_host(self, host: str, command: str) -> subprocess.CompletedProcess[str]:
        """A shell command on a lab host, over SSH with the lab's pinned host key."""
        return ssh(self.key, self.known_hosts, self.port(host), command)

    def umprov(self, label: str, *args: str, tty: bool = False, ok: tuple[int, ...] = (0,),
               extra_env: dict[str, str] | None = None) -> Run:
        run = umprov(self, label, *args, tty=tty, extra_env=extra_env)
        assert run.rc in ok, run.explain()
        return run


def plain(text: str) -> str:
    return ANSI.sub("", text).replace("\r", "")


def _env(flow: Flow, tty: bool, extra: dict[str, str] | None) -> dict[str, str]:
    env = dict(os.environ, UMPROV_STATE_DIR=str(flow.state), UMPROV_PROJECT_DIR=str(REPO),
               **CANARIES, **(extra or {}))
    env.pop("NO_COLOR", None)
    if tty:
        env.update(TERM="xterm-256color", COLUMNS="250", LINES="60")
    else:
        env.pop("COLUMNS", None)
    return env


def umprov(flow: Flow, label: str, *args: str, tty: bool = False,
           extra_env: dict[str, str] | None = None, timeout: float = 1200) -> Run:
    """Run `umprov ARGS` as its own process; with tty, stderr is a pseudo-terminal (rich draws)."""
    argv = [sys.executable, "-m", "umprov", *args]
    env = _env(flow, tty, extra_env)
    started = time.monotonic()
    if not tty:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO,
                              timeout=timeout, stdin=subprocess.DEVNULL)
        rc, out, err = done.returncode, done.stdout, done.stderr
    else:
        rc, out, err = _run_on_pty(argv, env, timeout)
    run = Run(label, list(args), rc, out, err, time.monotonic() - started, tty)
    base = flow.outputs / f"{len(flow.runs):02d}-{label}"
    base.with_suffix(".stdout").write_text(out)
    base.with_suffix(".stderr").write_text(err)
    flow.runs[label] = run
    return run


def _run_on_pty(argv: list[str], env: dict[str, str], timeout: float) -> tuple[int, str, str]:
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 60, 250, 0, 0))
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave,
                            env=env, cwd=REPO)
    os.close(slave)
    chunks: list[bytes] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            ready, _, _ = select.select([master], [], [], 0.2)
            if not ready:
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=5)  # a grandchild may hold the terminal: stop reading anyway
        stop.set()
        reader.join(timeout=5)
        os.close(master)
    return proc.returncode, out.decode(errors="replace"), b"".join(chunks).decode(errors="replace")


def summary_rows(text: str, title: str) -> list[str]:
    """The first cell of every row of the last table titled ``title...`` (plain or rich)."""
    text = plain(text)
    start = text.rfind(title)
    assert start >= 0, f"no summary titled {title!r} in:\n{text[-2000:]}"
    cells = []
    for line in text[start:].splitlines()[1:]:
        if "│" in line or "┃" in line:
            parts = re.split("[│┃]", line)
            cells.append(parts[1].strip() if len(parts) > 2 else "")
        elif line.strip() and not line.lstrip().startswith(("┏", "┡", "└", "━", "─")):
            cells.append(line.split()[0])
    return [c for c in cells if c]


# ---------------------------------------------------------------------------------------------
# The flow, once for the module


@pytest.fixture(scope="module")
def flow(tmp_path_factory: pytest.TempPathFactory, docker_host_image: str,
         engine_seed: str) -> Iterator[Flow]:
    state = tmp_path_factory.mktemp("secrets-state")
    state.chmod(0o700)
    outputs = tmp_path_factory.mktemp("secrets-outputs")
    reports = tmp_path_factory.mktemp("secrets-reports")
    f = Flow(state, outputs, reports, lab={})
    timings: dict[str, float] = {}
    # Hosts 1-3 start with the lab image in their engines; the last one is pushed to, so the
    # push's output is swept too (pushing to all four was most of this set-up's time).
    clear_lab(NAME)
    seed_engines(engine_seed, NAME, range(1, HOSTS), docker_host_image)
    try:
        up = f.umprov("lab-up", "lab", "up", "--hosts", str(HOSTS), "--name", NAME, "--json",
                      "--from-image", docker_host_image)
        f.lab = up.json()
        inv = f.lab["inventory"]
        pub = str(f.key.with_suffix(".pub"))
        f.umprov("inventory-check", "inventory", "check", inv)
        f.umprov("provision", "provision", inv, "--json", "-e",
                 f"ansible_become_password={BECOME_CANARY}")
        with image_build_lock():  # not beside another worker's build of the same tag
            if subprocess.run(["docker", "image", "inspect", TAG], capture_output=True).returncode:
                f.umprov("lab-image", "lab", "image", "--tag", TAG, "--json")
        f.umprov("deploy-push", "deploy", inv, "--push", "--image", TAG, "--authorized-key", pub,
                 "--json", tty=True)
        f.umprov("deploy-again", "deploy", inv, "--image", TAG, "--authorized-key", pub, "--json")
        f.umprov("status", "status", inv)
        f.umprov("status-json-tty", "status", inv, "--json", tty=True)
        for name in f.names:
            f.umprov(f"connect-{name}", "status", "--connect", name)
        f.umprov("verify", "verify", inv, "--json", "--junit", str(reports / "verify.xml"),
                 "--prometheus", str(reports / "prom"), ok=(13,))
        timings = {label: round(run.seconds, 1) for label, run in f.runs.items()}
        (outputs / "timings.json").write_text(json.dumps(timings, indent=2))
        print(f"\nsecrets flow, seconds per command: {timings}")
        yield f
    finally:
        if not os.environ.get("UMPROV_KEEP_LAB"):
            subprocess.run([sys.executable, "-m", "umprov", "lab", "down", "--name", NAME],
                           capture_output=True, env=_env(f, False, None), cwd=REPO, timeout=300)


# ---------------------------------------------------------------------------------------------
# Load: every host exactly once


def test_provision_reports_every_host_exactly_once(flow: Flow) -> None:
    run = flow.runs["provision"]
    data = run.json()
    assert Counter(h["host"] for h in data["hosts"]) == Counter(flow.names)
    assert data["exit_code"] == 0
    assert all(h["status"] in ("ok", "changed") and not h["failed"] for h in data["hosts"])
    rows = summary_rows(run.stderr, "provision: ")
    assert [r for r in rows if r.startswith("lab-")] == sorted(flow.names), rows


def test_deploy_reports_every_host_exactly_once(flow: Flow) -> None:
    for label, wanted in (("deploy-push", {"created", "replaced", "unchanged"}),
                          ("deploy-again", {"unchanged"})):
        run = flow.runs[label]
        data = run.json()
        assert Counter(h["host"] for h in data["hosts"]) == Counter(flow.names), label
        assert all(h["ok"] and h["status"] in wanted for h in data["hosts"]), data["hosts"]
        rows = summary_rows(run.stderr, f"deploy: {HOSTS} host(s) in")
        assert [r for r in rows if r.startswith("lab-")] == flow.names, (label, rows)
    status = flow.runs["status-json-tty"].json()["hosts"]
    assert Counter(r["host"] for r in status) == Counter(flow.names)
    assert all(r["state"] == "running" and r["jupyter"] for r in status), status


# ---------------------------------------------------------------------------------------------
# Secrets


@dataclass
class Secret:
    label: str
    value: str
    needles: set[str]


def _slices(text: str) -> set[str]:
    text = text.strip()
    if len(text) <= SLICE:
        return {text} if text else set()
    return {text[i:i + SLICE] for i in range(len(text) - SLICE + 1)}


def _int_bytes(value: int) -> bytes:
    return value.to_bytes((value.bit_length() + 7) // 8, "big")


def key_secret(label: str, private_pem: str, public_texts: list[str]) -> Secret:
    """A private key file: its base64 body (lines and joined), the raw private bytes as base64
    and hex; slices that also occur in public material (the public key is inside) are left out."""
    import base64

    from cryptography.hazmat.primitives import serialization

    lines = [ln.strip() for ln in private_pem.splitlines()
             if ln.strip() and not ln.startswith("-----")]
    needles = set().union(*(_slices(ln) for ln in lines), _slices("".join(lines)))
    key = serialization.load_ssh_private_key(private_pem.encode(), password=None)
    numbers = key.private_numbers() if hasattr(key, "private_numbers") else None
    if numbers is not None and hasattr(numbers, "d"):  # RSA
        raw = [_int_bytes(numbers.d), _int_bytes(numbers.p), _int_bytes(numbers.q)]
    elif numbers is not None:  # ECDSA
        raw = [_int_bytes(numbers.private_value)]
    else:  # Ed25519
        raw = [key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                 serialization.NoEncryption())]
    for blob in raw:
        needles |= _slices(base64.b64encode(blob).decode()) | _slices(blob.hex())
    public = "\n".join(public_texts)
    needles = {n for n in needles if n not in public}
    return Secret(label, "".join(lines), needles)


def _cat(container: Any, path: str) -> tuple[int, str]:
    """`cat PATH` on a lab host through the local engine. An empty answer with exit 0 is asked
    again: docker exec has returned nothing under load (lab/umprov_lab/hosts.py's host_keys)."""
    for attempt in range(3):
        rc, out = container.exec_run(["cat", path])
        if rc != 0 or out.strip():
            break
        time.sleep(0.5 * (attempt + 1))
    return rc, out.decode()


def _lab_host_private_keys(flow: Flow) -> list[Secret]:
    from umprov_lab.engine import docker_engine

    client = docker_engine(start=False)
    found = []
    public = [flow.known_hosts.read_text()]
    for name in flow.names:
        container = client.containers.get(f"umprov-{name}")
        for kind in ("ed25519", "ecdsa", "rsa"):
            rc, key = _cat(container, f"/etc/ssh/ssh_host_{kind}_key")
            if rc == 0:
                _, pub = _cat(container, f"/etc/ssh/ssh_host_{kind}_key.pub")
                found.append(key_secret(f"host-key:{name}:{kind}", key, [*public, pub]))
    return found


def _container_secrets(flow: Flow) -> list[Secret]:
    found = []
    for name in flow.names:
        key = flow.on_host(name, "docker exec umprov cat /etc/ssh/keys/ssh_host_ed25519_key")
        assert key.returncode == 0, key.stderr
        pub = flow.on_host(name, "docker exec umprov cat /etc/ssh/keys/ssh_host_ed25519_key.pub")
        found.append(key_secret(f"container-key:{name}", key.stdout,
                                [pub.stdout, (flow.state / "known_hosts").read_text()]))
        token = flow.on_host(name, "docker exec umprov cat /etc/umprov/jupyter_token")
        assert token.returncode == 0 and len(token.stdout.strip()) >= 32, token.stderr
        stored = (flow.state / "tokens" / f"{name}.token").read_text().strip()
        assert stored == token.stdout.strip()
        found.append(Secret(f"token:{name}", stored, _slices(stored)))
    return found


@pytest.fixture(scope="module")
def secrets_found(flow: Flow) -> list[Secret]:
    found = [key_secret("lab-key", flow.key.read_text(), [flow.key.with_suffix(".pub").read_text()])]
    found += _lab_host_private_keys(flow)
    found += _container_secrets(flow)
    for var, value in {**CANARIES, "-e ansible_become_password": BECOME_CANARY}.items():
        found.append(Secret(f"canary:{var}", value, _slices(value)))
    assert all(s.needles for s in found)
    return found


@pytest.fixture(scope="module")
def container_views(flow: Flow) -> Path:
    """docker inspect, docker top and docker logs of each deployed container, as files."""
    views = flow.outputs / "containers"
    views.mkdir()
    for name in flow.names:
        for view, command in (
            ("inspect.json", "docker inspect umprov"),
            ("top.txt", "docker top umprov -eo uid,user,pid,args"),
            ("logs.txt", "docker logs umprov 2>&1"),
            ("env.txt", "docker exec umprov sh -c 'cat /proc/1/environ | tr \"\\0\" \"\\n\"'"),
            # Every process of the container: Jupyter, its kernels, sshd, the entrypoint.
            ("environs.txt", "docker exec -u root umprov sh -c "
             "'for e in /proc/[0-9]*/environ; do tr \"\\0\" \"\\n\" 2>/dev/null < $e; done; true'"),
        ):
            done = flow.on_host(name, command)
            assert done.returncode == 0, (name, view, done.stderr)
            (views / f"{name}-{view}").write_text(done.stdout)
    return views


def _allowed(path: Path, label: str, flow: Flow) -> bool:
    """The files whose job is to hold that secret."""
    if label == "lab-key":
        return path == flow.key
    if label.startswith("token:"):
        host = label.split(":", 1)[1]
        return path in (flow.state / "tokens" / f"{host}.token",
                        *flow.outputs.glob(f"*-connect-{host}.stdout"))
    return False


def grep_hits(roots: list[Path], found: list[Secret], work: Path) -> list[tuple[Path, str, str]]:
    """(file, secret label, matched text) for every needle found under the roots (grep -F)."""
    owner: dict[str, str] = {}
    for s in found:
        for needle in s.needles:
            owner.setdefault(needle, s.label)
    patterns = work / "needles.txt"
    patterns.write_text("\n".join(sorted(owner)) + "\n")
    hits = []
    for root in roots:
        done = subprocess.run(
            ["grep", "-r", "-a", "-o", "-H", "-Z", "-F", "-D", "skip", "-f", str(patterns),
             str(root)], capture_output=True, timeout=600,
        )
        assert done.returncode in (0, 1), done.stderr
        for line in done.stdout.decode(errors="replace").splitlines():
            path, _, text = line.partition("\0")
            hits.append((Path(path), owner.get(text, "?"), text))
    return hits


def test_no_secret_in_any_output_log_artifact_or_report(
    flow: Flow, secrets_found: list[Secret], container_views: Path, tmp_path: Path
) -> None:
    lab_dir = REPO / ".lab" / NAME
    runs = list((flow.state / "runs").glob("provision-*/artifacts/*/job_events"))
    assert runs, "no ansible-runner artifacts to sweep"
    roots = [flow.outputs, flow.state, flow.reports, lab_dir, Path(flow.lab["inventory"])]
    hits = grep_hits(roots, secrets_found, tmp_path)
    leaks = sorted({(str(p), label) for p, label, _ in hits if not _allowed(p, label, flow)})
    assert not leaks, "secrets found:\n" + "\n".join(f"{label}: {p}" for p, label in leaks)
    # The sweep sees the secrets where they belong: the needles and the grep work.
    seen = {(p, label) for p, label, _ in hits}
    assert (flow.key, "lab-key") in seen
    for name in flow.names:
        assert (flow.state / "tokens" / f"{name}.token", f"token:{name}") in seen
        connect = next(flow.outputs.glob(f"*-connect-{name}.stdout"))
        assert (connect, f"token:{name}") in seen
    swept = sum(1 for root in roots for p in ([root] if root.is_file() else root.rglob("*"))
                if p.is_file())
    kinds = Counter(s.label.split(":")[0] for s in secrets_found)
    print(f"\nswept {swept} files for {len(secrets_found)} secrets {dict(kinds)}: "
          f"{len(leaks)} found outside their own files")


def test_no_password_exists_to_leak(flow: Flow) -> None:
    """The lab has no password: `lab` is locked, sudo needs none, the inventory names none."""
    inventory = Path(flow.lab["inventory"]).read_text().lower()
    assert "pass" not in inventory
    shadow = flow.on_host(flow.names[0], "sudo -n getent shadow lab root")
    assert shadow.returncode == 0, shadow.stderr
    for line in shadow.stdout.splitlines():
        assert line.split(":")[1].startswith(("!", "*")), line.split(":")[0]


def test_token_not_in_container_config_command_line_or_logs(
    flow: Flow, container_views: Path
) -> None:
    for name in flow.names:
        token = (flow.state / "tokens" / f"{name}.token").read_text().strip()
        inspect = json.loads((container_views / f"{name}-inspect.json").read_text())[0]
        config = inspect["Config"]
        assert not any(e.startswith("JUPYTER_TOKEN=") for e in config["Env"])
        assert "JUPYTER_TOKEN_FILE=/etc/umprov/jupyter_token" in config["Env"]
        for part in (config["Env"], config["Labels"], config["Cmd"], config["Entrypoint"],
                     inspect["Args"], inspect["Path"]):
            assert token not in json.dumps(part)
        for view in ("top.txt", "logs.txt", "env.txt", "environs.txt"):
            assert token not in (container_views / f"{name}-{view}").read_text(), view


def test_token_files_private(flow: Flow) -> None:
    def mode(path: Path) -> int:
        return stat.S_IMODE(path.stat().st_mode)

    assert mode(flow.state) == 0o700
    assert mode(flow.state / "tokens") == 0o700
    for name in flow.names:
        assert mode(flow.state / "tokens" / f"{name}.token") == 0o600
    assert mode(flow.state / "known_hosts") == 0o600
    for conf in (flow.state / "ssh").iterdir():
        assert mode(conf) == 0o600, conf
    for run in (flow.state / "runs").iterdir():
        assert mode(run) & 0o077 == 0, run
    assert mode(flow.state / "runs") == 0o700
    assert mode(REPO / ".lab" / NAME) == 0o700 and mode(flow.key) == 0o600


# ---------------------------------------------------------------------------------------------
# Trust


def _login(flow: Flow, host: str) -> list[str]:
    """The OpenSSH login `status --connect` printed (its first line), never asking anything."""
    line = flow.runs[f"connect-{host}"].stdout.splitlines()[0]
    argv = shlex.split(line)
    assert argv[:2] == ["ssh", "-F"], line
    return [*argv[:-1], "-o", "BatchMode=yes", "-o", "ConnectTimeout=15", argv[-1]]


def login(flow: Flow, host: str, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*_login(flow, host), command], capture_output=True, text=True,
                          timeout=90)


def test_container_login_user_and_jupyter_are_not_root(flow: Flow, container_views: Path) -> None:
    for name in flow.names:
        done = login(flow, name, "id -u; id -un")
        assert done.returncode == 0, done.stderr
        uid, user = done.stdout.split()
        assert int(uid) != 0 and user == "umprov"
        top = (container_views / f"{name}-top.txt").read_text().splitlines()
        jupyter = [ln.split() for ln in top[1:] if "jupyter" in ln]
        assert jupyter, top
        assert all(cols[0] == uid and cols[1] != "root" for cols in jupyter), jupyter


def _pinned(flow: Flow, host: str) -> list[str]:
    alias = f"umprov-{host}"
    return [ln.split(" ", 1)[1] for ln in (flow.state / "known_hosts").read_text().splitlines()
            if alias in ln.split(" ", 1)[0].split(",")]


def _wait_healthy(flow: Flow, host: str) -> None:
    deadline = time.monotonic() + 120
    while flow.on_host(host, "docker exec umprov /usr/local/bin/umprov-healthcheck").returncode:
        assert time.monotonic() < deadline, f"{host}: the container did not come back"
        time.sleep(1)


def test_container_replaced_by_umprov_with_a_new_key_is_pinned_again(flow: Flow) -> None:
    host = flow.names[1]
    before = _pinned(flow, host)
    assert len(before) == 1
    # A lost key volume: the replacement generates a new key, which umprov reads and pins.
    gone = flow.on_host(host, "docker exec umprov rm -f /etc/ssh/keys/ssh_host_ed25519_key "
                              "/etc/ssh/keys/ssh_host_ed25519_key.pub")
    assert gone.returncode == 0, gone.stderr
    run = flow.umprov("deploy-force", "deploy", flow.lab["inventory"], "--limit", host, "--force",
                      "--image", TAG, "--authorized-key", str(flow.key.with_suffix(".pub")),
                      "--json")
    assert run.json()["hosts"][0]["status"] == "replaced"
    after = _pinned(flow, host)
    assert len(after) == 1 and after != before
    live = flow.on_host(host, "docker exec umprov cat /etc/ssh/keys/ssh_host_ed25519_key.pub")
    assert after[0].split()[1] == live.stdout.split()[1]
    flow.umprov(f"connect-{host}", "status", "--connect", host)  # the new token
    done = login(flow, host, "id -un")
    assert done.returncode == 0 and done.stdout.strip() == "umprov", done.stderr


def test_container_key_changed_behind_umprovs_back_is_refused(flow: Flow) -> None:
    host = flow.names[0]
    pinned = _pinned(flow, host)
    keys = "/etc/ssh/keys/ssh_host_ed25519_key"
    swap = flow.on_host(host, f"docker exec umprov sh -c 'rm -f {keys} {keys}.pub && "
                              f"ssh-keygen -q -t ed25519 -N \"\" -C intruder -f {keys}' && "
                              "docker restart -t 5 umprov >/dev/null")
    assert swap.returncode == 0, swap.stderr
    _wait_healthy(flow, host)
    refused = login(flow, host, "true")
    assert refused.returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in refused.stderr, refused.stderr
    assert "Host key verification failed" in refused.stderr
    assert _pinned(flow, host) == pinned  # status --connect and the login change nothing
    # A deploy reads the key through Docker over the verified host connection, the source of
    # truth, and pins it again, saying so.
    run = flow.umprov("deploy-repin", "deploy", flow.lab["inventory"], "--limit", host,
                      "--image", TAG, "--authorized-key", str(flow.key.with_suffix(".pub")),
                      "--json")
    result = run.json()["hosts"][0]
    assert result["status"] == "unchanged"
    assert "host key changed" in result["message"], result
    assert _pinned(flow, host) != pinned
    done = login(flow, host, "true")
    assert done.returncode == 0, done.stderr
