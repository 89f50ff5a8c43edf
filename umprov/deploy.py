"""`umprov deploy`: the PyTorch container on every host, over the docker SDK and verified SSH.

The flow, in three phases so one host's trouble never stops the others:

1. connect (in parallel): a docker client per host over ``umprov.ssh.docker_client`` (verified
   host key), and whether the host already has the image (by image ID);
2. deliver: ``--pull`` pulls on each host; ``--push`` streams ONE local ``docker save`` to every
   host that lacks the image, each into its engine's ``docker load`` (hosts that have the image
   ID are skipped); a host whose engine already holds some of the image's layers gets the
   stream without their layer files (``umprov.image_tar``; graph-driver image stores only);
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from umprov import __version__
from umprov.errors import ConfigError, ExitCode, TrustError, UmprovError
from umprov.parallel import Cancelled, Parallel
from umprov.paths import private_dir, state_dir, write_atomic, write_private
from umprov.ssh import (
    AuthFailed,
    EngineDown,
    HostLike,
    Unreachable,
    connection_lost,
    host_pattern,
    known_hosts_files,
    pin_host_key,
    pinned_keys,
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
    raise_limits = bool(hv.get("umprov_container_limits", True))
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
    # Of push_seconds, the part until the host's engine had read the last byte; the rest is
    # docker load registering the layers, which moby starts only once the stream has ended.
    push_stream_seconds: float = 0.0
    skipped_bytes: int = 0  # layer files left out of the push: the host already had them
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
            "push_stream_seconds": round(self.push_stream_seconds, 2),
            "skipped_bytes": self.skipped_bytes,
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


def _one_line(text: object, limit: int = 300) -> str:
    return " ".join(str(text).split())[:limit]


def _docker_message(exc: BaseException) -> str:
    explanation = getattr(exc, "explanation", None)
    return _one_line(explanation or exc) or type(exc).__name__


# ---------------------------------------------------------------------------------------------
# Image delivery


class _Broadcast:
    """One producer (a local docker save, or a rewrite of it), many consumers (each host's
    docker load, or a rewrite feeding hosts of its own).

    Bounded queues: the stream goes at the pace of the slowest live consumer; a consumer whose
    load fails is dropped and the others go on.
    """

    def __init__(self, hosts: list[str], depth: int = 16) -> None:
        self.queues: dict[str, queue.Queue[bytes | None]] = {
            h: queue.Queue(maxsize=depth) for h in hosts
        }
        self.dead: set[str] = set()
        self.error: UmprovError | None = None
        self.aborted = threading.Event()
        self.lock = threading.Lock()

    def produce(self, chunks: Iterator[bytes]) -> None:
        try:
            for chunk in chunks:
                self.put(chunk)
        except Exception as exc:  # noqa: BLE001 - handed to every consumer
            self.close(UmprovError(f"docker save failed: {_docker_message(exc)}"))
        except BaseException:  # Ctrl-C or SIGTERM: the whole run stops, not only this stream
            self.abort()
            raise
        else:
            self.close()

    def abort(self) -> None:
        """The run was interrupted: producer and consumers stop at once."""
        self.aborted.set()

    def put(self, chunk: bytes) -> None:
        self._put_all(chunk)

    def close(self, error: UmprovError | None = None) -> None:
        if error is not None:
            self.error = error
        self._put_all(None)

    @property
    def all_dead(self) -> bool:
        with self.lock:
            return len(self.dead) == len(self.queues)

    def _put_all(self, item: bytes | None) -> None:
        for host, q in self.queues.items():
            while host not in self.dead and not self.aborted.is_set():
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
            try:
                item = q.get(timeout=0.5)
            except queue.Empty:
                if self.aborted.is_set():
                    raise Cancelled from None
                continue
            if self.aborted.is_set():
                raise Cancelled
            if item is None:
                if self.error is not None:
                    raise UmprovError(str(self.error))
                return
            counter[0] += len(item)
            yield item


class _NobodyListens(Exception):
    """Every host fed by a rewrite has dropped out: stop rewriting."""


class _BroadcastWriter:
    """The file a streaming tar rewrite writes into: chunks go to a _Broadcast."""

    def __init__(self, broadcast: _Broadcast) -> None:
        self.broadcast = broadcast

    def write(self, data: bytes) -> int:
        if self.broadcast.all_dead:
            raise _NobodyListens
        if data:
            self.broadcast.put(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass


def _rewrite_into(
    source: _Broadcast, key: str, skip: Mapping[str, str], sink: _Broadcast, stats: Any
) -> None:
    """Feed ``sink``'s hosts the ``source`` stream without the layers of ``skip``."""
    import tarfile as _tarfile

    from umprov.image_tar import rewrite_save_stream

    error: UmprovError | None = None
    try:
        rewrite_save_stream(source.consume(key, [0]), skip, _BroadcastWriter(sink), stats)
    except _NobodyListens:
        pass
    except UmprovError as exc:  # the docker save itself failed
        error = exc
    except (_tarfile.TarError, OSError, ValueError) as exc:
        error = UmprovError(f"rewriting the image stream failed: {exc}")
    except BaseException as exc:  # noqa: BLE001 - handed to this group's hosts
        error = UmprovError(f"rewriting the image stream failed: {_docker_message(exc)}")
    finally:
        source.drop(key)  # never leave the docker save blocked on this reader
        sink.close(error)


