"""Child processes: how they are started, what they report, and their deadlines.

The agent's own process never touches a GPU. Each child is this agent started again (its
zipapp, or its package with ``-m``) with ``--child KIND``; it appends JSON lines to a file (a
start marker before each check, then its record), so a child killed at its deadline still
leaves the checks it finished and names the one that hung.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from .schema import record

MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
DEFAULT_TIMEOUT = 120.0
GATE_LIMIT = 30.0  # seconds a child waits for the monitor child's process list at most
GROUP_GRACE = 10.0  # seconds a rank whose peer died keeps before it is killed
GiB = 1 << 30
MiB = 1 << 20
_T0 = time.monotonic()


def self_command() -> list[str]:
    """The command that starts this agent again: its zipapp when it runs from one (torchrun
    and docker exec start it so), else its package as a module (``python -m``)."""
    archive = getattr(__loader__, "archive", None)  # zipimport's loader names the archive
    if archive:
        return [sys.executable, os.path.abspath(archive)]
    return [sys.executable, "-m", __name__.rpartition(".")[0]]


class Emitter:
    """What a child tells the parent: JSON lines, flushed one by one (survives a kill)."""

    def __init__(self, path: str, kind: str) -> None:
        self.kind = kind
        self.fh = open(path, "a", buffering=1)  # noqa: SIM115 (lives as long as the child)
        self.current: tuple[str, str] | None = None  # the check under way

    def _write(self, obj: dict) -> None:
        now = time.monotonic()
        obj["t"] = round(now - _T0, 3)  # seconds since the child started
        obj["m"] = round(now, 3)  # CLOCK_MONOTONIC: one clock for every process of the host
        self.fh.write(json.dumps(obj, default=str) + "\n")
        self.fh.flush()

    def start(self, check: str, target: str) -> None:
        self.current = (check, target)
        self._write({"ev": "start", "check": check, "target": target})

    def record(self, rec: dict) -> None:
        self._write({"ev": "record", "record": rec})

    def facts(self, **facts: Any) -> None:
        self._write({"ev": "facts", "facts": facts})

    def event(self, ev: str, **data: Any) -> None:
        self._write({"ev": ev, **data})

    def done(self) -> None:
        self._write({"ev": "done"})


# How cuBLAS, CUDA and NCCL say it when torch passes their errors on.
_NO_MEMORY = ("ALLOC_FAILED", "cudaErrorMemoryAllocation", "Failed to CUDA calloc",
              "Failed to CUDA malloc")


def out_of_memory(exc: BaseException) -> bool:
    """An error that says the GPU had no memory for it: torch's, CUDA's, cuBLAS's or NCCL's."""
    text = str(exc)
    return (type(exc).__name__ == "OutOfMemoryError" or "out of memory" in text.lower()
            or any(said in text for said in _NO_MEMORY))


OUT_OF_MEMORY = "out of GPU memory"  # in a skip's detail: processes.annotate names the holder


def oom_skip(scope: str, target: str, check: str, exc: BaseException | None = None,
             what: str = "") -> dict:
    """Out of GPU memory: another process may hold it (the parent names it from
    gpu.processes), so the check is skipped, saying so, not failed; torch's own text (search
    hints, device-side assertion advice) stays out."""
    said = str(exc).strip().splitlines()[0][:120] if exc is not None else ""
    return record(scope, target, check, "skip",
                  detail=f"skipped: {OUT_OF_MEMORY}{' ' + what if what else ''}"
                  f"{f' ({said})' if said else ''}")


def guarded(em: Emitter, scope: str, target: str, check: str, fn: Any, *args: Any) -> Any:
    """Run one check; an exception becomes a failing record naming it."""
    em.start(check, target)
    try:
        return fn(*args)
    except Exception as exc:  # any error in a check is its result, not the agent's crash
        text = f"{type(exc).__name__}: {exc}"
        if out_of_memory(exc):
            em.record(oom_skip(scope, target, check, exc))
            return None
        hint = "reset" if "CUDA" in text or "cuda" in text else "investigate"
        em.record(record(scope, target, check, "fail", detail=text[:500], hint=hint,
                         reason="error"))
        return None


def wait_for_gate(em: Emitter, path: str | None, limit: float = GATE_LIMIT) -> None:
    """Block until the parent (or the monitor child) creates ``path``; after ``limit`` seconds
    go on anyway and say so (a lost gate must not hang a child). The wait is a phase of its
    own in the timings; the check under way resumes after it."""
    if not path or os.path.exists(path):
        return
    name = os.path.basename(path)
    em.event("mark", what=f"wait: {name}")
    if not gate_open(path, limit):
        em.event("mark", what=f"{name} not opened within {limit:.0f} s: went on")
    if em.current:
        em.start(*em.current)


def gate_open(path: str, limit: float = GATE_LIMIT) -> bool:
    """Whether ``path`` exists within ``limit`` seconds (looked for every 20 ms)."""
    end = time.monotonic() + limit
    while not os.path.exists(path):
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def open_gate(path: str) -> None:
    with open(path, "a"):
        pass


def bytecode_cache() -> str | None:
    """A private folder for the children's compiled bytecode, or None where none is safe.

    Each child imports torch; from source that is 4 s (torch._dynamo, which DDP pulls in,
    another 4), from bytecode 2. Images often ship torch without bytecode and forbid writing
    it (PYTHONDONTWRITEBYTECODE=1, a read-only site-packages): measured on an H200 host, a full
    run took 9.3 s that way and 7.5 s with this cache. Python checks each cached file against
    its source, and the folder must be this user's alone: bytecode in it is run."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    top = os.path.join(base, "umprov-agent")
    path = os.path.join(top, "pycache")
    try:
        for folder in (top, path):
            os.makedirs(folder, mode=0o700, exist_ok=True)
            st = os.stat(folder)
            if st.st_uid != os.getuid() or st.st_mode & 0o022:
                return None
    except OSError:
        return None
    return path


