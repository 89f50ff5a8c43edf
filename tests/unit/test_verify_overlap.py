"""What makes the agent quicker without a GPU to show it (issue 38): work that times nothing
overlaps other such work, timed work keeps the GPU and the host link to itself, and the sizes
that shrank still prove what they proved. Children are faked as elsewhere in tests/unit."""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import sys
import time
import types
from pathlib import Path

import pytest

from tests.unit import ranks
from umprov.verify.agent import discover, gpu, host, managed, oversub, runner
from umprov.verify.agent.gpuchild import share_of
from umprov.verify.agent.profiles import BUILTIN_PROFILES
from umprov.verify.agent.runner import Child, MiB, wait_all, wait_done
from umprov.verify.bundle import agent_zipapp


# -- sizes
def test_the_full_managed_buffer_is_256_mib_and_its_concurrent_load_keeps_its_bytes():
    assert (managed.FULL_BYTES // MiB, managed.QUICK_BYTES // MiB) == (256, 64)
    # the 128 MiB half of 256 MiB: as many bytes of GPU updates as 400 over the old 512 MiB half
    assert managed.concurrent_reps(128 * MiB) * 128 * MiB == 400 * 512 * MiB
    assert managed.concurrent_reps(512 * MiB) == 400  # --managed-mib 1024: as before
    assert managed.concurrent_reps(2 * MiB) == 4000  # a crowded GPU: launches capped


def test_pinned_copies_are_at_most_256_mib():
    assert share_of(79 << 30, gpu.PINNED_CAP, 0.02) // MiB == 256  # an idle H100
    assert share_of(4 << 30, gpu.PINNED_CAP, 0.02) // MiB == 81  # a crowded GPU: 2% of free


# -- the per-GPU child's CPU references, made in a thread from its start
def test_the_cpu_references_are_those_the_checks_made_inline():
    torch = pytest.importorskip("torch")
    refs = gpu.CpuReferences(torch, 1, quick=True).get()
    a, b, product = refs.mats
    gen = torch.Generator().manual_seed(1235)
    assert torch.equal(a, torch.randint(-3, 4, (1024, 1024), generator=gen).float())
    assert torch.equal(b, torch.randint(-3, 4, (1024, 1024), generator=gen).float())
    assert torch.equal(product, a @ b)
    n = torch.arange(gpu.SMOKE_N, dtype=torch.int64)
    assert refs.smoke_sum == int(((n * 3 + 1) % 1000003).sum())
    assert gpu.CpuReferences(torch, 0, quick=False).get().mats[0].shape == (2048, 2048)


def test_an_error_in_the_reference_thread_is_raised_in_the_check():
    broken = types.SimpleNamespace(Generator=lambda: 1 / 0)
    refs = gpu.CpuReferences(broken, 0, quick=True)
    with pytest.raises(ZeroDivisionError):
        refs.get()


# -- discover: NVML's facts in a thread beside the allocator check
def test_nvml_facts_that_fail_in_their_thread_are_a_fact(monkeypatch):
    def broken() -> None:
        raise OSError("libnvidia-ml.so.1: cannot open")

    monkeypatch.setattr(discover, "Nvml", broken)
    facts: dict = {}
    discover._nvml_facts(facts, [])
    assert facts == {"nvml_error": "OSError: libnvidia-ml.so.1: cannot open"}


# -- managed.oversubscription: the warm-up step before its gate, between others' timed windows
def _held(path: Path) -> bool:
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
        return False


class Emitter:
    def __init__(self) -> None:
        self.records: list = []
        self.marks: list = []
        self.current = None

    def start(self, check: str, target: str) -> None:
        self.current = (check, target)

    def event(self, ev: str, **kw) -> None:
        self.marks.append(kw.get("what", ev))

    def record(self, rec) -> None:
        self.records.append(rec)

    def facts(self, **kw) -> None:
        pass

    def done(self) -> None:
        self.records.append("done")


def test_the_warm_up_step_runs_before_the_gate_and_every_step_under_both_locks(
        tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    workdir = tmp_path
    lock, dev_lock = workdir / "hostlink.lock", workdir / "gpu0.lock"
    gate = Path(oversub.gate_path(str(workdir), 0))
    steps: list[dict] = []

    class Training:
        def __init__(self, torch_, device, n) -> None:
            self.n = n

        def step(self) -> None:
            steps.append({"gate": gate.exists(), "locks": (_held(lock), _held(dev_lock))})
            if len(steps) == 1:  # the parent opens the gate later, while this child waits
                oversub.open_oversub_gate(str(gate), 50.0)

        def result(self) -> dict:
            return {"step_s": 0.05, "first_step_s": 0.3, "layers_differing": 0,
                    "loss_first": 1.0, "loss_last": 0.9}

    monkeypatch.setattr(oversub, "Training", Training)
    enabled: list = []
    fake = types.SimpleNamespace(ruled_out=lambda: None,
                                 enable=lambda **kw: enabled.append(kw),
                                 stats=lambda: {"peak_spilled": 448 * MiB})
    monkeypatch.setitem(sys.modules, "umprov_managed", fake)
    monkeypatch.setitem(sys.modules, "torch._dynamo", types.ModuleType("torch._dynamo"))
    for name, value in {"device_count": lambda: 1, "set_device": lambda d: None,
                        "init": lambda: None, "get_device_name": lambda d: "NVIDIA H100 80GB",
                        "mem_get_info": lambda d: (70 << 30, 80 << 30)}.items():
        monkeypatch.setattr(torch.cuda, name, value)
    em = Emitter()
    oversub.child_oversub(em, {"lock": str(lock), "profiles": BUILTIN_PROFILES,
                               "timeout": 30}, 0)
    assert enabled == [{"budget": oversub.BUDGET, "reservoir": 1 << 30}]  # 2 x the working set
    assert [s["gate"] for s in steps] == [False] + [True] * (oversub.STEPS - 1)
    assert all(s["locks"] == (True, True) for s in steps), steps
    (rec, done) = em.records
    assert rec["check"] == oversub.CHECK and rec["verdict"] == "pass" and done == "done"
    assert "oversubscription warm-up step" in em.marks  # a phase of its own in the timings


def test_an_oversubscription_child_of_a_gpu_that_is_not_there_says_so(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setitem(sys.modules, "umprov_managed",
                        types.SimpleNamespace(ruled_out=lambda: None))
    monkeypatch.setitem(sys.modules, "torch._dynamo", types.ModuleType("torch._dynamo"))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    em = Emitter()
    oversub.child_oversub(em, {"lock": str(tmp_path / "hostlink.lock")}, 3)
    assert em.records == ["done"] and "absent" in em.marks


# -- the parent: oversubscription children on the guess, the ranks' two gates
class FakeChild:
    """A child whose state the test moves on: finished its checks, then ended."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.rc: int | None = None
        self.timed_out = False
        self.deadline = time.monotonic() + 60
        self.killed = False
        self.is_done = False
        self.proc = types.SimpleNamespace(pid=hash(name) % 30000 + 1000, poll=lambda: self.rc)

    def finished(self) -> bool:
        return self.is_done or self.rc is not None

    def poll(self) -> bool:
        return self.rc is not None

    def said_done(self) -> bool:
        return self.is_done

    def kill(self) -> None:
        self.killed, self.rc = True, -9


def agent(tmp_path: Path, quick: bool = False) -> host.Agent:
    args = argparse.Namespace(quick=quick, timeout=60.0, duration=0, exclusive=False,
                              profile_file=None, profile=None, managed_mib=None)
    a = host.Agent(args)
    a.workdir, a.origin = str(tmp_path), time.monotonic()
    return a


@pytest.mark.parametrize(("guess", "world"), [(2, 1), (1, 2), (2, 2)])
def test_one_oversubscription_child_per_gpu_whatever_the_guess(tmp_path, monkeypatch, guess,
                                                               world):
    a = agent(tmp_path)
    monkeypatch.setattr(a, "_gpu_child", lambda i, t: FakeChild(f"gpu{i}"))
    monkeypatch.setattr(a, "_oversub_child", lambda i, t: FakeChild(f"oversub{i}"))
    gpus = {i: FakeChild(f"gpu{i}") for i in range(guess)}
    overs = {i: FakeChild(f"oversub{i}") for i in range(guess)}
    extra = [gpus.get(1), overs.get(1)] if guess > world else []
    ranks = [FakeChild(f"nccl{r}") for r in range(world)]
    a._fit(gpus, overs, ranks, guess, world, 1, a.path("nccl.gate"))
    assert sorted(gpus) == sorted(overs) == list(range(world))
    assert all(c.killed for c in extra)
    assert not any(c.killed for c in [*gpus.values(), *overs.values()])


def test_quick_mode_tops_up_no_oversubscription_child(tmp_path, monkeypatch):
    a = agent(tmp_path, quick=True)
    monkeypatch.setattr(a, "_gpu_child", lambda i, t: FakeChild(f"gpu{i}"))
    gpus: dict = {}
    overs: dict = {}
    a._fit(gpus, overs, [FakeChild("nccl0")], 0, 1, 1, a.path("nccl.gate"))
    assert list(gpus) == [0] and overs == {}


def test_exact_collectives_start_when_the_checks_are_done_timed_ones_when_they_ended(tmp_path):
    a = agent(tmp_path)
    gate = a.path("nccl.gate")
    disc, gpu0, over0, rank = (FakeChild(n) for n in ("discover", "gpu0", "oversub0", "nccl0"))
    seen: list[tuple[str, bool, bool]] = []
    script = iter([
        lambda: None,
        lambda: setattr(disc, "rc", 0),
        lambda: setattr(gpu0, "is_done", True),
        lambda: setattr(over0, "is_done", True),  # every check done: the first gate
        lambda: setattr(gpu0, "rc", 0),
        lambda: setattr(over0, "rc", 0),  # every process ended: the second
        lambda: setattr(rank, "rc", 0),
    ])

    def tick() -> None:
        state = next(script, lambda: None)
        state()
        seen.append((getattr(state, "__name__", ""), os.path.exists(gate),
                     os.path.exists(host.timed_gate_path(gate))))

    a.tick = tick
    a._wait(disc, [gpu0, over0], [rank], gate)
    gates = [(first, timed) for _n, first, timed in seen]
    opened = gates.index((True, False))
    assert not any(first for first, _t in gates[:opened])
    assert gates[-1] == (True, True)
    # the first gate opened after the oversubscription child finished, before any exit
    assert over0.is_done and seen[opened - 1][1:] == (False, False)
    assert [p["name"] for p in a.timings] == [
        "agent.wait_per_gpu_checks", "agent.wait_per_gpu_exit", "agent.wait_collectives"]


def test_wait_done_does_not_wait_for_an_exit():
    child = FakeChild("gpu0")
    child.is_done = True
    started = time.monotonic()
    wait_done([child])
    assert time.monotonic() - started < 0.5 and child.rc is None


# A child that has written "done" and then takes a while to end, as CUDA and NCCL teardown do
LINGERING = """
import json, sys, time
with open(sys.argv[-1], "a") as out:
    for ev in ({"ev": "start", "check": "gpu.smoke_kernel", "target": "gpu0"}, {"ev": "done"}):
        out.write(json.dumps({**ev, "m": time.monotonic()}) + "\\n")
        out.flush()
        time.sleep(0.1)
time.sleep(0.4)
"""


def test_the_time_a_child_takes_to_end_after_its_checks_is_its_exit_phase(tmp_path):
    child = Child("gpu0", [sys.executable, "-c", LINGERING], dict(os.environ), 30, str(tmp_path))
    wait_done([child])
    assert [t["name"] for t in child.timings(child.started)][1:] == ["gpu.smoke_kernel"]
    wait_all([child])
    phases = {t["name"]: t["seconds"] for t in child.timings(child.started)}
    assert list(phases)[1:] == ["gpu.smoke_kernel", "exit"] and phases["exit"] >= 0.4


# -- the ranks: exact values and the DDP step before the timed gate, the timed ones after it
def start_ranks(agent_pyz: Path, tmp_path: Path, world: int) -> tuple[list, Path]:
    """The ranks behind their first gate (open) and their second (``timed``, closed)."""
    timed = Path(host.timed_gate_path(str(tmp_path / "nccl.gate")))
    return ranks.start_ranks(agent_pyz, tmp_path, world, timed_gate=str(timed)), timed


def events(tmp_path: Path, world: int) -> list[dict]:
    out = []
    for r in range(world):
        f = tmp_path / f"r{r}.jsonl"
        out += [json.loads(ln) for ln in f.read_text().splitlines()] if f.exists() else []
    return out


@pytest.fixture(scope="module")
def agent_pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return agent_zipapp(cache=tmp_path_factory.mktemp("agent"))


def test_two_ranks_time_nothing_before_the_second_gate(agent_pyz, tmp_path):
    procs, timed = start_ranks(agent_pyz, tmp_path, 2)
    try:
        deadline = time.monotonic() + 150
        while sum(1 for e in events(tmp_path, 2)
                  if e.get("what") == f"wait: {timed.name}") < 2:
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
            time.sleep(0.05)
        before = events(tmp_path, 2)
        checks = {e["record"]["check"] for e in before if e["ev"] == "record"}
        assert {"nccl.all_reduce_f32", "nccl.broadcast", "ddp.step"} <= checks
        assert not [e for e in before if e["ev"] == "pair"]
        assert "nccl.busbw_1g" not in checks
        timed.touch()
        assert [p.wait(timeout=150) for p in procs] == [0, 0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    after = events(tmp_path, 2)
    assert [e for e in after if e["ev"] == "pair"]
    assert "nccl.busbw_1g" in {e["record"]["check"] for e in after if e["ev"] == "record"}


def test_one_rank_has_nothing_timed_and_never_waits_for_the_second_gate(agent_pyz, tmp_path):
    procs, timed = start_ranks(agent_pyz, tmp_path, 1)
    assert procs[0].wait(timeout=150) == 0 and not timed.exists()
    checks = {e["record"]["check"]: e["record"]["verdict"] for e in events(tmp_path, 1)
              if e["ev"] == "record"}
    assert checks["ddp.step"] == "pass" and checks["nccl.busbw_1g"] == "skip"


def test_a_rank_that_ends_cuts_the_wait_of_its_peers_still_in_their_checks_to_the_grace():
    """A rank that skipped for want of memory exits 0 before the gate; its peers would wait in
    a collective, holding their GPUs' locks, until their own deadline. A peer that wrote
    "done" is only exiting: its deadline stands."""
    skipped, waiting, finishing = FakeChild("nccl0"), FakeChild("nccl1"), FakeChild("nccl2")
    finishing.is_done = True
    runner.shorten_peers([skipped, waiting, finishing])  # none has ended
    assert waiting.deadline > time.monotonic() + 30
    skipped.proc.poll = lambda: 0  # ended, not yet polled by the parent
    runner.shorten_peers([skipped, waiting, finishing])
    assert waiting.deadline <= time.monotonic() + runner.GROUP_GRACE
    assert finishing.deadline > time.monotonic() + 30