def _load_into(client: Any, data: Iterator[bytes]) -> None:
    """docker load on the host's engine from a stream of tar chunks."""
    from docker.errors import APIError

    try:
        for chunk in client.api.load_image(data):
            if isinstance(chunk, dict) and chunk.get("error"):
                raise UmprovError(f"docker load failed: {chunk['error']}")
    except APIError as exc:
        raise UmprovError(f"docker load failed: {_docker_message(exc)}") from None


def pull_image(
    client: Any, ref: str, say: Callable[[str], None], every: float = 1.0
) -> str:
    """``docker pull`` on the host's engine with a byte count every ``every`` seconds; the
    image ID. The engine's own error (unknown tag, an untrusted certificate, no credentials)
    is raised as it says it."""
    from docker.utils import parse_repository_tag

    repository, tag = parse_repository_tag(ref)
    layers: dict[str, tuple[int, int]] = {}  # layer -> (bytes so far, size)
    last = time.monotonic()
    for event in client.api.pull(repository, tag=tag or "latest", stream=True, decode=True):
        if event.get("error"):
            text = event.get("errorDetail", {}).get("message") or event["error"]
            raise DeployFailed(f"pulling {ref} failed: {_one_line(text)}")
        detail = event.get("progressDetail") or {}
        layer = event.get("id", "")
        if event.get("status") == "Downloading" and detail.get("total"):
            layers[layer] = (int(detail.get("current", 0)), int(detail["total"]))
        elif event.get("status") in ("Download complete", "Pull complete",
                                     "Already exists") and layer in layers:
            layers[layer] = (layers[layer][1], layers[layer][1])
        now = time.monotonic()
        if layers and now - last >= every:
            last = now
            done = sum(d for d, _ in layers.values())
            total = sum(t for _, t in layers.values())
            say(f"pulling: {_mb(done)} of {_mb(total)} (compressed) from "
                f"{len(layers)} layer(s)")
    return str(client.images.get(ref).id)


def _skip_plan(st: _HostState, diff_ids: list[str] | None, progress: Progress) -> dict[str, str]:
    """Which of the image's layers this host's engine already holds ({diff ID: chain ID});
    empty (the full stream) unless everything about the host looks as expected."""
    from umprov.image_tar import host_chain_ids, skip_plan

    if not diff_ids:
        return {}
    try:
        held, why = host_chain_ids(st.client)
    except Exception as exc:  # noqa: BLE001 - any doubt: the full stream
        held, why = None, _docker_message(exc)
    if held is None:
        progress(st.host.name, f"sending every layer ({why})")
        return {}
    return skip_plan(diff_ids, held)


def _mb(size: int) -> str:
    return f"{size / 1e6:.0f} MB" if size >= 10**6 or not size else f"{size / 1e3:.0f} kB"


def _percent(done: int, estimate: int) -> str:
    """'~NN%' of an estimate that the tar stream may exceed: never above 99 until the end."""
    if estimate <= 0:
        return ""
    return f" (~{min(99, int(100 * done / estimate))}%)"


# ---------------------------------------------------------------------------------------------
# Per-host state kept on the control machine


def token_path(host_name: str) -> Path:
    return private_dir(state_dir() / "tokens") / f"{host_name}.token"


def _stored_token(host_name: str) -> str | None:
    try:
        return token_path(host_name).read_text().strip() or None
    except OSError:
        return None


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


def _wait_ready(
    container: Any, timeout: float = READY_TIMEOUT, cancel: threading.Event | None = None
) -> None:
    """Until sshd and Jupyter answer inside the container (its own health check, run now)."""
    deadline = time.monotonic() + timeout
    while True:
        _checkpoint(cancel)
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


