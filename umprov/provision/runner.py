"""ansible-playbook through ansible-runner: started in its own thread, its events read on the
caller's (the pattern ansible-navigator uses, so the caller owns the terminal), stopped within
seconds on an interrupt."""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from umprov.errors import ConfigError, Interrupted, UmprovError
from umprov.inventory import Inventory
from umprov.paths import Secret, content_dir, secret_files
from umprov.procs import wait_thread
from umprov.provision.args import ExtraVars, child_settings, playbook_args
from umprov.provision.environment import (
    private_dir,
    resolve_strategy,
    runner_environment,
    scrub_artifacts,
    settle_rc,
)
from umprov.provision.results import (
    EventSink,
    HostCounts,
    ProvisionResult,
    apply_stats,
    consume,
    explain_untrusted,
)

# On an interrupt: how long ansible-playbook gets to stop on its own (SIGINT) before it and
# what it started are killed, and how often ansible-runner's thread checks for a cancel.
STOP_GRACE_S = 5.0
CANCEL_POLL_S = 0.5


def playbook_path(playbook: str) -> Path:
    """umprov's playbooks/PLAYBOOK; ConfigError when there is none."""
    path = content_dir() / "playbooks" / playbook
    if not path.is_file():
        raise ConfigError(f"playbook not found: {path}")
    return path


def run_playbook(
    inventory: Inventory,
    *,
    playbook: str = "site.yml",
    limit: str | None = None,
    tags: Sequence[str] = (),
    check: bool = False,
    diff: bool = False,
    extra_vars: dict[str, Any] | None = None,
    extra: Sequence[ExtraVars] = (),
    become_password: Secret | None = None,
    forks: int | None = None,
    on_event: EventSink | None = None,
    cancel: threading.Event | None = None,
    strategy: str = "auto",
    on_raw: Callable[[dict[str, Any]], None] | None = None,
) -> ProvisionResult:
    """Run a playbook from playbooks/ against an inventory and collect per-host results.

    ``extra`` is every -e in order (args.parse_extra), ``extra_vars`` pairs after
    them; ``become_password`` answers become (sudo) prompts. Hosts whose SSH key OpenSSH
    refused are "untrusted", with the message every umprov command gives for that key.
    ``on_raw`` sees every ansible-runner event as it arrives (umprov.rolling reads them).
    """
    root = content_dir()
    play_path = playbook_path(playbook)
    strategy_used, strategy_env = resolve_strategy(strategy)
    private = private_dir()
    options: list[str] = ["--tags", ",".join(tags)] if tags else []
    options += [flag for flag, wanted in (("--check", check), ("--diff", diff)) if wanted]
    options += ["--forks", str(forks)] if forks else []
    plan = [*extra, *([extra_vars] if extra_vars else [])]
    started = time.monotonic()
    with secret_files() as write_secret:
        options += playbook_args(inventory, write_secret, extra=plan,
                                 become_password=become_password)
        runner, results = _run(private, play_path, inventory, limit, options,
                               child_settings(root, inventory, strategy_env),
                               cancel or threading.Event(), on_event, on_raw)
    if (
        runner.status in {"failed", "error"}
        and not any(r.failed or r.unreachable for r in results.values())
        and runner.rc not in (0, None)
    ):
        tail = _stdout_tail(runner)
        raise UmprovError(f"ansible-playbook failed (exit {runner.rc}) before any host ran: {tail}")
    if runner.status == "canceled":
        raise Interrupted("interrupted; ansible-playbook was stopped")
    explain_untrusted(results, inventory)
    return ProvisionResult(
        playbook=str(play_path.relative_to(root)),
        inventory=inventory.source,
        check=check,
        hosts=[results[k].outcome() for k in sorted(results)],
        elapsed_s=time.monotonic() - started,
        artifacts=str(private),
        strategy=strategy_used,
    )


