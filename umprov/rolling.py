"""`umprov provision --rolling`: playbooks/rolling.yml through ansible-runner, and what it did
per batch, read from its events.

The playbook holds, changes and gates each host with the slurm_gpu_health wrapper, whose steps
print one JSON object each (verify/agent/nodehealth.py); a batch is one start of the rolling
play (Ansible starts a serial play once per batch). From those events each host gets its
batch, what changed on it (provision's notes: the driver installed, a reboot), what verified
it (the gate's mode and verdict), and how it was left: skipped, resumed, in service, or
drained with the reason the scheduler now shows. An interrupted rollout says the same of
the hosts it reached.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from umprov.errors import ExitCode
from umprov.hosts import render
from umprov.hosts.results import HostOutcome, exit_code

PLAYBOOK = "rolling.yml"
PLAY = "Roll the change over the hosts, gated by the verifier"
# The playbook's steps whose results the summary reads (a unit test keeps them in step).
PROBE = "Look at the node before the change"
DECIDE = "Decide whether the host needs the change"
HOLD = "Hold the node for the change and wait for its jobs"
GATE = "Verify the host and resume it only on a pass"
RELABEL = "Keep the node drained with the reason it failed"
STEPS = (PROBE, DECIDE, HOLD, GATE, RELABEL)
# --only's components, as the roles a rolling change runs.
ROLES = {"driver": "nvidia_driver", "docker": "docker_engine",
         "toolkit": "nvidia_container_toolkit"}


def rolling_vars(*, canary: int | None = None, batch: str | None = None,
                 max_fail: int | None = None, verify: str | None = None,
                 drain_timeout: int | None = None, only: Sequence[str] = ()) -> dict[str, Any]:
    """The playbook's variables for the options given (the playbook has the defaults)."""
    given = {"umprov_rolling_canary": canary, "umprov_rolling_batch": batch,
             "umprov_rolling_max_fail_percentage": max_fail, "umprov_rolling_verify": verify,
             "umprov_rolling_drain_timeout": drain_timeout}
    out: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    if batch is not None and batch.isdigit():
        out["umprov_rolling_batch"] = int(batch)
    if only:
        out["umprov_rolling_roles"] = [ROLES[c] for c in ROLES if c in only]
    return out


@dataclass
class HostSteps:
    """What the rolling play's steps said of one host."""

    batch: int | None = None
    skip: bool = False
    hold_began: bool = False  # its batch's hold had started (its result may never come)
    steps: dict[str, dict[str, Any]] = field(default_factory=dict)  # step -> its JSON
    failed: dict[str, str] = field(default_factory=dict)  # step -> its failure


def _json(stdout: Any) -> dict[str, Any]:
    """The agent's JSON line (its last line of stdout); {} when there is none."""
    for line in reversed(str(stdout or "").splitlines()):
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                return {}
            return value if isinstance(value, dict) else {}
    return {}