ASIDE = "-replaced-"  # NAME-replaced-MILLISECONDS: the old container during a replacement


def _set_aside(client: Any, name: str) -> list[Any]:
    """umprov's containers named NAME-replaced-*, newest first: the old container of a
    replacement, which only an interrupted run leaves behind."""
    found = client.containers.list(all=True, filters={"label": f"{LABEL}.managed=true"})
    aside = [c for c in found if c.name.startswith(f"{name}{ASIDE}")]
    return sorted(aside, key=lambda c: c.name, reverse=True)


def _started_once(container: Any) -> bool:
    """Whether the container was ever started (Docker's zero time says never)."""
    started = (container.attrs.get("State") or {}).get("StartedAt") or ""
    return bool(started) and not started.startswith("0001-01-01")


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
    *,
    cancel: threading.Event | None = None,
) -> None:
    """Create, keep or replace the container on one host; then pin its key, store its token.

    An interrupted run (``cancel`` set: Ctrl-C, SIGTERM) stops between two steps; whatever
    it left is taken up here by the next run: a container set aside by a replacement that
    never finished is the old container again, one created but never started is replaced,
    a started one whose token or key was not recorded yet gets them now.
    """
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
    aside = _set_aside(client, settings.name)
    if old is None and aside:
        # A replacement was interrupted after the old container was set aside: it is the
        # old container again (compared, kept or replaced below like any other).
        old = aside.pop(0)
        progress(host.name, f"taking back {old.name}, set aside by an interrupted run")
        old.rename(settings.name)
        old.reload()
    _checkpoint(cancel)
    token: str | None = None
    if (
        old is not None
        and not opts.force
        and old.labels.get(f"{LABEL}.spec-hash") == wanted
        and _started_once(old)  # created but never started: its token may not be in it
    ):
        container = old
        if old.status != "running":
            progress(host.name, "starting the stopped container")
            old.start()
            result.status = "started"
        else:
            result.status = "unchanged"
    else:
        token = secrets.token_urlsafe(32)
        container = _replace(client, host, old, spec, labels, token, settings, progress, cancel)
        result.status = "replaced" if old is not None else "created"
    for stale in aside:  # left by an interrupted run; the container is in place now
        with contextlib.suppress(Exception):
            stale.remove(force=True)
    progress(host.name, "waiting for sshd and Jupyter")
    _wait_ready(container, cancel=cancel)
    _checkpoint(cancel)
    key_line = _read_host_key(container)
    patterns = key_patterns(host, settings)
    before = pinned_keys(patterns[0])
    pin_host_key(patterns, key_line)
    if before and " ".join(key_line.split()[:2]) not in before:
        # Read through Docker over the verified host connection: the container's true key.
        result.message = "the container's SSH host key changed: pinned the new one"
        progress(host.name, result.message)
    if token is None:
        # A kept container's own token is the truth: the file here may be lost, or hold the
        # token of the container that a run interrupted after starting this one replaced.
        rc, out = _exec(container, ["cat", TOKEN_PATH])
        if rc == 0 and out.strip() and _stored_token(host.name) != out.strip():
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
    cancel: threading.Event | None = None,
) -> Any:
    """Start the new container; the old one is stopped and set aside, and restored on failure."""
    from docker.errors import APIError, NotFound

    aside = None
    if old is not None:
        progress(host.name, "stopping the old container")
        old.stop(timeout=20)
        aside = f"{settings.name}{ASIDE}{int(time.time() * 1000)}"
        old.rename(aside)
    new = None
    try:
        _checkpoint(cancel)
        progress(host.name, "creating the container")
        new = client.containers.create(**create_kwargs(spec, labels))
        new.put_archive("/", _token_tar(token))
        _checkpoint(cancel)
        progress(host.name, "starting the container")
        new.start()
    except Cancelled:
        # Interrupted: put the host back as it was, as far as there is time (the next run
        # takes up whatever is left: see rollout).
        with contextlib.suppress(Exception):
            if new is not None:
                new.remove(force=True)
            if old is not None:
                old.rename(settings.name)
                old.start()
        raise
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
    # Daemon threads that Ctrl-C or SIGTERM stop within seconds (umprov.parallel): each host
    # stops at its next step, what was cut short is repaired by the next run (see rollout).
    pool = Parallel(max(1, min(max_workers, len(states))))
    quiet = _until_cancelled(progress, pool.cancel)
    try:
        pool.map(lambda st: _phase_connect(st, opts, local_image_id, quiet), states, "connect")
        if opts.delivery == "push":
            _phase_push(states, opts, local_client, pool, quiet)
        pool.map(lambda st: _phase_rollout(st, opts, quiet, pool.cancel), states, "rollout")
    except BaseException:
        pool.stop(close=lambda: _close_clients(states))
        raise
    finally:
        _close_clients(states)
    for st in states:
        st.result.seconds = time.monotonic() - st.started
    return [st.result for st in states]


