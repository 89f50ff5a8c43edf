"""One host during a deploy (its connection, its image, its outcome so far) and how an error
becomes its outcome: the run goes on for the other hosts."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from umprov.deploy.options import DeployOptions, HostSettings
from umprov.errors import DeployFailed, TrustError, UmprovError, Unreachable
from umprov.hosts import HostLike, render
from umprov.hosts.engine import connection_lost, engine_error
from umprov.hosts.results import PENDING, HostOutcome


def new_outcome(host: str) -> HostOutcome:
    """A host's deploy outcome before anything happened: every figure of its JSON at zero."""
    return HostOutcome(host, data={
        "container_id": None, "image_id": None, "ssh": None, "jupyter": None,
        "pushed_bytes": 0, "push_seconds": 0.0,
        # Of push_seconds, the part until the host's engine had read the last byte; the rest
        # is docker load registering the layers, which moby starts only once the stream ended.
        "push_stream_seconds": 0.0,
        "skipped_bytes": 0,  # layer files left out of the push: the host already had them
        "seconds": 0.0,
        "managed_memory": None,  # asked for (settings); None: the host got no settings
        "managed_memory_pool": None,  # the image's label: carries the pool; None: says nothing
        "changed": [],  # a replacement: the settings that changed, in words
        "warnings": [],  # for people, the host deployed all the same
    })


# A host in `umprov deploy --json`.
HOST_FIELDS: list[render.Field] = [
    ("host", render.host),
    ("ok", render.ok),
    ("status", render.state),
    ("message", render.detail),
    *render.data_fields("container_id", "image_id", "ssh", "jupyter", "pushed_bytes"),
    ("push_seconds", render.datum("push_seconds", 2)),
    ("push_stream_seconds", render.datum("push_stream_seconds", 2)),
    ("skipped_bytes", render.datum("skipped_bytes")),
    ("seconds", render.datum("seconds", 2)),
    *render.data_fields("managed_memory", "managed_memory_pool", "changed", "warnings"),
]


@dataclass
class HostState:
    host: HostLike
    outcome: HostOutcome
    settings: HostSettings | None = None
    opts: DeployOptions | None = None  # the command's options with this host's login key
    client: Any = None  # the docker client over SSH, once connected
    image_id: str | None = None  # the image on the host, once there
    started: float = field(default_factory=time.monotonic)

    @property
    def name(self) -> str:
        return self.host.name

    @property
    def live(self) -> bool:
        """Nothing has gone wrong on this host yet."""
        return self.outcome.state == PENDING

    def fail(self, exc: BaseException) -> None:
        """Record why this host failed (or could not be reached, or was not trusted)."""
        if isinstance(exc, Unreachable):
            self.outcome.state = "unreachable"
        elif isinstance(exc, TrustError):
            self.outcome.state = "untrusted"
        else:
            self.outcome.state = "failed"
        self.outcome.detail = str(exc) if isinstance(exc, UmprovError) else engine_error(exc)

    def error(self, exc: BaseException, what: str = "") -> UmprovError:
        """What an exception from this host's Docker engine means: the SSH connection gone
        (the host lost mid-run) is 'unreachable', anything else a failure on the host."""
        if isinstance(exc, UmprovError):
            return exc
        if connection_lost(self.client, exc):
            return Unreachable(
                f"{what}{self.name}: the connection was lost mid-run ({engine_error(exc)})"
            )
        return DeployFailed(f"{what}{engine_error(exc)}")