class Rollout:
    """Fed every ansible-runner event (provision.run_playbook's ``on_raw``)."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.hosts: dict[str, HostSteps] = {}
        self._rolling = False

    def feed(self, event: dict[str, Any]) -> None:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        if kind == "playbook_on_play_start":
            self._rolling = data.get("play") == PLAY or data.get("name") == PLAY
            if self._rolling:
                self.batches.append([])
            return
        if kind == "playbook_on_task_start" and self._rolling and data.get("task") == HOLD:
            for name in self.batches[-1]:
                self.hosts[name].hold_began = True
            return
        host = data.get("host")
        if not self._rolling or not host or not kind.startswith("runner_on_"):
            return
        steps = self.hosts.setdefault(host, HostSteps())
        if steps.batch is None:
            steps.batch = len(self.batches)
            self.batches[-1].append(host)
        self._step(steps, kind, str(data.get("task") or ""), data.get("res") or {})

    @staticmethod
    def _step(steps: HostSteps, kind: str, task: str, res: dict[str, Any]) -> None:
        if task == DECIDE and kind == "runner_on_ok":
            steps.skip = bool((res.get("ansible_facts") or {}).get("umprov_rolling_skip"))
        elif task in STEPS and kind in ("runner_on_ok", "runner_on_failed"):
            found = _json(res.get("stdout"))
            if found:
                steps.steps[task] = found
        if kind == "runner_on_failed":
            said = [ln for ln in res.get("stderr_lines") or [] if ln.strip()]
            steps.failed.setdefault(task, " ".join(str(said[-1] if said else
                                                       res.get("msg") or "").split())[:200])


# -- per host: how the rollout left it
def _changed(prov: HostOutcome) -> str:
    notes = [n for n in prov.data.get("notes") or [] if not n.startswith("recovered:")]
    tasks = len([t for t in prov.data.get("changed_tasks") or [] if t not in STEPS])
    return "; ".join(notes) or (f"{tasks} task(s) changed" if tasks else "")


def _left(prov: HostOutcome, steps: HostSteps | None) -> tuple[str, str, str, str]:
    """(state, action, verified, reason) of one host."""
    if prov.state in ("unreachable", "untrusted"):
        held = (steps.steps.get(HOLD) or {}).get("reason") if steps else None
        return prov.state, prov.state, "", held or prov.detail
    if steps is None or steps.batch is None:
        return "failed", "not reached", "", prov.detail or "the rollout stopped before its batch"
    if steps.skip:
        return "ok", "skipped", "passive pass", "driver at the target, in service"
    gate = steps.steps.get(GATE)
    if gate:
        return _gated(prov, gate)
    hold = steps.steps.get(HOLD)
    why = next(iter(steps.failed.values()), prov.detail)
    if hold:
        relabel = steps.steps.get(RELABEL) or {}
        action = "left drained" if hold.get("action") == "leave" else "drained"
        return "failed", action, "", relabel.get("reason") or hold.get("reason") or why
    return "failed", "failed", "", why


def _gated(prov: HostOutcome, gate: dict[str, Any]) -> tuple[str, str, str, str]:
    verified = f"{gate.get('mode', '?')} {gate.get('verdict', '?')}"
    before = gate.get("before") or {}
    if gate.get("action") == "resume":
        return "changed", "resumed", verified, ""
    if gate.get("action") == "drain":
        return "failed", "drained", verified, str(gate.get("reason") or "")
    if gate.get("verdict") == "fail":
        return "failed", "left drained", verified, str(before.get("reason") or gate.get("why"))
    if "DRAIN" in str(before.get("state", "")).split("+"):
        return "ok", "left drained", verified, str(before.get("reason") or gate.get("why"))
    return ("changed" if prov.state == "changed" else "ok"), "in service", verified, ""


def host_outcomes(provisioned: Sequence[HostOutcome], rollout: Rollout) -> list[HostOutcome]:
    out = []
    for prov in provisioned:
        steps = rollout.hosts.get(prov.host)
        state, action, verified, reason = _left(prov, steps)
        out.append(HostOutcome(prov.host, state, reason, {
            "batch": steps.batch if steps else None, "action": action, "verified": verified,
            "changed": _changed(prov), "reason": reason}))
    return out


def interrupted_lines(rollout: Rollout) -> list[str]:
    """For an interrupted rollout: how each host it reached was left, one line each."""
    lines = []
    for name, steps in sorted(rollout.hosts.items(), key=lambda kv: (kv[1].batch or 0, kv[0])):
        if steps.skip or not (steps.steps.get(HOLD) or steps.hold_began):
            continue
        if not steps.steps.get(HOLD):  # stopped inside the hold, e.g. waiting for its jobs
            lines.append(f"{name} (batch {steps.batch}): stopped during its hold: drained with "
                         f"'umprov: rolling ...' once its scontrol ran (sinfo -R -n {name})")
            continue
        prov = HostOutcome(name, "failed")
        _state, action, _verified, reason = _left(prov, steps)
        text = f"{name} (batch {steps.batch}): {action}" + (f": {reason}" if reason else "")
        lines.append(text)
    return lines


# -- the run and its rendering
FIELDS: list[render.Field] = [
    ("host", render.host),
    ("status", render.state),
    *render.data_fields("batch", "action", "verified", "changed", "reason"),
]
COLUMNS: list[render.Field] = [
    ("host", render.host),
    ("left", render.datum("action")),
    ("verified", render.datum("verified")),
    ("changed", render.datum("changed")),
    ("reason", render.datum("reason")),
]


def planned_batches(total: int, variables: dict[str, Any]) -> list[int]:
    """The batch sizes Ansible's ``serial`` gives the rolling play over ``total`` hosts: the
    canary, then each of umprov_rolling_batch's sizes (a count or a percent of all hosts, at
    least 1), the last one repeated; the playbook's defaults where a variable is not given."""
    specs = [str(variables.get("umprov_rolling_canary", 1)),
             *str(variables.get("umprov_rolling_batch", "25%")).split(",")]

    def size(spec: str) -> int:
        spec = spec.strip()
        if spec.endswith("%"):
            return max(1, int(float(spec[:-1]) * total / 100))
        return max(1, int(spec))

    sizes: list[int] = []
    while sum(sizes) < total:
        sizes.append(min(size(specs[min(len(sizes), len(specs) - 1)]), total - sum(sizes)))
    return sizes