def _close_clients(states: list[_HostState]) -> None:
    for st in states:
        if st.client is not None:
            with contextlib.suppress(Exception):
                st.client.close()


def _until_cancelled(progress: Progress, cancel: threading.Event) -> Progress:
    """Progress lines until the run is interrupted, then silence."""

    def report(host: str, message: str) -> None:
        if not cancel.is_set():
            progress(host, message)

    return report


def _checkpoint(cancel: threading.Event | None) -> None:
    """Between two steps on a host: stop here when the run was interrupted."""
    if cancel is not None and cancel.is_set():
        raise Cancelled


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
                st.image_id = pull_image(st.client, st.settings.image,
                                         lambda msg: progress(st.host.name, msg))
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
    except Exception as exc:  # noqa: BLE001 - e.g. the connection lost: this host's result
        _fail(st.result, _host_error(st, exc))


def _phase_push(
    states: list[_HostState],
    opts: DeployOptions,
    local_client: Any,
    pool: Parallel,
    progress: Progress,
) -> None:
    from umprov.image_tar import rootfs_diff_ids

    need = [st for st in _live(states) if st.image_id is None]
    if not need:
        return
    ref = str(need[0].settings.image) if need[0].settings else ""
    local = local_client.images.get(ref)
    # Sum of the layers' contents: the tar stream is a little larger (headers, padding).
    estimate = int(local.attrs.get("Size", 0))
    diff_ids = rootfs_diff_ids(local.attrs)
    plans = list(pool.map(lambda st: _skip_plan(st, diff_ids, progress), need))
    for st, plan in zip(need, plans, strict=True):
        if plan:
            progress(st.host.name, f"the host already has {len(plan)} of the image's "
                                   f"{len(diff_ids or ())} layers: they stay out of its stream")
    retry = _push_round(need, plans, ref, str(local.id), local_client, estimate, progress)
    if retry:
        # An incremental load failed (a layer gone from the host since it was asked?): once
        # more with every layer, from a docker save of its own.
        _push_round(retry, [{} for _ in retry], ref, str(local.id), local_client, estimate,
                    progress)


