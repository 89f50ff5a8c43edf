"""Run the playbooks through ansible-runner: events in, progress and per-host results out.

ansible-runner runs ansible-playbook in its own thread; its events arrive on a queue (the
pattern ansible-navigator uses), so the caller's thread owns the terminal. Results are
classified from the play stats, never from ansible-playbook's exit code, which is ambiguous
(2 means both "a host failed" and "bad option").
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from umprov.errors import ConfigError, ExitCode, UmprovError
from umprov.hosts import render
from umprov.hosts.results import HostOutcome, exit_code
from umprov.inventory import Inventory
from umprov.paths import Secret, project_dir, secret_files, state_dir, write_atomic, write_private
from umprov.provision_args import (  # noqa: F401 - the CLI's names for them
    ExtraVars,
    become_ask_pass_configured,
    check_extra_files,
    child_settings,
    extra_vars_file,
    parse_extra,
    parse_extra_vars,
    playbook_args,
    remove_extra_vars_files,
)

STAGES = {"preflight": "preflight", "driver": "driver", "docker": "docker", "toolkit": "toolkit"}
# Facts each role sets at its end to tell the summary what it did (see _note()).
STATUS_FACTS = ("nvidia_driver_status", "docker_engine_status", "nvidia_container_toolkit_status")

KEEP_RUNS = 10
# On an interrupt: how long ansible-playbook gets to stop on its own (SIGINT) before it and
# what it started are killed, and how often ansible-runner's thread checks for a cancel.
STOP_GRACE_S = 5.0
CANCEL_POLL_S = 0.5

# Execution strategies: Mitogen's linear strategy (one persistent Python per host, modules
# sent once) when the mitogen package is importable, else Ansible's own linear strategy with
# ansible.cfg's tuning (pipelining, ControlPersist, forks). "auto" picks the first that works.
STRATEGIES = ("auto", "mitogen", "linear")


def mitogen_strategy_dir() -> Path | None:
    """ansible_mitogen's strategy plugins folder, or None when mitogen is not installed."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("ansible_mitogen")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        strategy = Path(location) / "plugins" / "strategy"
        if (strategy / "mitogen_linear.py").is_file():
            return strategy
    return None


def resolve_strategy(requested: str = "auto") -> tuple[str, dict[str, str]]:
    """The strategy to run with and the environment ansible-playbook needs for it."""
    if requested not in STRATEGIES:
        raise ConfigError(f"unknown strategy {requested!r}; choose one of {', '.join(STRATEGIES)}")
    if requested == "linear":
        return "linear", {"ANSIBLE_STRATEGY": "linear"}
    plugins = mitogen_strategy_dir()
    if plugins is None:
        if requested == "mitogen":
            raise ConfigError(
                "--strategy mitogen: the mitogen package is not installed in umprov's "
                "environment (pip install mitogen), or use --strategy linear"
            )
        return "linear", {"ANSIBLE_STRATEGY": "linear"}
    return "mitogen", {
        "ANSIBLE_STRATEGY_PLUGINS": str(plugins),
        "ANSIBLE_STRATEGY": "mitogen_linear",
        # ansible-core flags every third-party strategy as deprecated; the run's output is ours.
        "ANSIBLE_DEPRECATION_WARNINGS": "False",
    }


@dataclass
class HostCounts:
    """What ansible-runner's events and play stats say of one host, as they arrive."""

    host: str
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0
    changed_tasks: list[str] = field(default_factory=list)
    failure: str | None = None
    notes: list[str] = field(default_factory=list)
    status_facts: dict[str, dict[str, Any]] = field(default_factory=dict)
    untrusted: bool = False  # OpenSSH refused the host's key (unknown or changed)

    @property
    def status(self) -> str:
        if self.unreachable and self.untrusted:
            return "untrusted"
        if self.unreachable:
            return "unreachable"
        if self.failed:
            return "failed"
        return "changed" if self.changed else "ok"

    def outcome(self) -> HostOutcome:
        return HostOutcome(self.host, self.status, self.failure or "", {
            "ok": self.ok,
            "changed": self.changed,
            "failed": self.failed,
            "unreachable": self.unreachable,
            "skipped": self.skipped,
            "changed_tasks": self.changed_tasks,
            "notes": self.notes,
            "roles": self.status_facts,
        })


# A host in `umprov provision --json`.
HOST_FIELDS: list[render.Field] = [
    ("host", render.host),
    ("status", render.state),
    *render.data_fields("ok", "changed", "failed", "unreachable", "skipped", "changed_tasks"),
    ("failure", lambda o: o.detail or None),
    *render.data_fields("notes", "roles"),
]


