"""What `umprov deploy` is asked to do: the options checked, and settled for each host.

Everything here is checked before any host is touched; a bad value is a ConfigError (exit 4)
naming the option or the host variable. Per host the command line wins over the host's
variables, which win over the defaults (``settings_for``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

from umprov.errors import ConfigError, UmprovError
from umprov.hosts import HostLike, is_loopback
from umprov.image import DEFAULT_TAG
from umprov.inventory import check_format, flag
from umprov.inventory.container_env import checked_env, env_problem
from umprov.inventory.specs import DEFAULT_CONTAINER
from umprov.inventory.values import check_bind, check_container_name, check_image, parse_gpus
from umprov.paths import safe_name

DEFAULT_SSH_PORT = 2222
DEFAULT_JUPYTER_PORT = 8888
DEFAULT_BIND = "127.0.0.1"
DEFAULT_SHM = "16g"


def _given(option: Any, flag: str, host: HostLike, variable: str, default: Any
           ) -> tuple[Any, str]:
    """The value that applies (the option, else the host's variable, else the default) and
    what to call it in an error: the option, or the host and its variable. Only None, and a
    variable set to "", are unset: a 0 is a value (``umprov_gpus: 0`` is GPU 0, not all)."""
    if option is not None:
        return option, flag
    value = (getattr(host, "vars", {}) or {}).get(variable)
    if value is None or value == "":
        return default, flag
    return value, f"{host.name}: {variable}"


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


def check_shm_size(value: str) -> str:
    """--shm-size as Docker reads a size (roles/gpu_preflight/files/value_rules.yml, 'size')."""
    return check_format("size", value, "--shm-size")


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
        "pass --authorized-key FILE, or set the hosts' umprov_authorized_key"
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
    agent_forwarding: bool = False  # sshd in the container lets ssh -A forward an agent
    managed_memory: bool | None = None  # PyTorch on managed memory (docs/managed-memory.md)
    # --env: the container's environment, over each host's umprov_env (values: never shown)
    env: Mapping[str, str] = field(default_factory=dict)


def parse_env(items: Iterable[str], environ: Mapping[str, str]) -> dict[str, str]:
    """``--env KEY=VALUE`` and ``--env KEY`` (the value of KEY here, as docker takes it); a
    name given twice, or one not set here, is a ConfigError naming it (never its value)."""
    env: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if name in env:
            raise ConfigError(f"--env gives {name[:60]} twice")
        if not sep:
            if name not in environ:
                raise ConfigError(f"--env {name[:60]}: {name[:60]} is not set in umprov's "
                                  f"environment (export it, or give --env {name[:60]}=VALUE)")
            value = environ[name]
        env[name] = value
    return env


def checked(opts: DeployOptions, authorized_key: Path | None) -> DeployOptions:
    """The command line's options, checked before any host is touched, with the public key
    read from ``authorized_key`` when given and, when it lies beside it, its private half for
    the ssh config deploy writes (not given: each host's own, ``for_host``)."""
    if opts.image is not None:
        check_image(opts.image)
    if opts.gpus is not None:
        parse_gpus(opts.gpus)
    if opts.ssh_port is not None:
        check_port(opts.ssh_port, "--ssh-port")
    if opts.jupyter_port is not None:
        check_port(opts.jupyter_port, "--jupyter-port")
    if opts.bind is not None:
        check_bind(opts.bind)
    if opts.name is not None:
        check_container_name(opts.name, "--name")
    check_shm_size(opts.shm_size)
    problem = env_problem(opts.env, managed=bool(opts.managed_memory))
    if problem:
        raise ConfigError(f"--env: {problem}")
    if authorized_key is None:
        return opts  # each host's umprov_authorized_key, else the user's own (for_host)
    keys, identity = read_public_key(authorized_key, "--authorized-key")
    return replace(opts, authorized_keys=keys, identity_file=identity)


def read_public_key(path: Path, source: str) -> tuple[str, str | None]:
    """The public key in ``path`` and, when it lies beside it, its private half. Absolute
    before it is stored: the ssh config deploy writes names the private half, and `ssh` from
    another folder must find it."""
    key_path = path.expanduser().absolute()
    return _read_public_key(key_path, source)


@cache
def _read_public_key(key_path: Path, source: str) -> tuple[str, str | None]:
    try:
        text = key_path.read_text(errors="replace")
    except OSError as exc:
        raise ConfigError(f"{source} {key_path}: {exc.strerror or exc}") from None
    keys = check_public_key(text, str(key_path))
    private = key_path.with_suffix("") if key_path.suffix == ".pub" else None
    return keys, str(private) if private and private.is_file() else None


def for_host(host: HostLike, opts: DeployOptions) -> DeployOptions:
    """``opts`` with the public key allowed into ``host``'s container: --authorized-key, else
    the host's umprov_authorized_key (a lab's inventory names the lab's key), else the user's
    own in ~/.ssh. A missing or bad key is a ConfigError naming where it was asked for."""
    if opts.authorized_keys:
        return opts
    given = (getattr(host, "vars", {}) or {}).get("umprov_authorized_key")
    if given:
        keys, identity = read_public_key(Path(str(given)),
                                         f"{host.name}: umprov_authorized_key")
    else:
        keys, identity = read_public_key(default_public_key(), "~/.ssh")
    return replace(opts, authorized_keys=keys, identity_file=identity)


@dataclass(frozen=True)
class HostSettings:
    """The options as they apply to one host (command line > host variables > defaults)."""

    image: str
    gpus: str | list[str]
    ssh_port: int
    jupyter_port: int
    bind: str
    name: str
    # umprov_container_limits: raise memlock and stack for NCCL, which needs CAP_SYS_RESOURCE
    # (the lab's hosts lack it); false leaves the engine's defaults.
    raise_limits: bool = True
    # umprov_managed_memory / --managed-memory: PyTorch's allocator over CUDA managed memory.
    managed_memory: bool = False
    # umprov_env / --env: more of the container's environment (its values may be secrets).
    env: Mapping[str, str] = field(default_factory=dict)


def settings_for(host: HostLike, opts: DeployOptions) -> HostSettings:
    hv: Mapping[str, Any] = getattr(host, "vars", {}) or {}
    # Without --image or umprov_image: the image `umprov image build` tags by default.
    image = check_image(*_given(opts.image, "--image", host, "umprov_image", DEFAULT_TAG))
    ssh_port = check_port(*_given(opts.ssh_port, "--ssh-port", host, "umprov_ssh_port",
                                  DEFAULT_SSH_PORT))
    jupyter_port = check_port(*_given(opts.jupyter_port, "--jupyter-port", host,
                                      "umprov_jupyter_port", DEFAULT_JUPYTER_PORT))
    if ssh_port == jupyter_port:
        raise ConfigError(f"{host.name}: --ssh-port and --jupyter-port are both {ssh_port}")
    bind = check_bind(*_given(opts.bind, "--bind", host, "umprov_bind", DEFAULT_BIND))
    gpus = parse_gpus(*_given(opts.gpus, "--gpus", host, "umprov_gpus", "all"))
    name = check_container_name(*_given(opts.name, "--name", host, "umprov_container_name",
                                        DEFAULT_CONTAINER))
    raise_limits = flag(hv.get("umprov_container_limits"), default=True)
    managed = (opts.managed_memory if opts.managed_memory is not None
               else flag(hv.get("umprov_managed_memory"), default=False))
    return HostSettings(image, gpus, ssh_port, jupyter_port, bind, name, raise_limits,
                        managed, container_env(host, opts, managed))


def container_env(host: HostLike, opts: DeployOptions, managed: bool) -> dict[str, str]:
    """The host's umprov_env with --env over it, checked (ConfigError naming the host)."""
    given = (getattr(host, "vars", {}) or {}).get("umprov_env") or {}
    if not isinstance(given, Mapping):
        raise ConfigError(f"{host.name}: umprov_env must be a mapping of names to values")
    env = {**given, **opts.env}
    problem = env_problem(env, managed)
    if problem:
        raise ConfigError(f"{host.name}: {problem}")
    return checked_env(env)


def network_exposure(hosts: list[HostLike], opts: DeployOptions) -> list[str]:
    """A warning for each address other than loopback that containers would publish SSH and
    Jupyter on (``--bind`` or umprov_bind): reachable from the network there."""
    exposed: dict[str, list[str]] = {}
    for host in hosts:
        try:
            bind = settings_for(host, opts).bind
        except UmprovError:
            continue  # the deploy reports it for this host
        if not is_loopback(bind):
            exposed.setdefault(bind, []).append(host.name)
    return [
        f"warning: {', '.join(names[:5])}{' and others' if len(names) > 5 else ''}: the "
        f"container's SSH and Jupyter ports are published on {bind}, reachable from the network "
        "(guarded only by your key and the Jupyter token; Jupyter speaks plain HTTP). The "
        "default, 127.0.0.1, reaches them through the host over SSH"
        for bind, names in exposed.items()
    ]


def settings_for_all(hosts: list[HostLike], opts: DeployOptions) -> None:
    """Every host's settings checked before any host is contacted: a bad value (an option, or
    a host's variable) stops the run with exit 4 instead of failing hosts one by one."""
    for host in hosts:
        try:  # it names the host's files in umprov's state folder and its SSH alias
            safe_name(host.name, "host name")
        except ValueError as exc:
            raise ConfigError(f"{host.name}: {exc}") from None
        settings_for(host, opts)
        for_host(host, opts)
