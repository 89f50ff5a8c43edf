"""`umprov deploy`: the PyTorch container on every host, over the docker SDK and verified SSH.

The flow, in three phases so one host's trouble never stops the others:

1. connect (in parallel): a docker client per host over ``umprov.ssh.docker_client`` (verified
   host key), and whether the host already has the image (by image ID);
2. deliver: ``--pull`` pulls on each host; ``--push`` streams ONE local ``docker save`` to every
   host that lacks the image, each into its engine's ``docker load`` (hosts that have the image
   ID are skipped);
3. roll out (in parallel): build the container spec, compare its hash with the running
   container's label; same hash: nothing happens (same container ID); otherwise the container
   is replaced (the old one is kept aside until the new one starts, and put back if it does
   not). After start: wait until sshd and Jupyter answer, read the container's SSH host key
   through Docker and pin it in umprov's known_hosts, store the Jupyter token (0600).

The container spec (``container_spec``) is plain data; ``spec_hash`` hashes it canonically and
``create_kwargs`` turns it into docker SDK arguments. Secrets (the Jupyter token) are never in
the spec, the labels, the environment or any log: the token goes into the container as a file
(put_archive before start) and onto the control machine under state_dir()/tokens.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import ipaddress
import json
import queue
import re
import secrets
import tarfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from umprov import __version__
from umprov.errors import ConfigError, ExitCode, TrustError, UmprovError
from umprov.paths import state_dir, write_atomic, write_private
from umprov.ssh import (
    AuthFailed,
    EngineDown,
    HostLike,
    Unreachable,
    host_pattern,
    known_hosts_files,
    pin_host_key,
    umprov_known_hosts,
)

SPEC_VERSION = 1  # bump when the spec's shape changes (every container is then replaced)
LABEL = "org.umprov"
DEFAULT_NAME = "umprov"
DEFAULT_SSH_PORT = 2222
DEFAULT_JUPYTER_PORT = 8888
DEFAULT_BIND = "127.0.0.1"
DEFAULT_SHM = "16g"
CONTAINER_SSH_PORT = 22
CONTAINER_JUPYTER_PORT = 8888
TOKEN_PATH = "/etc/umprov/jupyter_token"  # noqa: S105 (a path, not a secret)
READY_TIMEOUT = 120.0
PUSH_CHUNK = 1 << 20

Progress = Callable[[str, str], None]  # (host name, message)


def _quiet(_host: str, _msg: str) -> None:
    pass


class DeployFailed(UmprovError):
    exit_code = ExitCode.HOSTS_FAILED


# ---------------------------------------------------------------------------------------------
# Options


def parse_gpus(value: str) -> str | list[str]:
    """'all', 'none', or a list of GPU indexes / UUIDs ('0,1', 'GPU-3f2a...')."""
    text = str(value).strip().lower()
    if text in ("all", "none"):
        return text
    items = [i.strip() for i in str(value).split(",") if i.strip()]
    if not items:
        raise ConfigError("--gpus is empty: use all, none, or a list such as 0,1")
    for item in items:
        if not (
            (item.isascii() and item.isdigit() and len(item) <= 4)
            or re.fullmatch(r"(GPU|MIG)-[0-9A-Za-z-]+", item, re.ASCII)
        ):
            raise ConfigError(
                f"--gpus: '{item}' is not a GPU index or UUID (use all, none, or e.g. 0,1)"
            )
    if len(set(items)) != len(items):
        raise ConfigError(f"--gpus lists a GPU twice: {value}")
    return items


def check_port(value: Any, what: str) -> int:
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ConfigError(f"{what} must be a port number, not {value!r}")
    try:
        port = int(value.strip() if isinstance(value, str) else value)
        if isinstance(value, str) and not (value.strip().isascii() and len(value) < 20):
            raise ValueError(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{what} must be a port number, not {value!r:.40}") from None
    if not 1 <= port <= 65535:
        shown = port if abs(port) < 10**20 else "a larger number"
        raise ConfigError(f"{what} must be from 1 to 65535, not {shown}")
    return port


# Docker's image reference grammar (distribution/reference): [domain[:port]/]path[:tag][@digest].
_IMAGE_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_DOMAIN = (
    r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*"
    r"(?::[0-9]+)?"
)
_IMAGE_REF = re.compile(
    rf"(?:{_IMAGE_DOMAIN}/)?{_IMAGE_COMPONENT}(?:/{_IMAGE_COMPONENT})*"
    r"(?::[\w][\w.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?",
    re.ASCII,
)


def check_image(value: str, what: str = "--image") -> str:
    """An image reference Docker accepts (name[:tag][@digest]) or an image ID (sha256:...)."""
    text = str(value).strip()
    if not text:
        raise ConfigError(f"{what} is empty: give an image such as umprov/pytorch-cuda:0.1.0")
    if len(text) > 512 or not (
        _IMAGE_REF.fullmatch(text) or re.fullmatch(r"sha256:[0-9a-f]{64}", text)
    ):
        raise ConfigError(
            f"{what}: {text[:80]!r} is not an image reference (e.g. umprov/pytorch-cuda:0.1.0)"
        )
    return text


def check_bind(value: str) -> str:
    try:
        return str(ipaddress.ip_address(value.strip("[]")))
    except ValueError:
        raise ConfigError(f"--bind must be an IP address (e.g. 127.0.0.1), not {value!r}") from None


def is_loopback(bind: str) -> bool:
    return ipaddress.ip_address(bind).is_loopback


def check_public_key(text: str, source: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    if not lines:
        raise ConfigError(f"{source} holds no public key")
    for line in lines:
        if not re.match(r"^(ssh-(ed25519|rsa|dss)|ecdsa-sha2-\S+|sk-\S+) [A-Za-z0-9+/=]+", line):
            if "PRIVATE KEY" in text:
                raise ConfigError(f"{source} is a private key: pass the .pub file")
            raise ConfigError(f"{source} is not an SSH public key")
    return "\n".join(lines)


def default_public_key() -> Path:
    for name in ("id_ed25519.pub", "id_ecdsa.pub", "id_rsa.pub"):
        path = Path.home() / ".ssh" / name
        if path.is_file():
            return path
    raise ConfigError(
        "no public key found in ~/.ssh (id_ed25519.pub, id_ecdsa.pub, id_rsa.pub): "
        "pass --authorized-key FILE"
    )


@dataclass(frozen=True)
class DeployOptions:
    """What the command line said; None means: the host's variable, else the default."""

    image: str | None = None
    delivery: str = "none"  # none | pull | push
    gpus: str | None = None
    ssh_port: int | None = None
    jupyter_port: int | None = None
    bind: str | None = None
    name: str | None = None
    authorized_keys: str = ""
    identity_file: str | None = None  # the private half, for the ssh config we write
    shm_size: str = DEFAULT_SHM
    force: bool = False
    trust_new: bool = False


