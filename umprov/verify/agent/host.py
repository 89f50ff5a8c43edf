"""The parent: pre-checks, the children and their gates, and the host report.

Every child starts at once (each pays seconds for Python, torch and CUDA; none waits for
another's start-up): ``monitor`` (NVML and the kernel log, no torch), ``discover`` (versions,
devices; then the cudaMallocAsync backend), one ``gpu`` child per GPU, one ``nccl`` rank per
GPU and, in full mode, one ``oversub`` child per GPU (managed.oversubscription), the last
three on a guess of the GPU count that discover corrects. No child creates a CUDA context
before the monitor has listed the GPUs' processes (the cuda gate), so every process listed is
someone else's. The ranks set up NCCL meanwhile and, in full mode, wait at the gate the parent
opens when the per-GPU checks are done (their exact-value checks run while the per-GPU
children exit), then at a second one, opened once those children have ended, for the timed
collectives; a burn-in (``--duration``) runs in the ranks after that. No GPU is a failing
record with every reason found, never a pass.

The report's ``timings`` say where the time went (each child's start-up, checks and waits;
the parent's own phases) and ``samples`` what the monitor read along the way.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from typing import Any

from .health import host_health, nvlink_active
from .monitor import found_xids, monitor_records, new_xids
from .oversub import gate_path, open_oversub_gate
from .pairs import pair_records
from .precheck import guess_gpu_count, no_gpu_reasons, precheck
from .processes import name_other_processes
from .profiles import profiles_for, select_profile
from .runner import (
    Child,
    child_env,
    open_gate,
    self_command,
    shorten_peers,
    wait_all,
    wait_done,
)
from .samples import by_gpu, progress_line
from .schema import host_report, record

PROGRESS_EVERY = 10.0  # seconds between burn-in progress lines


class Agent:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.quick = bool(args.quick)
        self.timeout = float(args.timeout)
        self.duration = float(getattr(args, "duration", 0) or 0)
        self.exclusive = bool(getattr(args, "exclusive", False))
        self.records: list[dict] = []
        self.facts: dict[str, Any] = {}
        self.children_wall: dict[str, float] = {}
        self.timings: list[dict] = []
        self.samples: list[dict] = []
        self.devices: list[dict] = []
        self.ranks: list[Child] = []
        self.monitor: Child | None = None
        self.pids: set[int] = {os.getpid()}  # this run's processes (left out of gpu.processes)
        self.next_progress = 0.0
        # managed.oversubscription's children, and the per-GPU children whose end lets them in
        self.oversub: dict[int, Child] = {}
        self.oversub_after: dict[int, Child] = {}
        self.profiles, self.forced = profiles_for(args.profile_file, args.profile)
        self.profile = self.profiles["generic"]

    def host(self, check: str, verdict: str, **kw: Any) -> None:
        self.records.append(record("host", "host", check, verdict, **kw))

    def argv(self, kind: str, *extra: str) -> list[str]:
        return [*self_command(), "--child", kind, "--child-opts", self.opts_path, *extra]

    def run(self) -> dict:
        t_start = time.time()
        self.origin = time.monotonic()
        self.workdir = tempfile.mkdtemp(prefix="umprov-verify-")
        try:
            self._run()
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return host_report(socket.gethostname(), self.records,
                           mode="quick" if self.quick else "full", profile=self.profile["name"],
                           facts=self.facts, wall_s=time.monotonic() - self.origin,
                           started=t_start, children_wall_s=self.children_wall,
                           timings=sorted(self.timings, key=lambda t: t["start_s"]),
                           samples=self.samples)

    @contextlib.contextmanager
    def phase(self, name: str) -> Any:
        """One of the parent's own phases, into the timings."""
        a = time.monotonic()
        try:
            yield
        finally:
            self.timings.append({"name": name, "start_s": round(a - self.origin, 3),
                                 "seconds": round(time.monotonic() - a, 3), "gpu": None,
                                 "child": "agent"})

    def _write_opts(self, **extra: Any) -> str:
        sample_every = 0.5 if not self.duration else min(10.0, max(1.0, self.duration / 300))
        opts = {"quick": self.quick, "timeout": self.timeout, "profiles": self.profiles,
                "forced": self.forced, "managed_mib": self.args.managed_mib,
                "lock": os.path.join(self.workdir, "hostlink.lock"),
                "cuda_gate": self.path("cuda.gate"), "stop": self.path("monitor.stop"),
                "duration": self.duration, "sample_every": sample_every, **extra}
        path = os.path.join(self.workdir, f"opts-{len(os.listdir(self.workdir))}.json")
        with open(path, "w") as fh:
            json.dump(opts, fh)
        self.opts_path = path
        return path

    def path(self, name: str) -> str:
        return os.path.join(self.workdir, name)

    def _collect(self, child: Child, gpu: int | None = None) -> dict:
        recs, facts, _other = child.outcome()
        self.records.extend(recs)
        self._note(child, gpu)
        return facts

    def _note(self, child: Child, gpu: int | None = None) -> None:
        self.pids.add(child.proc.pid)
        self.children_wall[child.name] = child.wall()
        self.timings += child.timings(self.origin, gpu)

    def _gpu_child(self, index: int, threads: int) -> Child:
        return Child(f"gpu{index}", self.argv("gpu", "--device", str(index)),
                     child_env(threads=threads), self.timeout, self.workdir,
                     target=f"gpu{index}", check="gpu.init")

    def _oversub_child(self, index: int, threads: int) -> Child:
        return Child(f"oversub{index}", self.argv("oversub", "--device", str(index)),
                     child_env(threads=threads), self.timeout * 2, self.workdir,
                     target=f"gpu{index}", check="managed.oversubscription")

    def _run(self) -> None:
        self.facts["options"] = {"quick": self.quick, "timeout_s": self.timeout,
                                 "duration_s": self.duration, "exclusive": self.exclusive}
        with self.phase("agent.precheck"):
            pre = precheck()
        self.facts["precheck"] = pre
        self._write_opts()
        self.monitor = Child("monitor", self.argv("monitor"), child_env(),
                             self.timeout * 3 + self.duration + 120, self.workdir,
                             check="monitor.processes")
        if not pre["torch_importable"]:
            self.no_gpu(pre, None)
            self._end_monitor()
            return
        guess = guess_gpu_count(pre)
        threads = max(1, (os.cpu_count() or 8) // ((guess or 1) + 1))
        # discover runs with the cudaMallocAsync backend: after the facts it checks that.
        disc_env = child_env({"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}, threads)
        disc_child = Child("discover", self.argv("discover"), disc_env, self.timeout,
                           self.workdir, check="host.discover")
        # A child whose device does not exist says so and exits; a low guess is topped up.
        gpu_children = {i: self._gpu_child(i, threads) for i in range(guess or 0)}
        # Full mode: one managed.oversubscription child per GPU, let in to its timed steps
        # when its GPU's per-GPU child has finished (tick), before the collectives.
        oversub = {} if self.quick else {i: self._oversub_child(i, threads)
                                         for i in range(guess or 0)}
        gate = self.path("nccl.gate")
        ranks: list[Child] = self.start_nccl(guess, threads, gate) if guess else []
        with self.phase("agent.wait_for_devices"):
            found = disc_child.wait_for("devices", tick=self.tick)
        devices = (found or {}).get("devices") or []
        if not devices:
            self._no_devices(pre, disc_child, found,
                             [*gpu_children.values(), *oversub.values(), *ranks])
            return
        self.devices = devices
        ranks = self._fit(gpu_children, oversub, ranks, guess or 0, len(devices), threads, gate)
        self.oversub_after = {i: gpu_children[i] for i in oversub}
        self._wait(disc_child, [*gpu_children.values(), *oversub.values()], ranks, gate)
        self._end_monitor()
        self.oversub = oversub
        self._collect_all(pre, found or {}, devices, disc_child, gpu_children, ranks)

    def _no_devices(self, pre: dict, disc_child: Child, found: dict | None,
                    started: list[Child]) -> None:
        for c in started:
            c.kill()
        wait_all([disc_child], tick=self.tick)
        disc = self._collect(disc_child)
        disc.update({k: v for k, v in (found or {}).items() if k not in ("ev", "t", "m")})
        self.facts["discover"] = disc
        if found is not None or disc:  # discover ran and found nothing: no GPU, honestly
            self.no_gpu(pre, disc)
        self._end_monitor()

    def _fit(self, gpu_children: dict[int, Child], oversub: dict[int, Child],
             ranks: list[Child], guess: int, world: int, threads: int,
             gate: str) -> list[Child]:
        """One per-GPU child (and in full mode one oversubscription child) per device and
        ``world`` ranks, whatever the guess was."""
        for i in range(world, guess):
            # a guess too high: those children are not results
            for extra in (gpu_children.pop(i), oversub.pop(i, None)):
                if extra is not None:
                    extra.kill()
                    self.pids.add(extra.proc.pid)
        for i in range(guess, world):
            gpu_children[i] = self._gpu_child(i, threads)
            if not self.quick:
                oversub[i] = self._oversub_child(i, threads)
        if len(ranks) != world:
            for c in ranks:
                c.kill()
                self.pids.add(c.proc.pid)
            ranks = self.start_nccl(world, threads, gate)
        return ranks

    def _wait(self, disc_child: Child, gpu_children: list[Child], ranks: list[Child],
              gate: str) -> None:
        """Per-GPU checks, then the gate, then the collectives (and the burn-in); in quick mode
        the collectives run meanwhile, unjudged. The ranks' exact-value checks start when the
        per-GPU children have finished their checks; their timed ones when those have
        ended."""
        self.ranks = ranks
        phase2 = [disc_child, *gpu_children]
        if self.quick and not self.duration:
            with self.phase("agent.wait_all"):
                wait_all(phase2 + ranks, groups=[ranks], tick=self.tick)
            return
        def tick() -> None:
            # A rank that ended before the gate (failed, or skipped for want of memory)
            # leaves its peers in a collective, holding their GPUs' locks, which the per-GPU
            # children wait for: its peers end within the grace, not at their deadline.
            self.tick()
            shorten_peers(ranks)

        with self.phase("agent.wait_per_gpu_checks"):
            wait_done(phase2, tick=tick)
        open_gate(gate)
        for c in ranks:  # their own deadline counts from now
            c.deadline = max(c.deadline, time.monotonic() + self.timeout + self.duration)
        with self.phase("agent.wait_per_gpu_exit"):
            wait_all(phase2, tick=self.tick)
        open_gate(timed_gate_path(gate))
        with self.phase("agent.wait_collectives"):
            wait_all(ranks, groups=[ranks], tick=self.tick)

    def tick(self) -> None:
        """Between looks at the children: open the cuda gate if the monitor died before it
        could, and print the burn-in's progress."""
        mon = self.monitor
        if mon is not None and mon.rc is None and mon.poll():
            open_gate(self.path("cuda.gate"))
        for i, gpu_child in list(self.oversub_after.items()):
            # its last check done (its CUDA context may still be closing), or it ended
            if gpu_child.finished():
                del self.oversub_after[i]
                open_oversub_gate(gate_path(self.workdir, i), _h2d_rate(gpu_child))
        now = time.monotonic()
        if self.duration and self.devices and now >= self.next_progress:
            self.next_progress = now + PROGRESS_EVERY
            started = [e["m"] for c in self.ranks for e in c.events()
                       if e.get("ev") == "burnin_start"]
            if started:
                probes = {i: e for i, c in enumerate(self.ranks) for e in c.events()
                          if e.get("ev") == "burnin_probe"}
                events = mon.events() if mon else []
                line = progress_line(now - min(started), self.duration,
                                     by_gpu(events, self.devices), probes)
                xids = new_xids(events)
                if xids:
                    line += "; NEW Xid " + ", ".join(f"{e['xid']} (PCI {e['pci']})"
                                                    for e in xids[-3:])
                print(f"umprov verify agent: {line}", file=sys.stderr, flush=True)

    def _end_monitor(self) -> None:
        """Stop the monitor's sampling; it reads the processes, links and log once more."""
        mon = self.monitor
        if mon is None:
            return
        open_gate(self.path("monitor.stop"))
        mon.deadline = min(mon.deadline, time.monotonic() + max(30.0, self.timeout / 2))
        with self.phase("agent.wait_monitor"):
            wait_all([mon])
        recs, facts, _other = mon.outcome()
        self.records += [r for r in recs if r["reason"]]  # a monitor that hung or crashed
        self.facts["monitor"] = facts
        self._note(mon)
        if not self.devices:
            self.records += found_xids(mon.events(), record)

    def _monitor_records(self, disc: dict) -> None:
        infos = dict(enumerate(disc.get("gpus_nvml") or []))
        names = {d["index"]: d["name"] for d in self.devices}
        # The monitor names GPUs by NVML's PCI bus id: take NVML's (matched by UUID in the
        # discover child) where there is one, torch's otherwise.
        devices = [{**d, "pci_bus_id": (infos.get(i) or {}).get("pci_bus_id") or
                    d.get("pci_bus_id")} for i, d in enumerate(self.devices)]

        def profile_of(i: int) -> dict:
            return select_profile(self.profiles, names.get(i), self.forced)

        evs = [e for c in self.ranks for e in c.events()]
        starts = [e["m"] for e in evs if e.get("ev") == "burnin_start"]
        ends = [e["m"] for e in evs if e.get("ev") == "burnin_end"]
        window = (min(starts), max(ends) if ends else time.monotonic()) if starts else None
        recs, self.samples, foreign = monitor_records(
            self.monitor.events() if self.monitor else [], devices,
            exclusive=self.exclusive, infos={i: infos.get(i, {}) for i in names},
            profile_of=profile_of, window=window, origin=self.origin, record=record,
            ours=frozenset(self.pids))
        self.records += recs
        name_other_processes(self.records, foreign)

    def _collect_all(self, pre: dict, found: dict, devices: list[dict], disc_child: Child,
                     gpu_children: dict[int, Child], ranks: list[Child]) -> None:
        disc = self._collect(disc_child)
        self.facts["discover"] = disc
        if not disc.get("devices"):
            disc.update({k: v for k, v in found.items() if k not in ("ev", "t", "m")})
        host_health(self.host, disc, pre, self.args.expected_gpus)
        active = nvlink_active(disc)
        if active:
            self.facts["nvlink_active"] = active
        names = sorted({d["name"] for d in devices})
        self.profile = select_profile(self.profiles, devices[0]["name"], self.forced)
        self.facts["profile"] = {"name": self.profile["name"], "forced": bool(self.forced),
                                 "gpu_models": names}
        if len(names) > 1:
            self.host("host.gpu_models", "warn", measured=", ".join(names), hint="config",
                      detail="mixed GPU models; each GPU is judged by its own profile, the "
                      f"host by {self.profile['name']}")
        for i in sorted(gpu_children):
            facts = self._collect(gpu_children[i], gpu=i)
            self.facts.setdefault("gpus", {})[f"gpu{i}"] = facts
        for i in sorted(self.oversub):  # before the monitor's records: these pids are ours
            self.facts["gpus"].setdefault(f"gpu{i}", {}).update(
                self._collect(self.oversub[i], gpu=i))
        self.collect_nccl(ranks)
        self._monitor_records(disc)

    def start_nccl(self, world: int, threads: int, gate: str) -> list[Child]:
        """The NCCL ranks start early: torch import, NCCL set-up and the DDP model overlap the
        per-GPU checks; in full mode they then wait at the gate."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self._write_opts(world=world, port=port, gate=gate, timed_gate=timed_gate_path(gate),
                         nccl_backend=os.environ.get("UMPROV_VERIFY_NCCL_BACKEND", "nccl"))
        return [
            Child(f"nccl{r}", self.argv("nccl", "--rank", str(r)), child_env(threads=threads),
                  self.timeout, self.workdir, check="nccl.init")
            for r in range(world)
        ]

    def collect_nccl(self, ranks: list[Child]) -> None:
        pairs: list[dict] = []
        lost: list[dict] = []
        for i, c in enumerate(ranks):
            recs, _facts, other = c.outcome()
            self._note(c, gpu=i)
            pairs += [e for e in other if e.get("ev") == "pair"]
            for r in recs:
                if r["reason"] in ("timeout", "crash"):
                    lost.append(r)
                else:
                    self.records.append(r)
        if lost:
            # One hung or dead rank stops every rank: report the cause once, the crash before
            # the peers killed after it, a named pair before the whole host.
            lost.sort(key=lambda r: (r["reason"] != "crash", r["scope"] != "pair"))
            self.records.append(lost[0])
        self.records.extend(pair_records(pairs, self.profile, len(ranks)))

    def no_gpu(self, pre: dict, disc: dict | None) -> None:
        reasons = no_gpu_reasons(pre, disc)
        self.facts["no_gpu_reasons"] = reasons
        hint = "driver"
        if not pre.get("torch_importable") or (disc and not disc.get("torch_cuda_build")):
            hint = "config"
        self.host("host.gpu_visible", "fail", measured=0, unit="GPUs", limit=1, hint=hint,
                  detail="no NVIDIA GPU visible: " + "; ".join(reasons))
        if self.args.expected_gpus:
            self.host("host.gpu_count", "fail", measured=0, unit="GPUs",
                      limit=self.args.expected_gpus, hint=hint,
                      detail=f"expected {self.args.expected_gpus}, none visible")


def timed_gate_path(gate: str) -> str:
    """The ranks' second gate, beside the first: the timed collectives may start."""
    return f"{gate}.timed"


def _h2d_rate(gpu_child: Child) -> float | None:
    """The pinned host-to-device rate a per-GPU child measured (None: it did not)."""
    for e in gpu_child.events():
        rec = e.get("record") or {}
        if e.get("ev") == "record" and rec.get("check") == "pcie.h2d_pinned":
            measured = rec.get("measured")
            return float(measured) if isinstance(measured, (int, float)) else None
    return None
