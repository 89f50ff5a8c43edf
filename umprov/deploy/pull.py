"""--pull: each host's engine pulls the image from its registry; umprov relays the bytes.

The docker SDK sends this machine's `docker login` credentials for the registry, as
`docker -H ssh://HOST pull` does; a private registry's CA reaches the hosts through the
inventory (docker_engine_registry_ca_certs).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from umprov.errors import DeployFailed
from umprov.hosts.engine import one_line
from umprov.hosts.progress import size_text


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
            raise DeployFailed(f"pulling {ref} failed: {one_line(text)}")
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
            say(f"pulling: {size_text(done)} of {size_text(total)} (compressed) from "
                f"{len(layers)} layer(s)")
    return str(client.images.get(ref).id)