@dataclass(frozen=True)
class HostSettings:
    """The options as they apply to one host (command line > host variables > defaults)."""

    image: str
    gpus: str | list[str]
    ssh_port: int
    jupyter_port: int
    bind: str
    name: str
    # Lab hosts run without CAP_SYS_RESOURCE, so no container on them may raise memlock or
    # stack limits: the spec then leaves the engine's defaults (said in the lab docs).
    raise_limits: bool = True


def settings_for(host: HostLike, opts: DeployOptions) -> HostSettings:
    hv: Mapping[str, Any] = getattr(host, "vars", {}) or {}
    image = opts.image or hv.get("umprov_image")
    if not image:
        raise ConfigError(f"{host.name}: no image: pass --image or set umprov_image")
    if not (isinstance(image, str) and "{{" in image):
        check_image(image, "--image" if opts.image else f"{host.name}: umprov_image")
    ssh_port = check_port(
        opts.ssh_port or hv.get("umprov_ssh_port") or DEFAULT_SSH_PORT, "--ssh-port"
    )
    jupyter_port = check_port(
        opts.jupyter_port or hv.get("umprov_jupyter_port") or DEFAULT_JUPYTER_PORT, "--jupyter-port"
    )
    if ssh_port == jupyter_port:
        raise ConfigError(f"{host.name}: --ssh-port and --jupyter-port are both {ssh_port}")
    bind = check_bind(opts.bind or str(hv.get("umprov_bind") or DEFAULT_BIND))
    gpus = parse_gpus(opts.gpus or str(hv.get("umprov_gpus") or "all"))
    name = opts.name or str(hv.get("umprov_container_name") or DEFAULT_NAME)
    if not re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*", name):
        raise ConfigError(f"{host.name}: container name {name!r} is not valid")
    raise_limits = not bool(hv.get("umprov_lab"))
    return HostSettings(str(image), gpus, ssh_port, jupyter_port, bind, name, raise_limits)