def child_env(extra: dict[str, str] | None = None, threads: int | None = None) -> dict[str, str]:
    env = dict(os.environ)
    for key, value in MULTICAST_OFF.items():
        env.setdefault(key, value)  # set where absent; a value already there is left alone
    env.setdefault("PYTHONUNBUFFERED", "1")
    # The checks measure the GPU, not the allocator a container was deployed with
    # (umprov deploy --managed-memory): managed.oversubscription enables it by itself.
    env["UMPROV_MANAGED_MEMORY"] = "0"
    if "PYTHONPYCACHEPREFIX" not in env and (cache := bytecode_cache()):
        env["PYTHONPYCACHEPREFIX"] = cache  # bytecode only there, never beside the sources
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    if threads:
        env.setdefault("OMP_NUM_THREADS", str(threads))
    if extra:
        env.update(extra)
    return env


class HostLinkLock:
    """A flock: serialises timed host<->GPU transfers across the per-GPU children, and (one
    file per GPU) keeps other children's GPU work out of a GPU's timed device checks."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.fh: Any = None

    def __enter__(self) -> HostLinkLock:
        if self.path:
            import fcntl

            self.fh = open(self.path, "a")  # noqa: SIM115
            fcntl.flock(self.fh, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.fh is not None:
            self.fh.close()  # closing releases the lock
            self.fh = None


def device_lock(opts: dict, dev: int) -> str | None:
    """The lock file of one GPU's timed checks, beside the host-link lock."""
    lock = opts.get("lock")
    return os.path.join(os.path.dirname(lock), f"gpu{dev}.lock") if lock else None


