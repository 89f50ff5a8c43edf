"""What a multi-node verification runs on each host, as pure functions of the options and of
what each host reported: the rendezvous endpoint, each host's torchrun command and
environment, and its throwaway container (umprov/verify/multinode.py runs them; its
launchers start them).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from umprov.errors import ConfigError
from umprov.hosts.engine import throwaway
from umprov.verify.agent.runner import MULTICAST_OFF

LABEL = "org.umprov.multinode"
DEFAULT_RDZV_PORT = 29400
WORKDIR = "/tmp/umprov-mn"  # noqa: S108 (inside the throwaway container)
NCCL_VARS = {
    "umprov_nccl_socket_ifname": ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"),
    "umprov_nccl_ib_hca": ("NCCL_IB_HCA",),
    "umprov_nccl_debug": ("NCCL_DEBUG",),
}


@dataclass(frozen=True)
class MultiNodeOptions:
    backend: str = "nccl"
    rendezvous: str | None = None  # HOST[:PORT], overrides the inventory
    timeout: float = 120.0  # join timeout, collective timeout, container start each
    nproc_per_node: int | None = None
    busbw_bytes: int | None = None  # default: 1 GiB (nccl), 16 MiB (gloo)
    trust_new: bool = False

    def worker_opts(self) -> dict[str, Any]:
        gloo = self.backend == "gloo"
        return {
            "backend": self.backend,
            "timeout": self.timeout,
            "elements": (1 if gloo else 4) << 20,
            "busbw_bytes": self.busbw_bytes or ((16 << 20) if gloo else (1 << 30)),
            "reps": 3 if gloo else 10,
        }

    def run_deadline(self) -> float:
        """How long torchrun may run on a host: start-up, join, collectives, shutdown."""
        return 60 + self.timeout * 3

    def run_bound(self) -> float:
        """How long a host's container may be needed: every host's set-up (connect, start,
        copy: a timeout each), then torchrun."""
        return self.timeout * 3 + self.run_deadline()


def parse_endpoint(text: str, default_port: int = DEFAULT_RDZV_PORT) -> tuple[str, int]:
    """HOST, HOST:PORT or [V6]:PORT."""
    text = text.strip()
    host, port = text, default_port
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest:
            if not rest.startswith(":"):
                raise ConfigError(f"rendezvous {text!r}: expected [ADDRESS]:PORT")
            port = _port(rest[1:], text)
    elif text.count(":") == 1:
        host, raw = text.split(":")
        port = _port(raw, text)
    if not host:
        raise ConfigError(f"rendezvous {text!r}: no host")
    return host, port


def _port(raw: str, text: str) -> int:
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise ConfigError(f"rendezvous {text!r}: port must be 1-65535")
    return int(raw)


def rendezvous_port(host_vars: Mapping[str, Any]) -> int:
    raw = host_vars.get("umprov_rendezvous_port")
    return int(raw) if raw is not None else DEFAULT_RDZV_PORT


def node_env(host_vars: Mapping[str, Any], route_ifname: str | None = None) -> dict[str, str]:
    """Environment of torchrun on a host: NCCL settings from its inventory variables, multicast
    off, and gloo bound to the interface that reaches the rendezvous unless one is named."""
    env = dict(MULTICAST_OFF)
    for var, names in NCCL_VARS.items():
        value = host_vars.get(var)
        if value not in (None, ""):
            for name in names:
                env[name] = str(value)
    if route_ifname and "GLOO_SOCKET_IFNAME" not in env:
        env["GLOO_SOCKET_IFNAME"] = route_ifname
    env["PYTHONUNBUFFERED"] = "1"
    return env


def torchrun_command(*, python: str, agent: str, nnodes: int, nproc: int, endpoint: str,
                     rdzv_id: str, join_timeout: float, local_addr: str | None,
                     is_host: bool | None, opts_path: str, out_prefix: str) -> list[str]:
    """PyTorch's own launcher, c10d rendezvous, no restarts; each rank is the agent (its
    zipapp, which torchrun runs as its script)."""
    conf = [f"join_timeout={int(join_timeout)}", f"read_timeout={int(join_timeout)}",
            f"last_call_timeout={max(1, min(30, int(join_timeout) // 4))}"]
    if is_host is not None:
        conf.append(f"is_host={'true' if is_host else 'false'}")
    cmd = [python, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--nproc-per-node",
           str(nproc), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id",
           rdzv_id, "--rdzv-conf", ",".join(conf), "--max-restarts", "0",
           "--monitor-interval", "1"]
    if local_addr:
        cmd += ["--local-addr", local_addr]
    return [*cmd, agent, "--child", "multinode", "--child-opts", opts_path,
            "--child-out", out_prefix]


def shell_script(cmd: Sequence[str], env: Mapping[str, str], *, workdir: str,
                 deadline: float) -> str:
    """The torchrun command for ``sh -c`` inside the container, under coreutils timeout."""
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    quoted = " ".join(shlex.quote(c) for c in cmd)
    return (f"cd {shlex.quote(workdir)} || exit 97; "
            f"T=''; command -v timeout >/dev/null 2>&1 && T='timeout -k 10 {int(deadline)}'; "
            f"export {exports}; exec $T {quoted} 2>&1")


def container_name(run_id: str) -> str:
    """The throwaway container's name, the same on every host of a run."""
    return f"umprov-mn-{run_id.removeprefix('umprov-')}"


def nproc_for(backend: str, gpus: int, override: int | None) -> int:
    if override:
        return override
    return 1 if backend == "gloo" else gpus


def container_kwargs(image: str, name: str, run_id: str, deployed_host_config: Mapping[str, Any],
                     *, raise_limits: bool, run_s: float) -> dict[str, Any]:
    """A throwaway container of the deployed image on the host's network, with its GPUs, that
    ends by itself once ``run_s`` (the whole run's bound) and a grace have passed."""
    from docker.types import DeviceRequest, Ulimit

    kw: dict[str, Any] = {
        **throwaway(run_s), "image": image, "name": name, "network_mode": "host",
        "shm_size": "16g",
        "labels": {LABEL: run_id, "org.umprov.managed": "false"},
    }
    if raise_limits:  # umprov_container_limits: needs CAP_SYS_RESOURCE (see deploy/options.py)
        kw["ulimits"] = [Ulimit(name="memlock", soft=-1, hard=-1),
                         Ulimit(name="stack", soft=67108864, hard=67108864)]
    runtime = deployed_host_config.get("Runtime")
    if runtime and runtime != "runc":
        kw["runtime"] = runtime
    reqs = deployed_host_config.get("DeviceRequests") or []
    if reqs:
        kw["device_requests"] = [
            DeviceRequest(driver=r.get("Driver") or "", count=r.get("Count") or 0,
                          device_ids=r.get("DeviceIDs") or None,
                          capabilities=r.get("Capabilities") or None,
                          options=r.get("Options") or None) for r in reqs]
    return kw