# ---------------------------------------------------------------------------------------------
# The container spec


def container_spec(
    settings: HostSettings, image_id: str, authorized_keys: str, *, shm_size: str = DEFAULT_SHM
) -> dict[str, Any]:
    """Everything that defines the container, as plain JSON-able data (no secrets)."""
    spec: dict[str, Any] = {
        "spec_version": SPEC_VERSION,
        "name": settings.name,
        "image_id": image_id,
        "environment": {
            "SSH_AUTHORIZED_KEYS": authorized_keys,
            "JUPYTER_IP": "0.0.0.0",  # noqa: S104 (inside the container; see ports)
            "JUPYTER_PORT": str(CONTAINER_JUPYTER_PORT),
            "JUPYTER_TOKEN_FILE": TOKEN_PATH,
        },
        "ports": {
            f"{CONTAINER_SSH_PORT}/tcp": [settings.bind, settings.ssh_port],
            f"{CONTAINER_JUPYTER_PORT}/tcp": [settings.bind, settings.jupyter_port],
        },
        "volumes": {
            f"{settings.name}-workspace": "/workspace",
            f"{settings.name}-ssh-keys": "/etc/ssh/keys",
        },
        # NCCL: a large /dev/shm for its shared-memory transport (the container keeps its own
        # IPC namespace), unlimited locked memory for pinned buffers, a bigger stack.
        "shm_size": shm_size,
        "ulimits": (
            {"memlock": [-1, -1], "stack": [67108864, 67108864]} if settings.raise_limits else {}
        ),
        "restart_policy": "unless-stopped",
        "gpus": settings.gpus,
    }
    return spec


def spec_hash(spec: Mapping[str, Any]) -> str:
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def labels_for(spec: Mapping[str, Any], image_ref: str) -> dict[str, str]:
    return {
        f"{LABEL}.managed": "true",
        f"{LABEL}.version": __version__,
        f"{LABEL}.spec-hash": spec_hash(spec),
        f"{LABEL}.image": image_ref,
    }


def create_kwargs(spec: Mapping[str, Any], labels: Mapping[str, str]) -> dict[str, Any]:
    """docker SDK ``containers.create`` arguments for a spec."""
    from docker.types import DeviceRequest, Ulimit

    kwargs: dict[str, Any] = {
        "image": spec["image_id"],
        "name": spec["name"],
        "detach": True,
        "environment": dict(spec["environment"]),
        "ports": {port: tuple(bind) for port, bind in spec["ports"].items()},
        "volumes": {vol: {"bind": path, "mode": "rw"} for vol, path in spec["volumes"].items()},
        "shm_size": spec["shm_size"],
        "ulimits": [Ulimit(name=n, soft=s, hard=h) for n, (s, h) in spec["ulimits"].items()],
        "restart_policy": {"Name": spec["restart_policy"]},
        "labels": dict(labels),
    }
    gpus = spec["gpus"]
    if gpus != "none":
        kwargs["runtime"] = "nvidia"
        if gpus == "all":
            kwargs["device_requests"] = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
        else:
            kwargs["device_requests"] = [
                DeviceRequest(device_ids=list(gpus), capabilities=[["gpu"]])
            ]
    return kwargs