@dataclass
class ProvisionResult:
    playbook: str
    inventory: str
    check: bool
    hosts: list[HostOutcome]
    elapsed_s: float
    artifacts: str
    strategy: str = "linear"

    @property
    def exit_code(self) -> ExitCode:
        return exit_code(self.hosts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "umprov.provision/1",
            "playbook": self.playbook,
            "inventory": self.inventory,
            "check": self.check,
            "strategy": self.strategy,
            "elapsed_s": round(self.elapsed_s, 2),
            "exit_code": int(self.exit_code),
            "artifacts": self.artifacts,
            "hosts": render.records(self.hosts, HOST_FIELDS),
        }


@dataclass
class Event:
    """A reduced ansible-runner event, enough for progress display."""

    kind: str  # task_start, ok, changed, failed, unreachable, skipped, play
    host: str | None
    task: str
    message: str = ""


EventSink = Callable[[Event], None]


def _truthy(value: Any) -> bool:
    return str(value).lower() in {"true", "1", "yes"}


def _note(fact: str, status: dict[str, Any]) -> str:
    """One short phrase per role for the summary table: what the run did or found."""
    if fact == "nvidia_driver_status":
        version = status.get("version") or "?"
        text = f"driver {version} {status.get('action', '')} ({status.get('kernel_module', '?')})"
        if _truthy(status.get("rebooted")):
            text += ", rebooted"
        elif _truthy(status.get("reboot_required")):
            text += ", REBOOT REQUIRED"
        return text
    if fact == "docker_engine_status":
        return f"docker from {status.get('source', '?')}"
    if fact == "nvidia_container_toolkit_status":
        runtime = (
            "runtime configured"
            if _truthy(status.get("runtime_configured"))
            else "runtime not configured"
        )
        return f"toolkit {status.get('version', '?')}, {runtime}"
    return ""


def _private_dir() -> Path:
    runs = state_dir() / "runs"
    runs.mkdir(parents=True, exist_ok=True, mode=0o700)
    old = sorted(p for p in runs.iterdir() if p.is_dir())
    for stale in old[: max(0, len(old) - KEEP_RUNS + 1)]:
        shutil.rmtree(stale, ignore_errors=True)
    path = runs / f"provision-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    path.mkdir(mode=0o700)
    return path


def _command_errors(stderr: str) -> str:
    """The lines of a failed command's stderr that say why (apt's E: lines before its W: ones)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("E:")]
    warnings = [line for line in lines if line.startswith("W:")]
    return " ".join(errors + warnings) or (lines[-1] if lines else "")


# The shell's words for a missing interpreter (dash, bash), as Mitogen's bootstrap or a module run
# reports them: the raw text ("EOF on stream ...") does not say what to do.
_NO_PYTHON = re.compile(r"(/\S*python[\d.]*): (?:No such file or directory|not found)")


def _short_failure(res: dict[str, Any]) -> str:
    msg = res.get("msg") or res.get("stderr") or res.get("reason") or ""
    # gather_facts nests each fact module's own result under failed_modules.
    nested = res.get("failed_modules")
    parts = [res, *(nested.values() if isinstance(nested, dict) else ())]
    said = (
        str(part.get(k) or "")
        for part in parts if isinstance(part, dict)
        for k in ("msg", "module_stdout", "module_stderr", "stderr")
    )
    missing = _NO_PYTHON.search(" ".join(said))
    if missing:
        return (
            f"no Python at {missing.group(1)} on this host: install python3 there, or set "
            "ansible_python_interpreter for the host in the inventory"
        )
    if msg == "non-zero return code" and res.get("stderr"):
        # A command task's own message says nothing; what the command printed does.
        msg = f"{msg}: {_command_errors(str(res['stderr']))}"
    if not msg and res.get("results"):
        failed = [r for r in res["results"] if isinstance(r, dict) and r.get("failed")]
        if failed:
            msg = failed[0].get("msg") or failed[0].get("stderr") or ""
    return " ".join(str(msg).split())[:300]


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

    ``extra`` is every -e in order (provision_args.parse_extra), ``extra_vars`` pairs after
    them; ``become_password`` answers become (sudo) prompts. Hosts whose SSH key OpenSSH
    refused are "untrusted", with the message every umprov command gives for that key.
    ``on_raw`` sees every ansible-runner event as it arrives (umprov.rolling reads them).
    """
    root = project_dir()
    play_path = root / "playbooks" / playbook
    if not play_path.is_file():
        raise ConfigError(f"playbook not found: {play_path}")
    strategy_used, strategy_env = resolve_strategy(strategy)
    private = _private_dir()
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
        from umprov.errors import Interrupted

        raise Interrupted("interrupted; ansible-playbook was stopped")
    _explain_untrusted(results, inventory)
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
    results: dict[str, HostCounts] = {}
    events: queue.Queue[dict[str, Any] | None] = queue.Queue()
    with _runner_environment():
        thread, runner = _start(private, play_path, limit, options, envvars, cancel, events)
    try:
        for host in inventory.select(limit):
            results[host.name] = HostCounts(host.name)
    except UmprovError:
        pass  # an Ansible pattern richer than select() knows; hosts appear as events arrive
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
            _consume(event, results, on_event)
    except BaseException:  # Ctrl-C, SIGTERM (raised by the CLI's handler) or a crash here
        _stop_playbook(thread, cancel, runner)
        raise
    _wait_thread(thread)
    _scrub_artifacts(Path(runner.config.artifact_dir))
    _apply_stats(runner, results)
    return runner, results


