"""The parent: pre-checks, the children in their order, and the host report.

Order: ``discover`` (versions, devices), then one ``gpu`` child per GPU in parallel (the
discover child checks the cudaMallocAsync backend meanwhile), then one ``nccl`` child per GPU.
The per-GPU children and the NCCL ranks start on a guess of the GPU count while discover
imports torch (one torch start-up less on the critical path); a wrong guess is corrected once
discover has spoken. No GPU is a failing record with every reason found, never a pass.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import tempfile
import time
from typing import Any

from .health import host_health, nvlink_active
from .nccl import pair_records
from .precheck import guess_gpu_count, no_gpu_reasons, precheck
from .profiles import BUILTIN_PROFILES, load_profile_file, merge_profiles, select_profile
from .runner import Child, child_env, self_command, wait_all
from .schema import host_report, record


class Agent:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.quick = bool(args.quick)
        self.timeout = float(args.timeout)
        self.records: list[dict] = []
        self.facts: dict[str, Any] = {}
        self.children_wall: dict[str, float] = {}
        self.timelines: dict[str, list] = {}
        overrides: dict = {}
        if args.profile_file:
            overrides = load_profile_file(args.profile_file)
        self.profiles = merge_profiles(BUILTIN_PROFILES, overrides)
        self.forced = args.profile or overrides.get("profile")
        if self.forced and self.forced not in self.profiles:
            raise ValueError(f"profile {self.forced!r} does not exist")
        self.profile = self.profiles["generic"]

    def host(self, check: str, verdict: str, **kw: Any) -> None:
        self.records.append(record("host", "host", check, verdict, **kw))

    def argv(self, kind: str, *extra: str) -> list[str]:
        return [*self_command(), "--child", kind, "--child-opts", self.opts_path, *extra]

    def run(self) -> dict:
        t_start = time.time()
        m0 = time.monotonic()
        self.workdir = tempfile.mkdtemp(prefix="umprov-verify-")
        try:
            self._run()
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return host_report(socket.gethostname(), self.records,
                           mode="quick" if self.quick else "full", profile=self.profile["name"],
                           facts=self.facts, wall_s=time.monotonic() - m0, started=t_start,
                           children_wall_s=self.children_wall, timeline=self.timelines)

    def _write_opts(self, **extra: Any) -> str:
        opts = {"quick": self.quick, "timeout": self.timeout, "profiles": self.profiles,
                "forced": self.forced, "managed_mib": self.args.managed_mib,
                "lock": os.path.join(self.workdir, "hostlink.lock"), **extra}
        path = os.path.join(self.workdir, f"opts-{len(os.listdir(self.workdir))}.json")
        with open(path, "w") as fh:
            json.dump(opts, fh)
        self.opts_path = path
        return path

    def _collect(self, child: Child) -> dict:
        recs, facts, _other = child.outcome()
        self.records.extend(recs)
        self._note(child)
        return facts

    def _note(self, child: Child) -> None:
        self.children_wall[child.name] = child.wall()
        self.timelines[child.name] = child.timeline()

    def _gpu_child(self, index: int, threads: int) -> Child:
        return Child(f"gpu{index}", self.argv("gpu", "--device", str(index)),
                     child_env(threads=threads), self.timeout, self.workdir,
                     target=f"gpu{index}", check="gpu.init")

    def _run(self) -> None:
        pre = precheck()
        self.facts["precheck"] = pre
        if not pre["torch_importable"]:
            self.no_gpu(pre, None)
            return
        self._write_opts()
        guess = guess_gpu_count(pre)
        threads = max(1, (os.cpu_count() or 8) // ((guess or 1) + 1))
        # discover runs with the cudaMallocAsync backend: after the facts it checks that.
        disc_env = child_env({"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}, threads)
        disc_child = Child("discover", self.argv("discover"), disc_env, self.timeout,
                           self.workdir, check="host.discover")
        # A child whose device does not exist says so and exits; a low guess is topped up.
        gpu_children = {i: self._gpu_child(i, threads) for i in range(guess or 0)}
        gate = os.path.join(self.workdir, "nccl-gate")
        if self.quick:
            open(gate, "w").close()  # noqa: SIM115 (quick: no waiting, figures not judged)
        ranks: list[Child] = self.start_nccl(guess, threads, gate) if guess else []
        found = disc_child.wait_for("devices")
        devices = (found or {}).get("devices") or []
        if not devices:
            self._no_devices(pre, disc_child, found, [*gpu_children.values(), *ranks])
            return
        ranks = self._fit(gpu_children, ranks, guess or 0, len(devices), threads, gate)
        self._wait(disc_child, list(gpu_children.values()), ranks, gate)
        self._collect_all(pre, found or {}, devices, disc_child, gpu_children, ranks)

    def _no_devices(self, pre: dict, disc_child: Child, found: dict | None,
                    started: list[Child]) -> None:
        for c in started:
            c.kill()
        wait_all([disc_child])
        disc = self._collect(disc_child)
        disc.update({k: v for k, v in (found or {}).items() if k not in ("ev", "t")})
        self.facts["discover"] = disc
        if found is not None or disc:  # discover ran and found nothing: no GPU, honestly
            self.no_gpu(pre, disc)

    def _fit(self, gpu_children: dict[int, Child], ranks: list[Child], guess: int, world: int,
             threads: int, gate: str) -> list[Child]:
        """One per-GPU child per device and ``world`` ranks, whatever the guess was."""
        for i in range(world, guess):
            gpu_children.pop(i).kill()  # a guess too high: those children are not results
        for i in range(guess, world):
            gpu_children[i] = self._gpu_child(i, threads)
        if len(ranks) != world:
            for c in ranks:
                c.kill()
            ranks = self.start_nccl(world, threads, gate)
        return ranks

    def _wait(self, disc_child: Child, gpu_children: list[Child], ranks: list[Child],
              gate: str) -> None:
        phase2 = [disc_child, *gpu_children]
        if self.quick:
            wait_all(phase2 + ranks, groups=[ranks])
            return
        wait_all(phase2)
        open(gate, "w").close()  # noqa: SIM115
        for c in ranks:  # their own deadline counts from now
            c.deadline = max(c.deadline, time.monotonic() + self.timeout)
        wait_all(ranks, groups=[ranks])

    def _collect_all(self, pre: dict, found: dict, devices: list[dict], disc_child: Child,
                     gpu_children: dict[int, Child], ranks: list[Child]) -> None:
        disc = self._collect(disc_child)
        self.facts["discover"] = disc
        if not disc.get("devices"):
            disc.update({k: v for k, v in found.items() if k not in ("ev", "t")})
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
            facts = self._collect(gpu_children[i])
            self.facts.setdefault("gpus", {})[f"gpu{i}"] = facts
        self.collect_nccl(ranks)

    def start_nccl(self, world: int, threads: int, gate: str) -> list[Child]:
        """The NCCL ranks start early: torch import, NCCL set-up and the DDP model overlap the
        per-GPU checks; in full mode they then wait at the gate."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self._write_opts(world=world, port=port, gate=gate,
                         nccl_backend=os.environ.get("UMPROV_VERIFY_NCCL_BACKEND", "nccl"))
        return [
            Child(f"nccl{r}", self.argv("nccl", "--rank", str(r)), child_env(threads=threads),
                  self.timeout, self.workdir, check="nccl.init")
            for r in range(world)
        ]

    def collect_nccl(self, ranks: list[Child]) -> None:
        pairs: list[dict] = []
        lost: list[dict] = []
        for c in ranks:
            recs, _facts, other = c.outcome()
            self._note(c)
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