# ---------------------------------------------------------------------------------------------
# Results


@dataclass
class HostResult:
    host: str
    status: str = "pending"  # created, unchanged, replaced, started, failed, unreachable, untrusted
    message: str = ""
    container_id: str | None = None
    image_id: str | None = None
    ssh: str | None = None
    jupyter: str | None = None
    pushed_bytes: int = 0
    push_seconds: float = 0.0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status in ("created", "unchanged", "replaced", "started")

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "ok": self.ok,
            "status": self.status,
            "message": self.message,
            "container_id": self.container_id,
            "image_id": self.image_id,
            "ssh": self.ssh,
            "jupyter": self.jupyter,
            "pushed_bytes": self.pushed_bytes,
            "push_seconds": round(self.push_seconds, 2),
            "seconds": round(self.seconds, 2),
        }


def exit_code(results: list[HostResult]) -> ExitCode:
    statuses = {r.status for r in results if not r.ok}
    if not statuses:
        return ExitCode.OK
    if statuses - {"unreachable", "untrusted"}:
        return ExitCode.HOSTS_FAILED
    if "untrusted" in statuses:
        return ExitCode.TRUST
    return ExitCode.HOSTS_UNREACHABLE


def _fail(result: HostResult, exc: BaseException) -> None:
    if isinstance(exc, Unreachable):
        result.status = "unreachable"
    elif isinstance(exc, TrustError):
        result.status = "untrusted"
    else:
        result.status = "failed"
    result.message = str(exc) if isinstance(exc, UmprovError) else _docker_message(exc)


def _docker_message(exc: BaseException) -> str:
    explanation = getattr(exc, "explanation", None)
    text = " ".join(str(explanation or exc).split())
    return text[:300] or type(exc).__name__


# ---------------------------------------------------------------------------------------------
# Image delivery


class _Broadcast:
    """One producer (a local docker save), many consumers (each host's docker load).

    Bounded queues: the stream goes at the pace of the slowest live host; a host whose load
    fails is dropped and the others go on.
    """

    def __init__(self, hosts: list[str], depth: int = 16) -> None:
        self.queues: dict[str, queue.Queue[bytes | None]] = {
            h: queue.Queue(maxsize=depth) for h in hosts
        }
        self.dead: set[str] = set()
        self.error: BaseException | None = None
        self.lock = threading.Lock()

    def produce(self, chunks: Iterator[bytes]) -> None:
        try:
            for chunk in chunks:
                self._put_all(chunk)
        except BaseException as exc:  # noqa: BLE001 - handed to every consumer
            self.error = exc
        finally:
            self._put_all(None)

    def _put_all(self, item: bytes | None) -> None:
        for host, q in self.queues.items():
            while host not in self.dead:
                try:
                    q.put(item, timeout=0.5)
                    break
                except queue.Full:
                    continue

    def drop(self, host: str) -> None:
        with self.lock:
            self.dead.add(host)
        q = self.queues[host]
        with contextlib.suppress(queue.Empty):
            while True:
                q.get_nowait()

    def consume(self, host: str, counter: list[int]) -> Iterator[bytes]:
        q = self.queues[host]
        while True:
            item = q.get()
            if item is None:
                if self.error is not None:
                    raise UmprovError(f"docker save failed: {_docker_message(self.error)}")
                return
            counter[0] += len(item)
            yield item


def _load_into(client: Any, data: Iterator[bytes]) -> None:
    """docker load on the host's engine from a stream of tar chunks."""
    from docker.errors import APIError

    try:
        for chunk in client.api.load_image(data):
            if isinstance(chunk, dict) and chunk.get("error"):
                raise UmprovError(f"docker load failed: {chunk['error']}")
    except APIError as exc:
        raise UmprovError(f"docker load failed: {_docker_message(exc)}") from None


# ---------------------------------------------------------------------------------------------
# Per-host state kept on the control machine


