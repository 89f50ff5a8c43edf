"""Per-host work in parallel threads that an interrupt stops within seconds: the one way
umprov fans out over hosts (deploy, verify, status).

``concurrent.futures.ThreadPoolExecutor`` does not fit a command that Ctrl-C or SIGTERM must
end quickly: leaving its ``with`` block waits for every running task, and the interpreter
joins its threads at exit, so an interrupted deploy would finish its push first. Here each
task runs in a daemon thread; the signal is raised in the main thread, which then sets
``cancel``, gives the tasks ``grace`` seconds to stop at their next step (``check()`` raises
``Cancelled`` in them), closes their connections so blocked reads end, and returns. A thread
still stuck in a system call after that does not hold the process's exit.

The main thread never waits with ``Thread.join``: a signal that interrupts ``join`` makes
Python 3.11 release the lock of the thread being joined and mark it stopped while it still
runs (the bpo-45274 handling), and every later wait on it returns at once. It waits on an
Event per task instead.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from umprov.errors import Cancelled

T = TypeVar("T")
R = TypeVar("R")

# How long tasks get to stop at a step boundary, then again after their connections closed.
STOP_GRACE_S = 4.0
CLOSE_GRACE_S = 2.0

# Hosts handled at once by default (--forks): Ansible's default is 5, for its heavier forks.
DEFAULT_FORKS = 32
# Open files one host in flight may hold: its SSH socket, a Docker API session or two over it,
# a push's pipes and temporary files; and those the process keeps besides (logs, libraries).
FILES_PER_HOST = 8
FILES_KEPT = 64


def open_file_limit() -> int:
    """The soft limit on open files, raised to the hard limit first (1,024 soft is common
    beside a hard limit hundreds of times higher; raising it needs no privilege)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return int(soft) if soft != resource.RLIM_INFINITY else 1 << 20


def workers(forks: int | None, hosts: int) -> tuple[int, str | None]:
    """(hosts to handle at once, why fewer than asked or None): ``forks`` (default
    DEFAULT_FORKS), at most one per host, and no more than the open-file limit allows."""
    want = forks or DEFAULT_FORKS
    fit = max(1, (open_file_limit() - FILES_KEPT) // FILES_PER_HOST)
    n = max(1, min(want, hosts, fit))
    why = None
    if n < min(want, hosts):
        why = (f"{n} hosts at once, not {min(want, hosts)}: the open-file limit allows "
               f"{fit} (raise `ulimit -n`)")
    return n, why


class Parallel:
    """Run a function over items in at most ``workers`` daemon threads at once."""

    def __init__(self, workers: int) -> None:
        self.cancel = threading.Event()
        self.workers = max(1, workers)
        self._done: list[threading.Event] = []
        self._lock = threading.Lock()

    def check(self) -> None:
        """Raise Cancelled in a task once the run was interrupted."""
        checkpoint(self.cancel)

    def start(self, fn: Callable[..., Any], *args: Any, name: str = "task") -> threading.Event:
        """Run ``fn(*args)`` in a daemon thread now (not counted against ``workers``); the
        Event returned is set when it has ended."""
        done = _spawn(fn, *args, name=name)
        with self._lock:
            self._done.append(done)
        return done

    def map(self, fn: Callable[[T], R], items: Sequence[T], name: str = "task") -> list[R]:
        """``[fn(item) for item in items]``, in parallel; the first exception a task raised
        (other than Cancelled) is raised here once every task has ended. At most ``workers``
        threads, each taking the next item when it is done with one: a 10,000-host inventory
        costs ``workers`` threads, not 10,000."""
        results: list[Any] = [None] * len(items)
        errors: list[BaseException | None] = [None] * len(items)
        queue = iter(range(len(items)))
        queue_lock = threading.Lock()

        def next_index() -> int | None:
            with queue_lock:
                return next(queue, None)

        def work() -> None:
            while not self.cancel.is_set():
                index = next_index()
                if index is None:
                    return
                try:
                    results[index] = fn(items[index])
                except Cancelled:
                    return
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    errors[index] = exc

        threads = min(self.workers, len(items))
        for done in [self.start(work, name=f"{name}-{i}") for i in range(threads)]:
            while not done.wait(0.2):
                pass
        if self.cancel.is_set():
            raise Cancelled
        for error in errors:
            if error is not None:
                raise error
        return results

    def stop(self, close: Callable[[], None] | None = None, *, grace: float = STOP_GRACE_S) -> None:
        """On an interrupt: cancel, wait for the tasks to stop, close what they wait on."""
        self.cancel.set()
        self._wait(grace)
        if close is not None:
            close()
            self._wait(CLOSE_GRACE_S)

    def _wait(self, seconds: float) -> None:
        with self._lock:
            pending = list(self._done)
        wait_all(pending, seconds)


def checkpoint(cancel: threading.Event | None) -> None:
    """Between two steps of a task: stop here (raise Cancelled) when the run was interrupted."""
    if cancel is not None and cancel.is_set():
        raise Cancelled


def settle(
    fn: Callable[[T], R], items: Sequence[T], timeout: float, name: str = "task"
) -> list[R | BaseException]:
    """Each item's ``fn(item)``, or the exception it raised, or a TimeoutError for an item not
    done within ``timeout`` seconds; never raises for a task. Every item starts at once, each
    in a daemon thread, and one still running at the deadline is left to end on its own."""
    late = TimeoutError(f"no answer within {timeout:.0f} s")
    results: list[Any] = [late] * len(items)

    def run(index: int, item: T) -> None:
        try:
            results[index] = fn(item)
        except BaseException as exc:  # noqa: BLE001 - this item's result
            results[index] = exc

    wait_all([_spawn(run, i, item, name=f"{name}-{i}") for i, item in enumerate(items)],
             timeout)
    return list(results)


def wait_all(events: Sequence[threading.Event], seconds: float) -> None:
    """Wait until every event is set, or ``seconds`` have passed for them all together."""
    deadline = time.monotonic() + seconds
    for done in events:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        done.wait(left)


def _spawn(fn: Callable[..., Any], *args: Any, name: str) -> threading.Event:
    """``fn(*args)`` in a daemon thread; the Event is set when it has ended."""
    done = threading.Event()

    def run() -> None:
        try:
            fn(*args)
        finally:
            done.set()

    threading.Thread(target=run, name=name, daemon=True).start()
    return done