def _run(
    private: Path,
    play_path: Path,
    inventory: Inventory,
    limit: str | None,
    options: list[str],
    envvars: dict[str, str],
    cancel: threading.Event,
    on_event: EventSink | None,
    on_raw: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[Any, dict[str, HostCounts]]:
    """ansible-playbook through ansible-runner; its events to ``on_event`` as they come."""
    # The hosts --limit selects, by Ansible's own matching, as ansible-playbook will.
    results = {host.name: HostCounts(host.name) for host in inventory.select(limit)}
    events: queue.Queue[dict[str, Any] | None] = queue.Queue()
    with runner_environment():
        thread, runner = start(private, play_path, limit, options, envvars, cancel, events)
    try:
        while True:
            try:
                event = events.get(timeout=0.2)
            except queue.Empty:
                if not thread.is_alive() and events.empty():
                    break
                continue
            if event is None:
                break
            if on_raw:
                on_raw(event)
            consume(event, results, on_event)
    except BaseException:  # Ctrl-C, SIGTERM (raised by the CLI's handler) or a crash here
        stop_playbook(thread, cancel, runner)
        raise
    wait_thread(thread)
    scrub_artifacts(Path(runner.config.artifact_dir))
    apply_stats(runner, results)
    return runner, results


def start(
    private: Path,
    play_path: Path,
    limit: str | None,
    options: list[str],
    envvars: dict[str, str],
    cancel: threading.Event,
    events: queue.Queue[dict[str, Any] | None],
) -> tuple[threading.Thread, Any]:
    import shlex

    import ansible_runner

    return ansible_runner.run_async(
        private_data_dir=str(private),
        # ansible-playbook runs where umprov runs, so a relative path in the inventory (a key
        # file, a known_hosts file) means what it means to umprov and to ansible-playbook.
        project_dir=os.getcwd(),
        playbook=str(play_path),
        inventory=[],  # the sources are in ``options`` (-i, as many as given)
        limit=limit,
        cmdline=shlex.join(options) or None,
        envvars=envvars,
        event_handler=lambda event: events.put(event) or True,
        cancel_callback=cancel.is_set,
        finished_callback=lambda _r: events.put(None),
        quiet=True,
        suppress_env_files=True,
        suppress_ansible_output=True,
        timeout=None,
        # How often the runner thread looks at cancel_callback (default every 5 s).
        settings={"pexpect_timeout": CANCEL_POLL_S},
    )


def stop_playbook(thread: threading.Thread, cancel: threading.Event, runner: Any) -> None:
    """Stop ansible-playbook and everything it started, within a few seconds.

    ansible-playbook runs in its own session (ansible-runner's pty), so the terminal's Ctrl-C
    never reaches it. It gets SIGINT first, which it handles as a user's interrupt: workers
    stopped, Mitogen's connections shut down, remote commands ended with their SSH session.
    What still runs after STOP_GRACE_S is killed: ansible-runner SIGKILLs the process group on
    cancel, and the processes that left that group (Mitogen's multiplexers call setsid) are
    killed from the snapshot of the process tree taken before anything was signalled.
    """
    import signal

    from umprov import procs

    # Only the playbooks' own trees: this process may have other children (an engine a test
    # started, a caller's workers) that are not ansible-playbook's to take down.
    playbooks = [p for p in procs.descendants()
                 if p.ppid == os.getpid() and "ansible-playbook" in p.cmdline]
    tree = [q for p in playbooks for q in (p, *procs.descendants(p.pid))]
    try:
        for proc in playbooks:
            procs.signal_group(proc.pgid, signal.SIGINT)
        wait_thread(thread, STOP_GRACE_S if playbooks else 0)
    finally:
        cancel.set()  # the runner thread SIGKILLs the group at its next look (CANCEL_POLL_S)
        procs.kill_survivors(tree)  # no-op when SIGINT was enough
        procs.wait_gone(tree, 2)
        wait_thread(thread, CANCEL_POLL_S + 6)  # it reads the child's last output, up to 5 s
        with contextlib.suppress(Exception):  # the artifacts lose their copy of the environment
            scrub_artifacts(Path(runner.config.artifact_dir))
        with contextlib.suppress(Exception):
            settle_rc(Path(runner.config.artifact_dir))


def _stdout_tail(runner: Any) -> str:
    try:
        text = runner.stdout.read()
    except (OSError, ValueError, AttributeError):
        return ""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    error_lines = [ln for ln in lines if "ERROR" in ln]
    return " ".join((error_lines or lines[-1:])[-1:])[:300]
