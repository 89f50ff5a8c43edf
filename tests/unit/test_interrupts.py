"""Interrupts bounded in time (no Docker, no network): cancellable parallel work stopping
within seconds, a playbook's whole process tree ended within its grace.

What an interrupt leaves and the next run takes up: test_interrupt_aftermath.py (side by
side). The same promises against real processes and lab hosts: tests/lab/test_interrupts.py.
"""

from __future__ import annotations

import _thread
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from umprov import procs
from umprov.errors import Cancelled
from umprov.hosts.fanout import Parallel
from umprov.provision import runner

# serial: elapsed-time bounds; `make test` runs them alone.
pytestmark = pytest.mark.serial

# ---------------------------------------------------------------------------------------------
# umprov.hosts.fanout


def test_parallel_stop_after_an_interrupt_ends_tasks_within_seconds() -> None:
    """Ctrl-C while the main thread waits: the tasks stop at their next check, the ones stuck
    in a blocking call end when `close` runs; nothing waits for the work to finish."""
    pool = Parallel(4)
    released = threading.Event()
    ended: list[str] = []

    def task(kind: str) -> None:
        try:
            if kind == "steps":
                while True:
                    pool.check()
                    time.sleep(0.05)
            else:  # blocked, as a read on a connection is, until the connection closes
                released.wait(60)
                raise ConnectionError("closed")
        finally:
            ended.append(kind)

    timer = threading.Timer(0.5, _thread.interrupt_main)
    timer.start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        pool.map(task, ["steps", "blocked"])
    pool.stop(close=released.set, grace=1.0)
    assert time.monotonic() - started < 4
    assert sorted(ended) == ["blocked", "steps"]
    with pytest.raises(Cancelled):
        pool.check()


# ---------------------------------------------------------------------------------------------
# Process trees (provision: ansible-playbook and what it starts)


FAKE_PLAYBOOK = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)  # a playbook that does not stop on SIGINT
subprocess.Popen(["sleep", "60"])  # a worker or ssh: same process group
subprocess.Popen(["sleep", "61"], start_new_session=True)  # Mitogen's multiplexer: setsid
time.sleep(60)
"""


def _fake_playbook() -> subprocess.Popen[bytes]:
    # argv[0] holds "ansible-playbook", as the real one's command line does; its own session,
    # as ansible-runner's pty gives it.
    return subprocess.Popen([sys.executable, "-c", FAKE_PLAYBOOK, "ansible-playbook"],
                            start_new_session=True)


def _wait_children(pid: int) -> list[procs.Proc]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        tree = procs.descendants(pid)
        if {p.cmdline for p in tree} == {"sleep 60", "sleep 61"}:
            return tree
        time.sleep(0.05)
    pytest.fail("the fake playbook did not start its children")


def test_descendants_follow_processes_that_left_the_session() -> None:
    proc = _fake_playbook()
    try:
        tree = _wait_children(proc.pid)
        assert {p.pgid == proc.pid for p in tree} == {True, False}
    finally:
        procs.kill_survivors([*procs.descendants(proc.pid)])
        proc.kill()
        proc.wait()


def test_stop_playbook_ends_the_whole_tree_when_sigint_is_not_enough(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "STOP_GRACE_S", 0.5)
    # Another child of this process (a Docker engine the lab started, say) is not the
    # playbook's: it must outlive the stop.
    bystander = subprocess.Popen(["sleep", "62"], start_new_session=True)
    proc = _fake_playbook()
    tree = [_read(proc.pid), *_wait_children(proc.pid)]
    runner_thread = threading.Thread(target=proc.wait, daemon=True)  # ansible-runner's thread
    runner_thread.start()
    cancel = threading.Event()
    artifacts = tmp_path / "private" / "artifacts" / "ident"
    artifacts.mkdir(parents=True)
    (artifacts / "command").write_text('{"command": ["ansible-playbook"], "env": {"A": "1"}}')
    started = time.monotonic()
    runner.stop_playbook(runner_thread, cancel, SimpleNamespace(
        config=SimpleNamespace(artifact_dir=str(artifacts))))
    assert time.monotonic() - started < runner.STOP_GRACE_S + 4
    assert cancel.is_set()
    assert [p for p in tree if procs.alive(p)] == []
    assert "env" not in (artifacts / "command").read_text()
    assert bystander.poll() is None
    bystander.kill()
    bystander.wait()


def _read(pid: int) -> procs.Proc:
    proc = procs._read(pid)
    assert proc is not None
    return proc