class Child:
    """One child process with a deadline; killed with its process group when late."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], timeout: float,
                 workdir: str, target: str = "host", check: str | None = None) -> None:
        self.name = name
        self.target = target
        self.check = check or name
        self.timeout = timeout
        self.out_path = os.path.join(workdir, f"{name}.jsonl")
        self.err_path = os.path.join(workdir, f"{name}.err")
        with open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(  # noqa: S603 (our own agent, our interpreter)
                [*argv, "--child-out", self.out_path],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started = time.monotonic()
        self.deadline = self.started + timeout
        self.timed_out = False
        self.rc: int | None = None
        self.ended: float | None = None
        self._events: list[dict] = []
        self._read_to = 0

    def poll(self) -> bool:
        if self.rc is not None:
            return True
        rc = self.proc.poll()
        if rc is not None:
            self.rc = rc
            self.ended = time.monotonic()
            return True
        if time.monotonic() > self.deadline:
            self.kill()
            self.timed_out = True
            return True
        return False

    def finished(self) -> bool:
        """Its last check done ("done" written; its CUDA context may still be closing), or it
        ended (or was killed at its deadline)."""
        return self.poll() or self.said_done()

    def said_done(self) -> bool:
        """Whether it wrote "done" (its last check is over), whatever its process does."""
        return any(e.get("ev") == "done" for e in self.events())

    def wall(self) -> float:
        return round((self.ended or time.monotonic()) - self.started, 2)

    def wait_for(self, ev: str, tick: Any = None) -> dict | None:
        """Block until the child writes an event of this kind (or ends); that event or None.
        ``tick()`` runs between looks."""
        while True:
            for e in self.events():
                if e.get("ev") == ev:
                    return e
            if self.poll():
                for e in self.events():
                    if e.get("ev") == ev:
                        return e
                return None
            if tick is not None:
                tick()
            time.sleep(0.02)

    def timings(self, origin: float, gpu: int | None = None) -> list[dict]:
        """Where this child's time went, as {"name", "start_s", "seconds", "gpu", "child"}
        (start_s: seconds since ``origin``, the run's start): its start-up until its first
        event, then each phase from a "start" (named by its check) or a "mark" (named by what
        follows) to the next, and "exit" from its "done" to its end (interpreter, NCCL and
        CUDA teardown, where the parent waited for it); repeated starts of one check are one
        phase."""
        out: list[dict] = []

        def add(name: str, a: float, b: float) -> None:
            if b - a >= 0.005:
                if out and out[-1]["name"] == name and abs(out[-1]["_end"] - a) < 1e-6:
                    out[-1]["seconds"] = round(b - origin - out[-1]["start_s"], 3)
                    out[-1]["_end"] = b
                    return
                out.append({"name": name, "start_s": round(a - origin, 3),
                            "seconds": round(b - a, 3), "gpu": gpu, "child": self.name,
                            "_end": b})

        evs = [e for e in self.events() if "m" in e]
        if evs:
            add("process start", self.started, float(evs[0]["m"]))
        opened: tuple[str, float] | None = None
        for e in evs:
            if e.get("ev") in ("start", "mark", "done"):
                if opened:
                    add(opened[0], opened[1], float(e["m"]))
                opened = ("exit", float(e["m"])) if e["ev"] == "done" else (
                    str(e.get("check") or e.get("what")), float(e["m"]))
        if opened and (opened[0] != "exit" or self.ended is not None):
            add(opened[0], opened[1], self.ended or time.monotonic())
        for t in out:
            del t["_end"]
        return out

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        try:
            self.rc = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # stuck in the kernel (D state): leave it
            self.rc = -9
        self.ended = time.monotonic()

    def events(self) -> list[dict]:
        """Every event so far; read on from where the last call stopped (a long burn-in's
        file grows to thousands of lines, polled many times a second)."""
        with contextlib.suppress(OSError), open(self.out_path, "rb") as fh:
            fh.seek(self._read_to)
            data = fh.read()
            end = data.rfind(b"\n") + 1  # only whole lines: the child may be mid-write
            for line in data[:end].splitlines():
                with contextlib.suppress(ValueError):
                    self._events.append(json.loads(line))
            self._read_to += end
        return self._events

    def stderr_tail(self) -> str:
        try:
            with open(self.err_path, "rb") as fh:
                fh.seek(0, 2)
                fh.seek(max(0, fh.tell() - 4000))
                lines = fh.read().decode(errors="replace").strip().splitlines()
        except OSError:
            return ""
        useful = [ln.strip() for ln in lines if ln.strip() and "Warning" not in ln]
        return useful[-1][:300] if useful else ""

    def outcome(self) -> tuple[list[dict], dict, list[dict]]:
        """(records, facts, other events); a missing 'done' becomes a failing record."""
        records: list[dict] = []
        facts: dict = {}
        other: list[dict] = []
        last_start: dict | None = None
        done = False
        for ev in self.events():
            kind = ev.get("ev")
            if kind == "start":
                last_start = ev
            elif kind == "record":
                records.append(ev["record"])
                last_start = None
            elif kind == "facts":
                facts.update(ev.get("facts", {}))
            elif kind == "done":
                done = True
            elif kind != "mark":
                other.append(ev)
        if not done:
            records.append(self._unfinished(last_start or {}))
        return records, facts, other

    def _unfinished(self, last_start: dict) -> dict:
        """The failing record of a child that did not finish: the check it had started."""
        check = last_start.get("check", self.check)
        target = last_start.get("target", self.target)
        scope = "pair" if "-gpu" in target else ("gpu" if target.startswith("gpu") else "host")
        if self.timed_out:
            return record(
                scope, target, check, "fail", hint="reset", reason="timeout",
                detail=f"timeout: no result within {self.timeout:.0f} s; child process "
                f"{self.name} was killed (a hung GPU or driver call)",
            )
        return record(
            scope, target, check, "fail", hint="investigate", reason="crash",
            detail=f"child process {self.name} exited with code {self.rc} before "
            f"finishing: {self.stderr_tail() or 'no output'}",
        )


def wait_all(children: list[Child], groups: list[list[Child]] | None = None,
             tick: Any = None) -> None:
    """Wait for every child; a group (NCCL ranks) dies together when one member fails.
    ``tick()`` runs between looks (the parent's sampling and progress)."""
    groups = groups or []
    while True:
        if tick is not None:
            tick()
        pending = [c for c in children if not c.poll()]
        for group in groups:
            shorten_peers(group)
        if not pending:
            return
        time.sleep(0.05)


def shorten_peers(group: list[Child]) -> None:
    """Once a rank has ended (failed, killed, skipped for want of memory, which exits 0, or
    done), a peer still in its checks may wait in a collective for it forever, holding its
    GPU's lock: it keeps GROUP_GRACE seconds at most. A rank ends only after its last
    collective, so a peer that is merely finishing needs far less. Exits are read without
    enforcing deadlines (``poll`` does: before the gate a rank's deadline is not its last)."""
    if not any(c.rc is not None or c.proc.poll() is not None for c in group):
        return
    for c in group:
        if c.rc is None and not c.said_done():
            c.deadline = min(c.deadline, time.monotonic() + GROUP_GRACE)


def wait_done(children: list[Child], tick: Any = None) -> None:
    """Wait until every child has finished its checks (``Child.finished``), not for their
    exit; deadlines hold as in ``wait_all``."""
    while True:
        if tick is not None:
            tick()
        if all([c.finished() for c in children]):  # noqa: C419 (poll each: deadlines)
            return
        time.sleep(0.02)


def seconds_per_call(torch: Any, fn: Any, iters: int, warmup: int = 1,
                     during: Any = None) -> float:
    """Seconds per call of fn on the current stream, by CUDA events, the device idle before
    the first timed call; ``during`` (if given) runs on the CPU while the calls are in flight.
    The one CUDA-event timer of the agent's checks (gpu, managed, burnin)."""
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    if during is not None:
        during()
    end.synchronize()
    return start.elapsed_time(end) / 1000.0 / iters