@dataclass
class RollingResult:
    playbook: str
    inventory: str
    elapsed_s: float
    artifacts: str
    hosts: list[HostOutcome]
    batches: list[list[str]]
    planned: list[int] = field(default_factory=list)  # planned_batches
    max_fail_percent: int = 0

    def stopped_by_budget(self) -> str | None:
        """Why hosts were never reached, when a batch's failures passed the failure budget."""
        missed = [o for o in self.hosts if o.data.get("batch") is None]
        if not missed or not self.batches:
            return None
        last = self.batches[-1]
        failed = [o.host for o in self.hosts if o.host in last and not o.ok]
        if not failed:
            return None
        return (f"the rollout stopped after batch {len(self.batches)}: {len(failed)} of its "
                f"{len(last)} host(s) failed, over the failure budget of "
                f"{self.max_fail_percent} % (--max-fail-percent); {len(missed)} host(s) not "
                "reached")

    @property
    def exit_code(self) -> ExitCode:
        return exit_code(self.hosts)

    def batch_outcomes(self) -> list[tuple[str, list[HostOutcome]]]:
        """(title, outcomes) per batch, then the hosts no batch reached."""
        by_name = {o.host: o for o in self.hosts}
        out = []
        planned = max(len(self.batches), len(self.planned))
        for i, names in enumerate(self.batches, 1):
            kind = " (canary)" if i == 1 else ""
            title = f"batch {i} of {planned}{kind}: {len(names)} host(s)"
            out.append((title, [by_name[n] for n in sorted(names) if n in by_name]))
        missed = [o for o in self.hosts if o.data.get("batch") is None]
        if missed:
            out.append((f"not reached: {len(missed)} host(s)", missed))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "umprov.rolling/1",
            "playbook": self.playbook,
            "inventory": self.inventory,
            "elapsed_s": round(self.elapsed_s, 2),
            "exit_code": int(self.exit_code),
            "artifacts": self.artifacts,
            "batches": [sorted(b) for b in self.batches],
            "hosts": render.records(self.hosts, FIELDS),
        }


def run_rolling(inventory: Any, rollout: Rollout, *, agent: str, variables: dict[str, Any],
                extra: Sequence[Any] = (), **options: Any) -> RollingResult:
    """playbooks/rolling.yml through provision.run_playbook (``options``: its keywords);
    ``agent`` is the zipapp the hosts get, ``variables`` the rollout's (rolling_vars)."""
    from umprov.provision import run_playbook

    result = run_playbook(inventory, playbook=PLAYBOOK,
                          extra=[{"slurm_gpu_health_agent_src": agent}, *extra],
                          extra_vars=variables, on_raw=rollout.feed, **options)
    outcomes = host_outcomes(result.hosts, rollout)
    return RollingResult(result.playbook, result.inventory, result.elapsed_s, result.artifacts,
                         outcomes, rollout.batches, planned_batches(len(outcomes), variables),
                         int(variables.get("umprov_rolling_max_fail_percentage", 0)))
