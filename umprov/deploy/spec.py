"""The container as plain data: its spec, the hash that says whether it changed, its labels,
and the docker SDK arguments that create it.

No secret of umprov's is ever in the spec, the labels or the environment: the Jupyter token goes
into the container as a root-only file (``token_tar``, put_archive before start), of which the
image's entrypoint gives Jupyter a copy only the container's user reads. The user's own
environment (``--env``, ``umprov_env``) is in the spec and its hash, as it must be to replace
the container when it changes, and its values are in the container's environment, as given;
the labels carry a digest of each part of the spec (``PARTS_LABEL``), never a value.
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
# Each part of the spec as a digest, so a replacement can say which setting changed.
PARTS_LABEL = f"{LABEL}.spec-parts"
# On the image (the Dockerfile, from its UMPROV_MANAGED_ALLOCATOR build argument): "1" when it
# carries the managed-memory pool, "0" when built without; images not built by umprov have none.
POOL_LABEL = f"{LABEL}.managed-memory"
MANAGED_VARIABLE = "UMPROV_MANAGED_MEMORY"
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
        spec["environment"][MANAGED_VARIABLE] = "1"
    spec["environment"].update(settings.env)  # none of the names above (container_env.OWNED)
    return spec


def spec_hash(spec: Any) -> str:
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def spec_parts(spec: Mapping[str, Any]) -> dict[str, str]:
    """A digest of each part of the spec, each variable of its environment a part of its own
    (``environment.NAME``): what a replacement compares, with no value in clear."""
    parts = {key: spec_hash(value) for key, value in spec.items() if key != "environment"}
    for name, value in spec["environment"].items():
        parts[f"environment.{name}"] = spec_hash([name, value])
    return parts


def labels_for(spec: Mapping[str, Any], image_ref: str) -> dict[str, str]:
    return {
        f"{LABEL}.managed": "true",
        f"{LABEL}.version": __version__,
        HASH_LABEL: spec_hash(spec),
        PARTS_LABEL: json.dumps(spec_parts(spec), sort_keys=True, separators=(",", ":")),
        f"{LABEL}.image": image_ref,
    }


_PART_NAMES = {
    "image_id": "image", "ports": "ports", "volumes": "volumes", "shm_size": "shm size",
    "ulimits": "container limits", "gpus": "gpus", "restart_policy": "restart policy",
    "spec_version": "umprov's container spec", "environment.SSH_AUTHORIZED_KEYS": "authorized key",
    "environment.SSH_ALLOW_AGENT_FORWARDING": "agent forwarding",
}


def changed_settings(old_labels: Mapping[str, str], new_labels: Mapping[str, str]) -> list[str]:
    """Which settings differ between the container there (its labels) and the new one, in
    words: ``managed memory on``, ``env HF_HOME added``, ``ports``..."""
    try:
        old = json.loads(old_labels.get(PARTS_LABEL) or "")
    except ValueError:
        old = None
    if not isinstance(old, dict):
        return ["its spec (deployed by an older umprov, which did not record its parts)"]
    new = json.loads(new_labels[PARTS_LABEL])
    changed: list[str] = []
    for part in sorted(set(old) | set(new)):
        if old.get(part) != new.get(part):
            changed.append(_changed_part(part, part in old, part in new))
    return list(dict.fromkeys(changed))  # JUPYTER_* parts say one thing


def _changed_part(part: str, before: bool, after: bool) -> str:
    if part == f"environment.{MANAGED_VARIABLE}":
        return f"managed memory {'on' if after else 'off'}"
    if part in _PART_NAMES:
        return _PART_NAMES[part]
    name = part.removeprefix("environment.")
    if name.startswith("JUPYTER_"):
        return "jupyter settings"
    how = "added" if not before else "removed" if not after else "changed"
    return f"env {name} {how}" if name != part else part


def pool_warning(image_labels: Mapping[str, str], image_ref: str) -> str | None:
    """With managed memory asked for: what to tell when the image does not carry the pool."""
    held = (image_labels or {}).get(POOL_LABEL)
    if held == "1":
        return None
    why = ("was built without it (UMPROV_MANAGED_ALLOCATOR=0)" if held == "0" else
           f"does not say it has it (no {POOL_LABEL} label: not built by umprov image build)")
    return (f"managed memory is on, but the image {image_ref} {why}: "
            f"{MANAGED_VARIABLE}=1 does nothing there")


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