def _push_round(
    need: list[_HostState],
    plans: list[dict[str, str]],
    ref: str,
    image_id: str,
    local_client: Any,
    estimate: int,
    progress: Progress,
) -> list[_HostState]:
    """One local docker save streamed into every host of ``need``: as it is to hosts with an
    empty plan, and through one rewrite per distinct plan (the layers left out) to the others.
    Returns the hosts whose incremental load failed (to be sent the full stream)."""
    from umprov.image_tar import RewriteStats

    groups: dict[frozenset[tuple[str, str]], list[_HostState]] = {}
    for st, plan in zip(need, plans, strict=True):
        groups.setdefault(frozenset(plan.items()), []).append(st)
    direct = [st.host.name for st in groups.pop(frozenset(), [])]
    keys = [f"rewrite-{i}" for i in range(len(groups))]
    source = _Broadcast(direct + keys)
    feeds: dict[str, _Broadcast] = dict.fromkeys(direct, source)
    stats: dict[str, RewriteStats] = {}
    workers: list[threading.Thread] = []
    for key, (plan, members) in zip(keys, groups.items(), strict=True):
        sink = _Broadcast([st.host.name for st in members])
        group_stats = RewriteStats()
        for st in members:
            feeds[st.host.name] = sink
            stats[st.host.name] = group_stats
        workers.append(threading.Thread(
            target=_rewrite_into, args=(source, key, dict(plan), sink, group_stats),
            name=f"push-{key}", daemon=True,
        ))
    counters = {st.host.name: [0] for st in need}
    streamed: dict[str, float] = {}  # host -> seconds until its engine had read the stream
    retry: list[_HostState] = []

    def consume(st: _HostState) -> None:
        name = st.host.name
        feed = feeds[name]
        started = time.monotonic()
        ok = False

        def stream() -> Iterator[bytes]:
            yield from feed.consume(name, counters[name])
            # The request body is complete: what follows is the host's docker load registering
            # the layers (untar into the storage driver, digest check), no more transfer.
            streamed[name] = time.monotonic() - started
            sent = counters[name][0]
            rate = f" ({sent / streamed[name] / 1e6:.0f} MB/s)" if streamed[name] > 0 else ""
            progress(name, f"sent {_mb(sent)} in {streamed[name]:.0f} s{rate}; "
                           "the host's docker load is registering the layers")

        try:
            _load_into(st.client, stream())
            st.client.images.get(image_id)
            st.image_id = image_id
            ok = True
        except BaseException as exc:  # noqa: BLE001 - recorded for this host only
            feed.drop(name)
            if name in stats and source.error is None:
                progress(name, f"incremental push failed ({_docker_message(exc)}): "
                               "sending every layer")
                retry.append(st)
            else:
                _fail(st.result, _host_error(st, exc, "push failed: "))
        finally:
            seconds = time.monotonic() - started
            st.result.pushed_bytes += counters[name][0]
            st.result.push_seconds += seconds
            # A failed attempt (before a retry) counts whole, in both figures.
            st.result.push_stream_seconds += streamed.get(name, seconds) if ok else seconds
            skipped = stats[name].skipped_bytes if ok and name in stats else 0
            st.result.skipped_bytes = skipped
            if ok:
                note = f", {_mb(skipped)} already on the host" if skipped else ""
                split = ""
                if name in streamed:
                    split = (f" (sent in {streamed[name]:.0f} s, "
                             f"loaded in {seconds - streamed[name]:.0f} s)")
                progress(name, f"pushed {_mb(counters[name][0])} in {seconds:.0f} s{split}{note}")

    def report() -> None:
        while not done.wait(1.0):
            for st in need:
                if (st.result.status == "pending" and st.image_id is None
                        and st.host.name not in streamed):
                    sent = counters[st.host.name][0]
                    group = stats.get(st.host.name)
                    skipped = group.skipped_bytes if group else 0
                    note = f", {_mb(skipped)} already on the host" if skipped else ""
                    pct = _percent(sent + skipped, estimate)
                    progress(st.host.name, f"pushing {_mb(sent)}{note}{pct}")

    def save() -> Iterator[bytes]:
        # Save by reference, so the loaded image carries the tag too.
        yield from local_client.api.get_image(ref, chunk_size=PUSH_CHUNK)

    for st in need:
        progress(st.host.name, f"pushing {ref} (~{estimate / 1e6:.0f} MB)")
    done = threading.Event()
    reporter = threading.Thread(target=report, name="push-progress", daemon=True)
    # One thread per host: a pool smaller than the host count would leave the broadcast
    # waiting on hosts that never start reading.
    loaders = [threading.Thread(target=consume, args=(st,), name=f"push-{st.host.name}",
                                daemon=True) for st in need]
    streams = [source, *{id(feed): feed for feed in feeds.values()}.values()]
    for thread in [reporter, *workers, *loaders]:
        thread.start()
    try:
        source.produce(save())
        for thread in [*workers, *loaders]:
            thread.join()
    except BaseException:  # Ctrl-C or SIGTERM: every stream stops, the loads are cut short
        for stream in streams:
            stream.abort()
        raise
    finally:
        done.set()
    reporter.join()
    return retry


def _phase_rollout(
    st: _HostState, opts: DeployOptions, progress: Progress, cancel: threading.Event | None = None
) -> None:
    if st.result.status != "pending" or st.settings is None or st.image_id is None:
        if st.result.status == "pending":
            _fail(st.result, DeployFailed("no image on the host"))
        return
    try:
        rollout(st.client, st.host, st.settings, opts, st.image_id, st.result, progress,
                cancel=cancel)
        progress(st.host.name, st.result.status)
    except Exception as exc:  # noqa: BLE001 - one host's trouble is its result
        _fail(st.result, _host_error(st, exc))


def _host_error(st: _HostState, exc: BaseException, what: str = "") -> UmprovError:
    """What an exception from a host's Docker engine means for its result: the SSH connection
    gone (the host lost mid-run) is 'unreachable', anything else a failure on the host."""
    if isinstance(exc, UmprovError):
        return exc
    if connection_lost(st.client, exc):
        return Unreachable(
            f"{what}{st.host.name}: the connection was lost mid-run ({_docker_message(exc)})"
        )
    return DeployFailed(f"{what}{_docker_message(exc)}")

