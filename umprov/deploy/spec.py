"""The container as plain data: its spec, the hash that says whether it changed, its labels,
and the docker SDK arguments that create it.

No secret is ever in the spec, the labels or the environment: the Jupyter token goes into the
container as a root-only file (``token_tar``, put_archive before start), of which the image's
entrypoint gives Jupyter a copy only the container's user reads.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from umprov import __version__
from umprov.deploy.options import DEFAULT_SHM, HostSettings
from umprov.hosts.engine import tar_files

SPEC_VERSION = 1  # bump when the spec's shape changes (every container is then replaced)
LABEL = "org.umprov"
HASH_LABEL = f"{LABEL}.spec-hash"
CONTAINER_SSH_PORT = 22
CONTAINER_JUPYTER_PORT = 8888
TOKEN_PATH = "/etc/umprov/jupyter_token"  # noqa: S105 (a path, not a secret)


def container_spec(
    settings: HostSettings, image_id: str, authorized_keys: str, *, shm_size: str = DEFAULT_SHM,
    agent_forwarding: bool = False,
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
    if agent_forwarding:  # only when asked, so the spec (and its hash) is otherwise unchanged
        spec["environment"]["SSH_ALLOW_AGENT_FORWARDING"] = "yes"
    if settings.managed_memory:  # likewise; the image's umprov_managed reads it (torch import)
        spec["environment"]["UMPROV_MANAGED_MEMORY"] = "1"
    return spec


def spec_hash(spec: Mapping[str, Any]) -> str:
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def labels_for(spec: Mapping[str, Any], image_ref: str) -> dict[str, str]:
    return {
        f"{LABEL}.managed": "true",
        f"{LABEL}.version": __version__,
        HASH_LABEL: spec_hash(spec),
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


def token_tar(token: str) -> bytes:
    """The Jupyter token as a file only root reads, for put_archive into the container."""
    return tar_files({TOKEN_PATH.lstrip("/"): token.encode()}, mode=0o400)
