"""The whole deploy, so that one host's trouble never stops the others:

1. per host, at most ``--forks`` at once: a docker client over verified SSH, whether the host
   already has the image (by image ID; ``--pull``: the host's engine pulls it, pull.py),
   and if it has, the roll out (keep or replace the container, rollout.py); then the
   connection is closed, so a 10,000-host inventory never holds more than --forks open;
2. ``--push``: the hosts that lack the image, --forks at a time: each connected again, one
   local ``docker save`` streamed to all of them (push.py), then their roll out.

Ctrl-C or SIGTERM stops every host at its next step (umprov.hosts.fanout); what was cut
short is taken up by the next run.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from umprov.deploy.options import DeployOptions, for_host, settings_for
from umprov.deploy.outcome import HostState, new_outcome
from umprov.deploy.pull import pull_image
from umprov.deploy.push import push_image
from umprov.deploy.rollout import rollout
from umprov.deploy.state import check_host, reserve_tunnel_ports
from umprov.errors import ConfigError, DeployFailed, EngineDown, UmprovError
from umprov.hosts import HostLike
from umprov.hosts.engine import engine_error
from umprov.hosts.fanout import Parallel, workers
from umprov.hosts.progress import Progress, quiet, until_cancelled
from umprov.hosts.results import HostOutcome


def deploy(
    hosts: list[HostLike],
    opts: DeployOptions,
    *,
    progress: Progress = quiet,
    local_client: Any = None,
    forks: int | None = None,
) -> list[HostOutcome]:
    """Deploy to every host; failures are recorded per host, never raised."""
    states = [HostState(h, new_outcome(h.name)) for h in hosts]
    for st in states:
        try:
            st.settings = settings_for(st.host, opts)
            st.opts = for_host(st.host, opts)  # the key allowed into its container
            check_host(st.host, st.settings, st.opts.identity_file)  # its files, ssh_config
        except UmprovError as exc:
            st.fail(exc)
    reserve_tunnel_ports([st.name for st in states if st.live])  # in inventory order
    local_image_id: str | None = None
    if opts.delivery == "push":
        local_image_id = _local_image_id(local_client, states)
    width = workers(forks, len(states))[0]
    pool = Parallel(width)
    say = until_cancelled(progress, pool.cancel)

    def connect(st: HostState) -> None:
        _connect(st, opts, local_image_id, say)

    def reconnect(st: HostState) -> None:  # for the push, which says what it does
        _connect(st, opts, local_image_id, say, again=True)

    def roll_out(st: HostState) -> None:
        _roll_out(st, opts, say, pool.cancel)

    try:
        # A host that has the image is rolled out and let go in one go: at most --forks
        # connections (threads, files) are open, whatever the inventory's size.
        pool.map(lambda st: _once(st, connect, roll_out), states, "deploy")
        lacking = [st for st in states if st.live and st.image_id is None]
        # One docker save streamed to at most --forks hosts at a time, each connected again.
        for start in range(0, len(lacking), width) if opts.delivery == "push" else ():
            batch = lacking[start:start + width]
            pool.map(reconnect, batch, "connect")
            push_image(batch, local_client, pool, say)
            pool.map(lambda st: _once(st, roll_out), batch, "rollout")
    except BaseException:
        pool.stop(close=lambda: _close_clients(states))
        raise
    finally:
        _close_clients(states)
    for st in states:
        st.outcome.data["seconds"] = time.monotonic() - st.started
    return [st.outcome for st in states]


def _once(st: HostState, first: Callable[[HostState], None],
          then: Callable[[HostState], None] | None = None) -> None:
    """One host's step, ``then`` after it once the host has the image; then its connection
    is closed (a host that lacks the image is connected again for the push)."""
    try:
        first(st)
        if then is not None and st.live and st.image_id is not None:
            then(st)
    finally:
        _close_clients([st])


def _close_clients(states: list[HostState]) -> None:
    for st in states:
        if st.client is not None:
            with contextlib.suppress(Exception):
                st.client.close()
            st.client = None


def _local_image_id(local_client: Any, states: list[HostState]) -> str | None:
    """The ID of the image to push, on this machine's engine; None (every host failed) when
    the hosts want different images or this engine lacks it."""
    from docker.errors import ImageNotFound

    refs = {st.settings.image for st in states if st.settings is not None}
    if len(refs) > 1:
        for st in states:
            if st.live:
                st.fail(ConfigError("--push needs one image for all hosts (use --image)"))
        return None
    if not refs:
        return None
    ref = refs.pop()
    try:
        return str(local_client.images.get(ref).id)
    except ImageNotFound:
        err = ConfigError(f"image {ref} is not on this machine's engine, so it cannot be pushed")
        for st in states:
            if st.live:
                st.fail(err)
        return None


def _connect(
    st: HostState, opts: DeployOptions, local_image_id: str | None, progress: Progress,
    *, again: bool = False,
) -> None:
    """A docker client over SSH to the host and the image it holds; ``again``: the host was
    connected before (it lacked the image), so its line says "connecting" once."""
    if not st.live or st.settings is None:
        return
    from docker.errors import DockerException

    from umprov.hosts.engine import docker_client

    try:
        if not again:
            progress(st.name, "connecting")
        st.client = docker_client(st.host, trust_new=opts.trust_new)
        st.image_id = _image_on_host(st, st.settings.image, opts, local_image_id, progress)
    except UmprovError as exc:
        st.fail(exc)
    except DockerException as exc:
        st.fail(EngineDown(f"Docker engine error: {engine_error(exc)}"))
    except Exception as exc:  # noqa: BLE001 - e.g. the connection lost: this host's outcome
        st.fail(st.error(exc))


def _image_on_host(
    st: HostState, image: str, opts: DeployOptions, local_image_id: str | None,
    progress: Progress,
) -> str | None:
    """The ID of the image on the host: already there, or pulled now; None: to be pushed."""
    from docker.errors import APIError, DockerException, ImageNotFound

    if opts.delivery == "push":
        try:
            held = st.client.images.get(local_image_id)
        except ImageNotFound:
            return None
        progress(st.name, "image already present (same ID): no push")
        _name_on_host(held, image, st, progress)
        return local_image_id
    if opts.delivery == "pull":
        progress(st.name, f"pulling {image}")
        try:
            return pull_image(st.client, image, lambda msg: progress(st.name, msg))
        except (APIError, DockerException) as exc:
            raise DeployFailed(f"pulling {image} failed: {engine_error(exc)}") from None
    try:
        return str(st.client.images.get(image).id)
    except ImageNotFound:
        raise DeployFailed(
            f"image {image} is not on the host (deliver it with --push or --pull)"
        ) from None


def _name_on_host(held: Any, image: str, st: HostState, progress: Progress) -> None:
    """The host holds the image under other names only: give it this one too, so that a
    later deploy without --push (which asks by name) finds it."""
    from docker.errors import APIError
    from docker.utils import parse_repository_tag

    if "@" in image or image.startswith("sha256:"):
        return  # a digest or an ID names it already
    repo, tag = parse_repository_tag(image)
    if f"{repo}:{tag or 'latest'}" in (held.tags or []):
        return
    try:
        held.tag(repo, tag or "latest")
        progress(st.name, f"tagged the image there as {image}")
    except APIError as exc:
        raise DeployFailed(f"tagging the image as {image} failed: {engine_error(exc)}") from None


def _roll_out(
    st: HostState, opts: DeployOptions, progress: Progress, cancel: threading.Event | None = None
) -> None:
    if not st.live or st.settings is None or st.image_id is None:
        if st.live:
            st.fail(DeployFailed("no image on the host"))
        return
    try:
        rollout(st.client, st.host, st.settings, st.opts or opts, st.image_id, st.outcome,
                progress,
                cancel=cancel)
        progress(st.name, st.outcome.state)
    except Exception as exc:  # noqa: BLE001 - one host's trouble is its outcome
        st.fail(st.error(exc))
