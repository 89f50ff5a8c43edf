"""Rolling out on one host: create, keep or replace the container; wait until it answers;
pin its SSH host key; store its token and how to reach it.

Same spec hash as the container there: nothing happens (same container ID). Otherwise the
container is replaced: the old one is stopped and set aside (renamed NAME-replaced-MS) until
the new one starts, and put back if it does not. An interrupted run (``cancel`` set: Ctrl-C,
SIGTERM) stops between two steps; whatever it left is taken up by the next run.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import threading
import time
from collections.abc import Mapping
from typing import Any

from umprov.deploy.options import DeployOptions, HostSettings
from umprov.deploy.spec import (
    HASH_LABEL,
    LABEL,
    POOL_LABEL,
    TOKEN_PATH,
    changed_settings,
    container_spec,
    create_kwargs,
    labels_for,
    pool_warning,
    token_tar,
)
from umprov.deploy.state import (
    key_patterns,
    record_connection,
    render_ssh_config,
    ssh_config_path,
    stored_token,
    token_path,
)
from umprov.errors import Cancelled, DeployFailed
from umprov.hosts import HostLike
from umprov.hosts.engine import engine_error, exec_in
from umprov.hosts.fanout import checkpoint
from umprov.hosts.progress import Progress, quiet
from umprov.hosts.results import HostOutcome
from umprov.hosts.ssh import pin_host_key, pinned_keys
from umprov.paths import write_private

READY_TIMEOUT = 120.0
EXEC_TIMEOUT = 60.0  # a short command in the container (health check, reading a file)
ASIDE = "-replaced-"  # NAME-replaced-MILLISECONDS: the old container during a replacement


def rollout(
    client: Any,
    host: HostLike,
    settings: HostSettings,
    opts: DeployOptions,
    image_id: str,
    outcome: HostOutcome,
    progress: Progress = quiet,
    *,
    cancel: threading.Event | None = None,
) -> None:
    """Create, keep or replace the container on one host; then pin its key, store its token.

    What an interrupted run left is taken up here: a container set aside by a replacement
    that never finished is the old container again, one created but never started is
    replaced, a started one whose token or key was not recorded yet gets them now.
    """
    spec = container_spec(settings, image_id, opts.authorized_keys, shm_size=opts.shm_size,
                          agent_forwarding=opts.agent_forwarding)
    labels = labels_for(spec, settings.image)
    image = client.images.get(image_id)
    login_user = (image.labels or {}).get("org.umprov.user") or "umprov"
    _managed_memory(image.labels or {}, settings, outcome)
    old, aside = _current(client, host, settings, progress)
    checkpoint(cancel)
    token: str | None = None
    if (
        old is not None
        and not opts.force
        and old.labels.get(HASH_LABEL) == labels[HASH_LABEL]
        and _started_once(old)  # created but never started: its token may not be in it
    ):
        container = old
        if old.status != "running":
            progress(host.name, "starting the stopped container")
            old.start()
            outcome.state = "started"
        else:
            outcome.state = "unchanged"
    else:
        token = secrets.token_urlsafe(32)
        if old is not None:
            _say_why(old, labels, opts, outcome)
        container = _replace(client, host, old, spec, labels, token, settings, progress, cancel)
        outcome.state = "replaced" if old is not None else "created"
    for stale in aside:  # left by an interrupted run; the container is in place now
        with contextlib.suppress(Exception):
            stale.remove(force=True)
    progress(host.name, "waiting for sshd and Jupyter")
    _wait_ready(container, cancel=cancel)
    checkpoint(cancel)
    key_line, own_token = _read_key_and_token(container, kept=token is None)
    _pin_host_key(key_line, host, settings, outcome, progress)
    _store_token(host.name, token, own_token)
    identity = opts.identity_file
    write_private(ssh_config_path(host.name),
                  render_ssh_config(host, settings, login_user, identity))
    conn = record_connection(host, settings, login_user, identity)
    outcome.data.update(
        container_id=container.id,
        image_id=image_id,
        ssh=f"ssh -F {conn['ssh_config']} {conn['alias']}",
        jupyter=f"{conn['address']}:{settings.jupyter_port}"
        + (f" (on {host.name})" if conn["via_host"] else ""),
    )


def _managed_memory(image_labels: Mapping[str, str], settings: HostSettings,
                    outcome: HostOutcome) -> None:
    """Whether the pool is asked for and whether the image carries it; a warning when it is
    asked for and the image does not say it has it."""
    held = image_labels.get(POOL_LABEL)
    outcome.data.update(managed_memory=settings.managed_memory,
                        managed_memory_pool={"1": True, "0": False}.get(held or ""))
    warning = pool_warning(image_labels, settings.image) if settings.managed_memory else None
    if warning:
        outcome.data["warnings"].append(warning)


def _say_why(old: Any, labels: Mapping[str, str], opts: DeployOptions,
             outcome: HostOutcome) -> None:
    """Which settings the replacement changes, into the outcome (``changed``, the message)."""
    if old.labels.get(HASH_LABEL) != labels[HASH_LABEL]:
        changed = changed_settings(old.labels, labels)
    else:
        changed = ["--force" if opts.force else "the old container was never started"]
    outcome.data["changed"] = changed
    _note(outcome, f"replaced: {', '.join(changed)}")
    # The new container has a token of its own: the old Jupyter URL stops working.
    _note(outcome, f"new Jupyter token: `umprov status --connect {outcome.host}` gives its URL")


def _note(outcome: HostOutcome, text: str) -> None:
    outcome.detail = "; ".join(part for part in (outcome.detail, text) if part)


def _current(
    client: Any, host: HostLike, settings: HostSettings, progress: Progress
) -> tuple[Any, list[Any]]:
    """(umprov's container of that name or None, containers an interrupted run set aside)."""
    from docker.errors import NotFound

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
        # old container again (compared, kept or replaced like any other).
        old = aside.pop(0)
        progress(host.name, f"taking back {old.name}, set aside by an interrupted run")
        old.rename(settings.name)
        old.reload()
    return old, aside


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

    if old is not None:
        progress(host.name, "stopping the old container")
        old.stop(timeout=20)
        old.rename(f"{settings.name}{ASIDE}{int(time.time() * 1000)}")
    new = None
    try:
        checkpoint(cancel)
        progress(host.name, "creating the container")
        new = client.containers.create(**create_kwargs(spec, labels))
        new.put_archive("/", token_tar(token))
        checkpoint(cancel)
        progress(host.name, "starting the container")
        new.start()
    except Cancelled:
        # Interrupted: put the host back as it was, as far as there is time (the next run
        # takes up whatever is left: see rollout).
        _put_back(new, old, settings.name, Exception)
        raise
    except APIError as exc:
        _put_back(new, old, settings.name, (APIError, NotFound))
        raise start_failure(exc, settings) from None
    if old is not None:
        with contextlib.suppress(APIError, NotFound):
            old.remove(force=True)
    return new


def _put_back(
    new: Any, old: Any, name: str, ignore: type[Exception] | tuple[type[Exception], ...]
) -> None:
    """Remove the new container and give the old one back its name and its run."""
    if new is not None:
        with contextlib.suppress(ignore):
            new.remove(force=True)
    if old is not None:
        with contextlib.suppress(ignore):
            old.rename(name)
            old.start()


def start_failure(exc: BaseException, settings: HostSettings) -> DeployFailed:
    text = engine_error(exc)
    if "port is already allocated" in text or "address already in use" in text:
        match = re.search(r":(\d+)\b(?!.*:\d+)", text)
        port = match.group(1) if match else f"{settings.ssh_port} or {settings.jupyter_port}"
        return DeployFailed(f"port {port} on {settings.bind} is already in use on the host")
    if "runtime" in text and "nvidia" in text:
        return DeployFailed(
            "the nvidia runtime is not configured on this host (provision it, or deploy "
            "with --gpus none)"
        )
    return DeployFailed(f"starting the container failed: {text}")


def _exec(container: Any, cmd: list[str]) -> tuple[int | None, str]:
    return exec_in(container, cmd, EXEC_TIMEOUT, user="root")


def _wait_ready(
    container: Any, timeout: float = READY_TIMEOUT, cancel: threading.Event | None = None
) -> None:
    """Until sshd and Jupyter answer inside the container: Docker's own run of the image's
    health check says healthy (a kept container: it ran within the last interval), or the
    same check, run now, passes (a new one: Docker's first run is up to an interval away)."""
    deadline = time.monotonic() + timeout
    while True:
        checkpoint(cancel)
        container.reload()
        state = container.attrs["State"]
        if state.get("Status") in ("exited", "dead") or state.get("Restarting"):
            logs = container.logs(tail=5).decode(errors="replace")
            last = " | ".join(ln for ln in logs.splitlines() if ln.strip())[-300:]
            raise DeployFailed(f"the container stopped (exit {state.get('ExitCode')}): {last}")
        if state.get("Running"):
            if (state.get("Health") or {}).get("Status") == "healthy":
                return
            rc, _ = _exec(container, ["/usr/local/bin/umprov-healthcheck"])
            if rc == 0:
                return
        if time.monotonic() > deadline:
            raise DeployFailed(f"sshd and Jupyter did not answer within {timeout:.0f} s")
        time.sleep(0.5)


HOST_KEY_PATH = "/etc/ssh/keys/ssh_host_ed25519_key.pub"


def _read_key_and_token(container: Any, *, kept: bool) -> tuple[str, str | None]:
    """The container's SSH host key line, read through Docker over the verified host
    connection (so it is the container's true key), and for a kept container its own token
    (None when it has none): one exec."""
    rc, out = _exec(container, ["sh", "-c", 'cat "$1" && echo && cat "$2"', "sh", HOST_KEY_PATH,
                                TOKEN_PATH if kept else "/dev/null"])
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    if not lines or not lines[0].startswith("ssh-"):
        raise DeployFailed("cannot read the container's SSH host key")
    return lines[0], (lines[1] if kept and rc == 0 and len(lines) == 2 else None)


def _pin_host_key(
    key_line: str, host: HostLike, settings: HostSettings, outcome: HostOutcome,
    progress: Progress,
) -> None:
    """The container's SSH host key pinned in umprov's known_hosts."""
    patterns = key_patterns(host, settings)
    before = pinned_keys(patterns[0])
    pin_host_key(patterns, key_line)
    if before and " ".join(key_line.split()[:2]) not in before:
        message = "the container's SSH host key changed: pinned the new one"
        _note(outcome, message)
        progress(host.name, message)


def _store_token(host_name: str, token: str | None, own_token: str | None) -> None:
    """Keep the new container's token here (0600); for a kept container, its own token."""
    # A kept container's own token is the truth: the file here may be lost, or hold the
    # token of the container that a run interrupted after starting this one replaced.
    if token is None and own_token and stored_token(host_name) != own_token:
        token = own_token
    if token is not None:
        write_private(token_path(host_name), token + "\n")
