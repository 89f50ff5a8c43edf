"""A large report's host pages rendered and written by worker processes, one per core.

A thousand host pages with their trends are seconds of pure Python on one core; the pages are
independent, so forked workers share the run's documents (copy on write, nothing pickled)
and each writes its share of the files. Fork only where it is safe: a POSIX system and a
process with no other thread (a thread's held lock would stay held in the child). Otherwise,
and for a few pages, the pages are written here one by one. A worker that fails leaves its
share to be written here again, so a bad document raises its own error, as it would serially.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

PAGES_PER_WORKER = 100  # below this, a fork costs more than it saves
MAX_WORKERS = 16


def worker_count(pages: int) -> int:
    if not hasattr(os, "fork") or threading.active_count() > 1:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cores or 1, MAX_WORKERS, pages // PAGES_PER_WORKER))


def write_pages(folder: Path, pages: Mapping[str, Callable[[], str]]) -> None:
    """Each page rendered and written into ``folder`` as its name."""
    jobs = list(pages.items())
    workers = worker_count(len(jobs))
    if workers == 1:
        _write(folder, jobs)
        return
    pids: dict[int, int] = {}  # pid: its share
    try:
        for share in range(workers):
            pid = os.fork()
            if pid == 0:  # the worker: write its share, then leave without Python's exit
                code = 1
                try:
                    _write(folder, jobs[share::workers])
                    code = 0
                finally:
                    os._exit(code)
            pids[pid] = share
        failed = [share for pid, share in pids.items()
                  if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0]
    except BaseException:  # interrupted: no worker goes on writing into what the caller removes
        _stop(pids)
        raise
    for share in failed:
        _write(folder, jobs[share::workers])


def _stop(pids: Mapping[int, int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def _write(folder: Path, jobs: list[tuple[str, Callable[[], str]]]) -> None:
    for name, render in jobs:
        (folder / name).write_text(render())