# -e pairs as a private file (provision_args): the name the tests and older callers know.
_extra_vars_file = extra_vars_file


def _start(
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


def _wait_thread(thread: threading.Thread, timeout: float | None = None) -> None:
    """Wait for a thread without Thread.join: a signal interrupting join makes Python 3.11
    mark the thread stopped while it still runs (bpo-45274), and later waits return at once."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while thread.is_alive() and (deadline is None or time.monotonic() < deadline):
        time.sleep(0.1)


def _stop_playbook(thread: threading.Thread, cancel: threading.Event, runner: Any) -> None:
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

    tree = procs.descendants()
    playbooks = [p for p in tree if p.ppid == os.getpid() and "ansible-playbook" in p.cmdline]
    try:
        for proc in playbooks:
            procs.signal_group(proc.pgid, signal.SIGINT)
        _wait_thread(thread, STOP_GRACE_S if playbooks else 0)
    finally:
        cancel.set()  # the runner thread SIGKILLs the group at its next look (CANCEL_POLL_S)
        procs.kill_survivors(tree)  # no-op when SIGINT was enough
        procs.wait_gone(tree, 2)
        _wait_thread(thread, CANCEL_POLL_S + 6)  # it reads the child's last output, up to 5 s
        with contextlib.suppress(Exception):  # the artifacts lose their copy of the environment
            _scrub_artifacts(Path(runner.config.artifact_dir))
        with contextlib.suppress(Exception):
            _settle_rc(Path(runner.config.artifact_dir))


RC_CANCELED = 254  # ansible-runner's rc for a run it canceled


def _settle_rc(artifact_dir: Path) -> None:
    """A playbook killed before ansible-runner saw the cancel leaves ``rc`` saying "None" (the
    child had no exit status, only a signal); record it as the canceled run it was."""
    rc = artifact_dir / "rc"
    if rc.exists() and not rc.read_text().strip().lstrip("-").isdigit():
        write_private(rc, str(RC_CANCELED))


# Variables ansible-playbook and ssh need; ansible-runner copies the whole environment into its
# artifacts, so everything else (tokens, cloud credentials) is left out of the child's.
_ENV_KEEP = {
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TERM",
    "TMPDIR",
    "TZ",
    "SSH_AUTH_SOCK",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "UMPROV_PROJECT_DIR",
    "UMPROV_STATE_DIR",
}
_SECRET_WORDS = ("PASS", "TOKEN", "SECRET", "CREDENTIAL")
# Settings umprov has acted on already and passes on as arguments (provision_args): a
# LABEL@prompt in them would make ansible-playbook wait on a prompt no one sees.
_ALREADY_GIVEN = {"ANSIBLE_VAULT_IDENTITY_LIST"}


def _child_environment() -> dict[str, str]:
    import sys

    env = {}
    for key, value in os.environ.items():
        secret = any(w in key.upper() for w in _SECRET_WORDS) and not key.endswith("_FILE")
        if key in _ALREADY_GIVEN:
            continue
        if key in _ENV_KEEP or (key.startswith("ANSIBLE_") and not secret):
            env[key] = value
    # ansible-playbook from umprov's own environment first: a venv need not be on PATH.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return env


class _runner_environment:  # noqa: N801 - used as a context manager, reads like a function
    """Swap os.environ for the child's while ansible-runner copies it (it reads it once)."""

    def __enter__(self) -> None:
        self.saved = dict(os.environ)
        child = _child_environment()
        os.environ.clear()
        os.environ.update(child)

    def __exit__(self, *_exc: object) -> None:
        os.environ.clear()
        os.environ.update(self.saved)


def _scrub_artifacts(artifact_dir: Path) -> None:
    """Drop the environment that ansible-runner records in artifacts/<id>/command, and the
    run's extra-vars files (private/artifacts/<id> -> private/extravars*.json)."""
    remove_extra_vars_files(artifact_dir.parent.parent)
    command = artifact_dir / "command"
    try:
        data = json.loads(command.read_text())
    except (OSError, ValueError):
        return
    if "env" not in data:
        return
    data.pop("env", None)
    write_atomic(command, json.dumps(data), 0o600)


def _stdout_tail(runner: Any) -> str:
    try:
        text = runner.stdout.read()
    except (OSError, ValueError, AttributeError):
        return ""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    error_lines = [ln for ln in lines if "ERROR" in ln]
    return " ".join((error_lines or lines[-1:])[-1:])[:300]


def _consume(
    event: dict[str, Any], results: dict[str, HostCounts], on_event: EventSink | None
) -> None:
    kind = event.get("event", "")
    data = event.get("event_data", {}) or {}
    host = data.get("host")
    task = str(data.get("task") or data.get("play") or "")
    if host and host not in results:
        results[host] = HostCounts(host)
    reduced: Event | None = None
    if kind == "playbook_on_task_start":
        reduced = Event("task_start", None, task)
    elif kind == "playbook_on_play_start":
        reduced = Event("play", None, str(data.get("play", "")))
    elif kind == "runner_on_ok" and host:
        res = data.get("res", {}) or {}
        facts = res.get("ansible_facts") or {}
        for name in STATUS_FACTS:
            if isinstance(facts.get(name), dict):
                results[host].status_facts[name] = facts[name]
                note = _note(name, facts[name])
                if note:
                    results[host].notes.append(note)
        if res.get("changed"):
            results[host].changed_tasks.append(task)
            reduced = Event("changed", host, task)
        else:
            reduced = Event("ok", host, task)
    elif kind == "runner_on_failed" and host and not data.get("ignore_errors"):
        res = data.get("res", {}) or {}
        results[host].failure = results[host].failure or f"{task}: {_short_failure(res)}"
        reduced = Event("failed", host, task, _short_failure(res))
    elif kind == "runner_on_unreachable" and host:
        res = data.get("res", {}) or {}
        results[host].failure = results[host].failure or f"unreachable: {_short_failure(res)}"
        results[host].untrusted |= host_key_refused(str(res.get("msg") or ""))
        reduced = Event("unreachable", host, task, _short_failure(res))
    elif kind == "runner_on_skipped" and host:
        reduced = Event("skipped", host, task)
    if reduced and on_event:
        on_event(reduced)


# What OpenSSH says when it refuses a host's key (StrictHostKeyChecking=yes), and Mitogen's
# words for the same.
_HOST_KEY_REFUSED = re.compile(
    r"Host key verification failed|REMOTE HOST IDENTIFICATION HAS CHANGED|"
    r"No \S+ host key is known for|reported an unrecognized or mismatching host key", re.I)


def host_key_refused(message: str) -> bool:
    return bool(_HOST_KEY_REFUSED.search(message))


def _explain_untrusted(results: dict[str, HostCounts], inventory: Inventory) -> None:
    """A host whose key OpenSSH refused gets the one message every umprov command gives for
    an unknown or changed key (the key is read again to say which)."""
    from umprov.hosts.ssh import untrusted_message

    hosts = {h.name: h for h in inventory.hosts}
    for name, counts in results.items():
        if counts.untrusted and name in hosts:
            counts.failure = untrusted_message(hosts[name])


def _apply_stats(runner: Any, results: dict[str, HostCounts]) -> None:
    stats = runner.stats or {}
    for key, attr in (
        ("ok", "ok"),
        ("changed", "changed"),
        ("failures", "failed"),
        ("dark", "unreachable"),
        ("skipped", "skipped"),
    ):
        for host, count in (stats.get(key) or {}).items():
            results.setdefault(host, HostCounts(host))
            setattr(results[host], attr, int(count))
    # Hosts that never ran (e.g. a failed preflight stopped the play) are not "ok".
    ran = set().union(*[set(stats.get(k) or {}) for k in ("ok", "failures", "dark", "skipped")])
    for host, result in results.items():
        if stats and host not in ran and not result.failure:
            result.failure = "did not run (stopped before reaching this host)"
            result.failed = 1
        elif stats and host in ran and result.failure and not (result.failed or result.unreachable):
            # A task failed and its block's rescue recovered (e.g. dpkg left interrupted by a
            # run that was stopped or lost its host: finished, the task run again). The host
            # converged: what happened is a note, not its failure.
            result.notes.append(f"recovered: {result.failure}"[:300])
            result.failure = None
