"""What ansible-runner's events and play stats say of each host: the counts, the roles' notes,
the first failure in words a person can act on, and the result `umprov provision` reports."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from umprov.errors import ExitCode
from umprov.hosts import render
from umprov.hosts.results import HostOutcome, exit_code
from umprov.hosts.ssh import plain_reason
from umprov.inventory import Inventory

# Facts each role sets at its end to tell the summary what it did (see role_note()).
STATUS_FACTS = ("nvidia_driver_status", "docker_engine_status", "nvidia_container_toolkit_status")


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


def role_note(fact: str, status: dict[str, Any]) -> str:
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


def _command_errors(stderr: str) -> str:
    """The lines of a failed command's stderr that say why (apt's E: lines before its W: ones)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("E:")]
    warnings = [line for line in lines if line.startswith("W:")]
    return " ".join(errors + warnings) or (lines[-1] if lines else "")


# The shell's words for a missing interpreter (dash, bash), as Mitogen's bootstrap or a module run
# reports them: the raw text ("EOF on stream ...") does not say what to do.
_NO_PYTHON = re.compile(r"(/\S*python[\d.]*): (?:No such file or directory|not found)")


def short_failure(res: dict[str, Any]) -> str:
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
    return plain_reason(msg)[:300]


def consume(
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
                note = role_note(name, facts[name])
                if note:
                    results[host].notes.append(note)
        if res.get("changed"):
            results[host].changed_tasks.append(task)
            reduced = Event("changed", host, task)
        else:
            reduced = Event("ok", host, task)
    elif kind == "runner_on_failed" and host and not data.get("ignore_errors"):
        res = data.get("res", {}) or {}
        results[host].failure = results[host].failure or f"{task}: {short_failure(res)}"
        reduced = Event("failed", host, task, short_failure(res))
    elif kind == "runner_on_unreachable" and host:
        res = data.get("res", {}) or {}
        results[host].failure = results[host].failure or f"unreachable: {short_failure(res)}"
        results[host].untrusted |= host_key_refused(str(res.get("msg") or ""))
        reduced = Event("unreachable", host, task, short_failure(res))
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


def explain_untrusted(results: dict[str, HostCounts], inventory: Inventory) -> None:
    """A host whose key OpenSSH refused gets the one message every umprov command gives for
    an unknown or changed key (the key is read again to say which)."""
    from umprov.hosts.ssh import untrusted_message

    hosts = {h.name: h for h in inventory.hosts}
    for name, counts in results.items():
        if counts.untrusted and name in hosts:
            counts.failure = untrusted_message(hosts[name])


def apply_stats(runner: Any, results: dict[str, HostCounts]) -> None:
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