def token_path(host_name: str) -> Path:
    return state_dir() / "tokens" / f"{host_name}.token"


def ssh_config_path(host_name: str) -> Path:
    return state_dir() / "ssh" / f"{host_name}.conf"


def container_alias(host_name: str) -> str:
    return f"umprov-{host_name}"


def jump_alias(host_name: str) -> str:
    return f"umprov-{host_name}-host"


def container_address(host: HostLike, settings: HostSettings) -> tuple[str, bool]:
    """(address the published ports are reached at, whether through the host via SSH)."""
    if is_loopback(settings.bind):
        return settings.bind, True
    if ipaddress.ip_address(settings.bind).is_unspecified:
        return host.address, False
    return settings.bind, False


def key_patterns(host: HostLike, settings: HostSettings) -> list[str]:
    """Names the container's host key is pinned under: the alias, and its real address when
    that address means the same container from anywhere (not a host's loopback)."""
    address, via_host = container_address(host, settings)
    patterns = [container_alias(host.name)]
    if not via_host:
        patterns.append(host_pattern(address, settings.ssh_port))
    return patterns


def render_ssh_config(
    host: HostLike, settings: HostSettings, login_user: str, identity_file: str | None
) -> str:
    """An ssh_config for `ssh -F FILE umprov-HOST`, checking keys exactly as umprov does."""
    address, via_host = container_address(host, settings)
    alias = container_alias(host.name)
    lines = [
        f"# Written by `umprov deploy` for host {host.name}; `umprov status --connect {host.name}`",
        f"Host {alias}",
        f"  HostName {address}",
        f"  Port {settings.ssh_port}",
        f"  User {login_user}",
        f"  HostKeyAlias {alias}",
        f"  UserKnownHostsFile {umprov_known_hosts()}",
        "  StrictHostKeyChecking yes",
        "  UpdateHostKeys no",
    ]
    if identity_file:
        lines += [f"  IdentityFile {identity_file}", "  IdentitiesOnly yes"]
    if via_host:
        lines.append(f"  ProxyJump {jump_alias(host.name)}")
        files = " ".join(str(p) for p in known_hosts_files(host))
        lines += [
            "",
            f"Host {jump_alias(host.name)}",
            f"  HostName {host.address}",
            f"  Port {host.port}",
        ]
        if host.user:
            lines.append(f"  User {host.user}")
        if host.key_file:
            lines += [f"  IdentityFile {host.key_file}", "  IdentitiesOnly yes"]
        lines += [
            f"  UserKnownHostsFile {files}",
            "  StrictHostKeyChecking yes",
            "  UpdateHostKeys no",
        ]
    return "\n".join(lines) + "\n"


def record_connection(
    host: HostLike, settings: HostSettings, login_user: str, identity_file: str | None
) -> dict[str, Any]:
    """What `status --connect` needs, without the token (that stays in its own 0600 file)."""
    address, via_host = container_address(host, settings)
    data = {
        "host": host.name,
        "container": settings.name,
        "user": login_user,
        "address": address,
        "ssh_port": settings.ssh_port,
        "jupyter_port": settings.jupyter_port,
        "via_host": via_host,
        "ssh_config": str(ssh_config_path(host.name)),
        "alias": container_alias(host.name),
        "jump_alias": jump_alias(host.name) if via_host else None,
    }
    write_atomic(
        state_dir() / "connections" / f"{host.name}.json", json.dumps(data, indent=2), 0o600
    )
    return data


def load_connection(host_name: str) -> dict[str, Any] | None:
    path = state_dir() / "connections" / f"{host_name}.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text())


# ---------------------------------------------------------------------------------------------
# Rolling out on one host


