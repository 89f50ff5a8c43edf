"""The schedulers umprov acts on: Slurm through its own commands, or user hook commands.

Both give the same four operations (show, drain, resume, jobs), so the rules of slurm.py
decide the same way whatever runs the jobs. Slurm: ``scontrol show node -o``, ``scontrol
update nodename=... state=drain|resume``, ``squeue -w``. Hooks (another scheduler): shell
commands given with ``--drain-command`` / ``--resume-command`` / ``--jobs-command``, which get
the node in UMPROV_NODE and the reason in UMPROV_REASON; umprov keeps the reason it drained
with in a marker file, since it cannot ask that scheduler.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Sequence

from .slurm import Node, parse_node

Run = Callable[[Sequence[str]], "tuple[int, str, str]"]
TIMEOUT_S = 60.0
# squeue states of a job that still holds the node's resources
JOB_STATES = "CONFIGURING,RUNNING,SUSPENDED,COMPLETING,STOPPED"


class SchedulerError(RuntimeError):
    pass


def run_command(argv: Sequence[str], env: dict[str, str] | None = None,
                timeout: float = TIMEOUT_S) -> tuple[int, str, str]:
    """(exit code, stdout, stderr); a command that is missing or hangs raises SchedulerError."""
    try:
        res = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,  # noqa: S603
                             env={**os.environ, **(env or {})}, errors="replace")
    except FileNotFoundError:
        raise SchedulerError(f"{argv[0]} not found on this host") from None
    except subprocess.TimeoutExpired:
        raise SchedulerError(f"{argv[0]} did not answer within {timeout:.0f} s") from None
    return res.returncode, res.stdout, res.stderr


def _said(rc: int, out: str, err: str) -> str:
    return " ".join((err.strip() or out.strip() or f"exit code {rc}").split())[:200]


class Slurm:
    def __init__(self, run: Run = run_command) -> None:
        self.run = run

    def _call(self, *argv: str) -> str:
        rc, out, err = self.run(argv)
        if rc != 0:
            raise SchedulerError(f"{' '.join(argv[:3])}: {_said(rc, out, err)}")
        return out

    def show(self, name: str) -> Node:
        out = self._call("scontrol", "show", "node", "-o", name)
        lines = [ln for ln in out.splitlines() if ln.startswith("NodeName=")]
        if not lines:
            raise SchedulerError(f"scontrol show node {name}: no node line in its output")
        return parse_node(lines[0])

    def drain(self, name: str, reason: str) -> None:
        self._call("scontrol", "update", f"nodename={name}", "state=drain", f"reason={reason}")

    def resume(self, name: str) -> None:
        self._call("scontrol", "update", f"nodename={name}", "state=resume")

    def jobs(self, name: str) -> list[str]:
        out = self._call("squeue", "-h", "-w", name, "-t", JOB_STATES, "-o", "%A")
        return [w for w in out.split() if w]


class Hooks:
    """Another scheduler, through the user's commands; the reason lives in ``marker``."""

    def __init__(self, drain: str, resume: str, jobs: str = "", marker: str = "",
                 run: Callable[..., tuple[int, str, str]] = run_command) -> None:
        self.commands = {"drain": drain, "resume": resume, "jobs": jobs}
        self.marker = marker or "/var/lib/umprov/drained"
        self.run = run

    def _hook(self, what: str, name: str, reason: str = "") -> str:
        command = self.commands[what]
        if not command:
            return ""
        rc, out, err = self.run(["sh", "-c", command],
                                env={"UMPROV_NODE": name, "UMPROV_REASON": reason})
        if rc != 0:
            raise SchedulerError(f"the {what} command failed: {_said(rc, out, err)}")
        return out

    def show(self, name: str) -> Node:
        try:
            with open(self.marker) as fh:
                reason = fh.read().strip()
        except FileNotFoundError:
            return Node(name, "IDLE")
        return Node(name, "IDLE", frozenset({"DRAIN"}), reason)

    def drain(self, name: str, reason: str) -> None:
        self._hook("drain", name, reason)
        os.makedirs(os.path.dirname(self.marker) or ".", exist_ok=True)
        with open(self.marker, "w") as fh:
            fh.write(reason + "\n")

    def resume(self, name: str) -> None:
        self._hook("resume", name)
        if os.path.exists(self.marker):
            os.unlink(self.marker)

    def jobs(self, name: str) -> list[str]:
        return self._hook("jobs", name).split()
