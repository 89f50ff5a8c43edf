"""Child processes on an interrupt: find everything a command started, and stop all of it.

ansible-playbook runs in its own session (ansible-runner spawns it on a pty) and some of what
it starts leaves that session again (Mitogen's connection multiplexers call setsid), so
neither the terminal's Ctrl-C nor one killpg reaches every process. The process tree, read
from /proc before anything is signalled, does: a process keeps its parent link until that
parent exits. Linux only; elsewhere the lists are empty and callers fall back on killpg.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    started: int  # clock ticks after boot: with the pid, names one process for good
    cmdline: str


def _read(pid: int) -> Proc | None:
    try:
        stat = (PROC / str(pid) / "stat").read_text()
        cmd = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    # The command name is in parentheses and may itself hold spaces or parentheses.
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":  # a zombie: already gone, only its exit status is left
        return None
    return Proc(
        pid=pid,
        ppid=int(fields[1]),
        pgid=int(fields[2]),
        started=int(fields[19]),
        cmdline=cmd.replace(b"\0", b" ").decode(errors="replace").strip(),
    )


def processes() -> list[Proc]:
    """Every process this user can see (empty where there is no /proc)."""
    if not PROC.is_dir():
        return []
    out = []
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            proc = _read(int(entry.name))
            if proc is not None:
                out.append(proc)
    return out


def descendants(pid: int | None = None) -> list[Proc]:
    """The processes below ``pid`` (default: this one), parents before their children."""
    root = os.getpid() if pid is None else pid
    children: dict[int, list[Proc]] = {}
    for proc in processes():
        children.setdefault(proc.ppid, []).append(proc)
    out: list[Proc] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(0), []):
            out.append(child)
            todo.append(child.pid)
    return out


def alive(proc: Proc) -> bool:
    current = _read(proc.pid)
    return current is not None and current.started == proc.started


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def kill_survivors(procs: list[Proc], sig: int = signal.SIGKILL) -> list[Proc]:
    """Send ``sig`` to each process of ``procs`` still running (the same process, not a new
    one under a reused pid); return those it was sent to."""
    hit = []
    for proc in procs:
        if alive(proc):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(proc.pid, sig)
                hit.append(proc)
    return hit


def wait_gone(procs: list[Proc], timeout: float) -> list[Proc]:
    """Wait until every process of ``procs`` has ended; those still running at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in procs if alive(p)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


def wait_thread(thread: threading.Thread, timeout: float | None = None) -> None:
    """Wait for a thread without Thread.join: a signal interrupting join makes Python 3.11
    mark the thread stopped while it still runs (bpo-45274), and later waits return at once."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while thread.is_alive() and (deadline is None or time.monotonic() < deadline):
        time.sleep(0.1)