def _token_tar(token: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = token.encode()
        info = tarfile.TarInfo(TOKEN_PATH.lstrip("/"))
        info.size = len(data)
        info.mode = 0o400
        info.uid = info.gid = 0
        info.mtime = int(time.time())
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _exec(container: Any, cmd: list[str], user: str = "root") -> tuple[int, str]:
    rc, out = container.exec_run(cmd, user=user, demux=False)
    return rc, (out or b"").decode(errors="replace")


def _port_message(exc: BaseException, settings: HostSettings) -> str | None:
    text = _docker_message(exc)
    if "port is already allocated" in text or "address already in use" in text:
        match = re.search(r":(\d+)\b(?!.*:\d+)", text)
        port = match.group(1) if match else f"{settings.ssh_port} or {settings.jupyter_port}"
        return f"port {port} on {settings.bind} is already in use on the host"
    return None


def _wait_ready(container: Any, timeout: float = READY_TIMEOUT) -> None:
    """Until sshd and Jupyter answer inside the container (its own health check, run now)."""
    deadline = time.monotonic() + timeout
    while True:
        container.reload()
        state = container.attrs["State"]
        if state.get("Status") in ("exited", "dead") or state.get("Restarting"):
            logs = container.logs(tail=5).decode(errors="replace")
            last = " | ".join(ln for ln in logs.splitlines() if ln.strip())[-300:]
            raise DeployFailed(f"the container stopped (exit {state.get('ExitCode')}): {last}")
        if state.get("Running"):
            rc, _ = _exec(container, ["/usr/local/bin/umprov-healthcheck"])
            if rc == 0:
                return
        if time.monotonic() > deadline:
            raise DeployFailed(f"sshd and Jupyter did not answer within {timeout:.0f} s")
        time.sleep(0.5)


def _read_host_key(container: Any) -> str:
    rc, out = _exec(container, ["cat", "/etc/ssh/keys/ssh_host_ed25519_key.pub"])
    if rc != 0 or not out.startswith("ssh-"):
        raise DeployFailed("cannot read the container's SSH host key")
    return out.strip()


def rollout(
    client: Any,
    host: HostLike,
    settings: HostSettings,
    opts: DeployOptions,
    image_id: str,
    result: HostResult,
    progress: Progress = _quiet,
) -> None:
    """Create, keep or replace the container on one host; then pin its key, store its token."""
    from docker.errors import NotFound

    spec = container_spec(settings, image_id, opts.authorized_keys, shm_size=opts.shm_size)
    labels = labels_for(spec, settings.image)
    wanted = labels[f"{LABEL}.spec-hash"]
    image = client.images.get(image_id)
    login_user = (image.labels or {}).get("org.umprov.user") or "umprov"
    try:
        old = client.containers.get(settings.name)
    except NotFound:
        old = None
    if old is not None and not (old.labels or {}).get(f"{LABEL}.managed"):
        raise DeployFailed(
            f"a container named {settings.name} exists and is not umprov's; remove it or pass "
            "another name (umprov_container_name)"
        )
    token: str | None = None
    if old is not None and not opts.force and old.labels.get(f"{LABEL}.spec-hash") == wanted:
        container = old
        if old.status != "running":
            progress(host.name, "starting the stopped container")
            old.start()
            result.status = "started"
        else:
            result.status = "unchanged"
    else:
        token = secrets.token_urlsafe(32)
        container = _replace(client, host, old, spec, labels, token, settings, progress)
        result.status = "replaced" if old is not None else "created"
    progress(host.name, "waiting for sshd and Jupyter")
    _wait_ready(container)
    key_line = _read_host_key(container)
    pin_host_key(key_patterns(host, settings), key_line)
    if token is None and not token_path(host.name).is_file():
        # Unchanged container, token file lost here: read it back through Docker.
        rc, out = _exec(container, ["cat", TOKEN_PATH])
        if rc == 0 and out.strip():
            token = out.strip()
    if token is not None:
        write_private(token_path(host.name), token + "\n")
    identity = opts.identity_file
    config = render_ssh_config(host, settings, login_user, identity)
    write_private(ssh_config_path(host.name), config)
    conn = record_connection(host, settings, login_user, identity)
    result.container_id = container.id
    result.image_id = image_id
    result.ssh = f"ssh -F {conn['ssh_config']} {conn['alias']}"
    result.jupyter = f"{conn['address']}:{settings.jupyter_port}" + (
        f" (on {host.name})" if conn["via_host"] else ""
    )


def _replace(
    client: Any,
    host: HostLike,
    old: Any,
    spec: Mapping[str, Any],
    labels: Mapping[str, str],
    token: str,
    settings: HostSettings,
    progress: Progress,
) -> Any:
    """Start the new container; the old one is stopped and set aside, and restored on failure."""
    from docker.errors import APIError, NotFound

    aside = None
    if old is not None:
        progress(host.name, "stopping the old container")
        old.stop(timeout=20)
        aside = f"{settings.name}-replaced-{int(time.time())}"
        old.rename(aside)
    new = None
    try:
        progress(host.name, "creating the container")
        new = client.containers.create(**create_kwargs(spec, labels))
        new.put_archive("/", _token_tar(token))
        progress(host.name, "starting the container")
        new.start()
    except APIError as exc:
        if new is not None:
            with contextlib.suppress(APIError, NotFound):
                new.remove(force=True)
        if old is not None:
            with contextlib.suppress(APIError, NotFound):
                old.rename(settings.name)
                old.start()
        port = _port_message(exc, settings)
        if port:
            raise DeployFailed(port) from None
        if "runtime" in _docker_message(exc) and "nvidia" in _docker_message(exc):
            raise DeployFailed(
                "the nvidia runtime is not configured on this host (provision it, or deploy "
                "with --gpus none)"
            ) from None
        raise DeployFailed(f"starting the container failed: {_docker_message(exc)}") from None
    if old is not None:
        with contextlib.suppress(APIError, NotFound):
            old.remove(force=True)
    return new


# ---------------------------------------------------------------------------------------------
# The whole deploy


@dataclass
class _HostState:
    host: HostLike
    result: HostResult
    settings: HostSettings | None = None
    client: Any = None
    image_id: str | None = None
    started: float = field(default_factory=time.monotonic)


def deploy(
    hosts: list[HostLike],
    opts: DeployOptions,
    *,
    progress: Progress = _quiet,
    local_client: Any = None,
    max_workers: int = 32,
) -> list[HostResult]:
    """Deploy to every host; failures are recorded per host, never raised."""
    states = [_HostState(h, HostResult(h.name)) for h in hosts]
    for st in states:
        try:
            st.settings = settings_for(st.host, opts)
        except UmprovError as exc:
            _fail(st.result, exc)
    local_image_id: str | None = None
    if opts.delivery == "push":
        local_image_id = _local_image_id(local_client, opts, states)
    workers = max(1, min(max_workers, len(states)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="deploy") as pool:
        list(pool.map(lambda st: _phase_connect(st, opts, local_image_id, progress), states))
        if opts.delivery == "push":
            _phase_push(states, opts, local_client, pool, progress)
        list(pool.map(lambda st: _phase_rollout(st, opts, progress), states))
    for st in states:
        st.result.seconds = time.monotonic() - st.started
        if st.client is not None:
            with contextlib.suppress(Exception):
                st.client.close()
    return [st.result for st in states]


def _live(states: list[_HostState]) -> list[_HostState]:
    return [st for st in states if st.result.status == "pending"]


def _local_image_id(local_client: Any, opts: DeployOptions, states: list[_HostState]) -> str | None:
    from docker.errors import ImageNotFound

    refs = {st.settings.image for st in states if st.settings is not None}
    if len(refs) > 1:
        for st in _live(states):
            _fail(st.result, ConfigError("--push needs one image for all hosts (use --image)"))
        return None
    if not refs:
        return None
    ref = refs.pop()
    try:
        return str(local_client.images.get(ref).id)
    except ImageNotFound:
        err = ConfigError(f"image {ref} is not on this machine's engine, so it cannot be pushed")
        for st in _live(states):
            _fail(st.result, err)
        return None


def _phase_connect(
    st: _HostState, opts: DeployOptions, local_image_id: str | None, progress: Progress
) -> None:
    if st.result.status != "pending" or st.settings is None:
        return
    from docker.errors import APIError, DockerException, ImageNotFound

    from umprov.ssh import docker_client

    try:
        progress(st.host.name, "connecting")
        st.client = docker_client(st.host, trust_new=opts.trust_new)
        if opts.delivery == "push":
            try:
                st.client.images.get(local_image_id)
                st.image_id = local_image_id
                progress(st.host.name, "image already present (same ID): no push")
            except ImageNotFound:
                st.image_id = None
        elif opts.delivery == "pull":
            progress(st.host.name, f"pulling {st.settings.image}")
            try:
                st.image_id = str(st.client.images.pull(st.settings.image).id)
            except (APIError, DockerException) as exc:
                raise DeployFailed(
                    f"pulling {st.settings.image} failed: {_docker_message(exc)}"
                ) from None
        else:
            try:
                st.image_id = str(st.client.images.get(st.settings.image).id)
            except ImageNotFound:
                raise DeployFailed(
                    f"image {st.settings.image} is not on the host (deliver it with --push or "
                    "--pull)"
                ) from None
    except (Unreachable, TrustError, AuthFailed, EngineDown, UmprovError) as exc:
        _fail(st.result, exc)
    except DockerException as exc:
        _fail(st.result, EngineDown(f"Docker engine error: {_docker_message(exc)}"))


def _phase_push(
    states: list[_HostState],
    opts: DeployOptions,
    local_client: Any,
    pool: ThreadPoolExecutor,
    progress: Progress,
) -> None:
    need = [st for st in _live(states) if st.image_id is None]
    if not need:
        return
    ref = str(need[0].settings.image) if need[0].settings else ""
    local = local_client.images.get(ref)
    total = int(local.attrs.get("Size", 0))
    broadcast = _Broadcast([st.host.name for st in need])
    counters = {st.host.name: [0] for st in need}

    def consume(st: _HostState) -> None:
        name = st.host.name
        started = time.monotonic()
        try:
            _load_into(st.client, broadcast.consume(name, counters[name]))
            st.client.images.get(local.id)
            st.image_id = str(local.id)
        except BaseException as exc:  # noqa: BLE001 - recorded for this host only
            broadcast.drop(name)
            _fail(st.result, exc if isinstance(exc, UmprovError) else DeployFailed(
                f"push failed: {_docker_message(exc)}"))
        finally:
            st.result.pushed_bytes = counters[name][0]
            st.result.push_seconds = time.monotonic() - started

    def report() -> None:
        while not done.wait(1.0):
            for st in need:
                if st.result.status == "pending":
                    sent = counters[st.host.name][0]
                    pct = f" ({100 * sent / total:.0f}%)" if total else ""
                    progress(st.host.name, f"pushing {sent / 1e6:.0f} MB{pct}")

    done = threading.Event()
    reporter = threading.Thread(target=report, daemon=True)
    reporter.start()
    for st in need:
        progress(st.host.name, f"pushing {ref} ({total / 1e6:.0f} MB)")
    futures = [pool.submit(consume, st) for st in need]
    # Save by reference, so the loaded image carries the tag too.
    broadcast.produce(iter(local_client.api.get_image(ref, chunk_size=PUSH_CHUNK)))
    for fut in futures:
        fut.result()
    done.set()
    reporter.join()


def _phase_rollout(st: _HostState, opts: DeployOptions, progress: Progress) -> None:
    if st.result.status != "pending" or st.settings is None or st.image_id is None:
        if st.result.status == "pending":
            _fail(st.result, DeployFailed("no image on the host"))
        return
    from docker.errors import DockerException

    try:
        rollout(st.client, st.host, st.settings, opts, st.image_id, st.result, progress)
        progress(st.host.name, st.result.status)
    except UmprovError as exc:
        _fail(st.result, exc)
    except DockerException as exc:
        _fail(st.result, DeployFailed(_docker_message(exc)))
