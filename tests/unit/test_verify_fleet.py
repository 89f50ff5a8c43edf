"""The fleet-depth checks against a stand-in NVML (verify_fakes/fake_nvml): other processes on
a GPU, NVLink links and error counters, the monitor child end to end, burn-in verdicts from
its samples, buffer sizing under little free memory, and the pair schedule."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import fakebin
from umprov.verify.agent import busbw, gpuchild, libnvml, nvlink, processes, samples
from umprov.verify.agent.burnin import parse_duration, plan
from umprov.verify.agent.monitor import monitor_records, new_xids
from umprov.verify.agent.nvml import Nvml
from umprov.verify.agent.pairs import pair_rounds
from umprov.verify.agent.profiles import BUILTIN_PROFILES
from umprov.verify.agent.schema import record, validate_record
from umprov.verify.bundle import agent_zipapp

FAKE_NVML = Path(__file__).resolve().parent / "verify_fakes" / "fake_nvml"
GiB, MiB = 1 << 30, 1 << 20
H200 = BUILTIN_PROFILES["h200-sxm"]


def _fake_module():
    spec = importlib.util.spec_from_file_location("fake_nvml_lib", FAKE_NVML / "fake_nvml_lib.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def h200(pci: str, **extra) -> dict:
    return {"name": "NVIDIA H200", "uuid": f"GPU-{pci}", "pci": pci, "processes": [],
            "links": [True] * 18, "memory": [150 * GiB, 140 * GiB, 10 * GiB],
            "errors": {k: [0] * 18 for k in ("replay", "recovery", "crc_flit", "crc_data")},
            **extra}


@pytest.fixture
def fake_nvml(monkeypatch):
    """Nvml() in this process talks to a fake driver library; returns its description."""
    mod = _fake_module()
    desc = {"gpus": [h200("00000000:18:00.0"), h200("00000000:3B:00.0")]}
    lib = mod.FakeNvmlLib(desc)
    monkeypatch.setattr(libnvml.LibNvml, "load", classmethod(lambda cls: cls(lib)))
    return lib


DEVICES = [{"index": 0, "name": "NVIDIA H200", "pci_bus_id": "00000000:18:00.0"},
           {"index": 1, "name": "NVIDIA H200", "pci_bus_id": "00000000:3B:00.0"}]


def _by(recs: list[dict]) -> dict:
    assert all(validate_record(r) == [] for r in recs)
    return {(r["target"], r["check"]): r for r in recs}


# -- other processes
def test_another_process_warns_naming_pid_name_and_memory(fake_nvml):
    me = os.getpid()  # visible in /proc: its name is read from there
    fake_nvml.gpus[0]["processes"] = [[me, 70 * GiB]]
    snap = processes.snapshot(Nvml())
    recs = _by(processes.process_records(snap, None, DEVICES, False, record))
    busy = recs[("gpu0", "gpu.processes")]
    assert busy["verdict"] == "warn" and busy["measured"] == 1
    with open(f"/proc/{me}/comm") as fh:
        name = fh.read().strip()
    assert f"pid {me} ({name}, 70.0 GiB)" in busy["detail"]
    assert "140.0 of 150.0 GiB free at the start" in busy["detail"]
    assert recs[("gpu1", "gpu.processes")]["verdict"] == "pass"


def test_the_agents_own_processes_are_not_others(fake_nvml):
    fake_nvml.gpus[0]["processes"] = [[4_100_000, GiB]]  # a child of this run, seen by PID
    snap = processes.snapshot(Nvml())
    recs = _by(processes.process_records(snap, None, DEVICES, True, record,
                                         ours=frozenset({4_100_000})))
    assert recs[("gpu0", "gpu.processes")]["verdict"] == "pass"


def test_exclusive_makes_it_a_failure_and_a_long_list_is_read_whole(fake_nvml):
    fake_nvml.gpus[1]["processes"] = [[4_000_000 + i, GiB] for i in range(20)]  # > 16 at once
    snap = processes.snapshot(Nvml())
    busy = _by(processes.process_records(snap, snap, DEVICES, True, record))[
        ("gpu1", "gpu.processes")]
    assert busy["verdict"] == "fail" and busy["measured"] == 20
    assert "name not visible here" in busy["detail"] and "--exclusive" in busy["detail"]


def test_a_throughput_figure_that_fell_short_names_the_other_process(fake_nvml):
    fake_nvml.gpus[0]["processes"] = [[4_242_424, 3 * GiB]]
    found = processes.foreign_by_gpu(processes.snapshot(Nvml()), None, DEVICES)
    recs = [record("gpu", "gpu0", "gpu.gemm_bf16_rate", "fail", measured=350.0, unit="TFLOP/s"),
            record("gpu", "gpu1", "gpu.hbm_copy", "fail", measured=1.0, unit="GB/s"),
            record("gpu", "gpu0", "gpu.hbm_copy", "pass", measured=4000.0, unit="GB/s"),
            record("host", "host", "nccl.busbw_1g", "warn", measured=200.0, unit="GB/s"),
            record("gpu", "gpu0", "ecc.row_remap_pending", "warn", measured=True)]
    processes.name_other_processes(recs, found)
    named = [r["check"] for r in recs if "pid 4242424" in r["detail"]]
    assert named == ["gpu.gemm_bf16_rate", "nccl.busbw_1g"]


def test_without_nvml_or_nvidia_smi_processes_are_a_skip():
    recs = processes.process_records({"gpus": [], "error": "no NVML"}, None, DEVICES, True,
                                     record)
    assert [(r["check"], r["verdict"]) for r in recs] == [("gpu.processes", "skip")]


# -- NVLink
def test_links_down_fail_against_the_profile(fake_nvml):
    fake_nvml.gpus[0]["links"][3] = fake_nvml.gpus[0]["links"][7] = False
    snap = nvlink.snapshot(Nvml())
    recs = _by(nvlink.nvlink_records(snap, snap, DEVICES, lambda i: H200, record))
    bad = recs[("gpu0", "nvlink.links")]
    assert bad["verdict"] == "fail" and bad["measured"] == 16 and bad["limit"] == 18
    assert "down: link 3, 7" in bad["detail"] and bad["hint"] == "reseat"
    assert recs[("gpu1", "nvlink.links")]["verdict"] == "pass"


def test_error_counters_that_grow_during_the_run_warn_or_fail(fake_nvml):
    nv = Nvml()
    before = nvlink.snapshot(nv)
    fake_nvml.bump("crc_flit", 2, 5)  # warn from 1, fail from 100 (h200-sxm)
    mid = nvlink.snapshot(nv)
    recs = _by(nvlink.nvlink_records(before, mid, DEVICES, lambda i: H200, record))
    crc = recs[("gpu0", "nvlink.errors")]
    assert crc["verdict"] == "warn" and crc["measured"] == 5 and "crc +5" in crc["detail"]
    fake_nvml.bump("recovery", 0, 1)  # any link retrain fails
    after = nvlink.snapshot(nv)
    recs = _by(nvlink.nvlink_records(before, after, DEVICES, lambda i: H200, record))
    assert recs[("gpu1", "nvlink.errors")]["verdict"] == "fail"


def test_no_nvlink_and_no_counters_are_skips(fake_nvml):
    fake_nvml.gpus[0]["links"] = None  # NOT_SUPPORTED: a PCIe GPU
    fake_nvml.gpus[1]["errors"] = None
    snap = nvlink.snapshot(Nvml())
    recs = _by(nvlink.nvlink_records(snap, snap, DEVICES, lambda i: H200, record))
    assert recs[("gpu0", "nvlink.links")]["verdict"] == "skip"
    assert "no NVLink" in recs[("gpu0", "nvlink.links")]["detail"]
    assert recs[("gpu1", "nvlink.errors")]["verdict"] == "skip"
    generic = nvlink.nvlink_records(snap, snap, DEVICES[1:], lambda i: BUILTIN_PROFILES[
        "generic"], record)
    assert generic[0]["verdict"] == "pass" and "expects no count" in generic[0]["detail"]


def test_one_visible_gpu_reports_its_links_without_judging_them(fake_nvml):
    fake_nvml.gpus[0]["links"] = [False] * 18  # a one-GPU partition of an NVSwitch system
    snap = nvlink.snapshot(Nvml())
    (links, _errors) = nvlink.nvlink_records(snap, snap, DEVICES[:1], lambda i: H200, record)
    assert links["verdict"] == "pass" and links["measured"] == 0
    assert "one GPU visible" in links["detail"] and links["limit"] is None


def test_nvlink_growth_counts_a_reset_counter_from_zero():
    assert nvlink.growth({"replay": 10, "crc_flit": 3}, {"replay": 2, "crc_flit": 3}) == {
        "replay": 2, "crc": 0}


# -- the monitor child, end to end in its own process
def test_the_monitor_child_lists_samples_and_reads_again_at_the_end(tmp_path):
    me = os.getpid()
    desc = {"gpus": [h200("00000000:18:00.0", processes=[[me, 5 * GiB]], throttle=0x4),
                     h200("00000000:3B:00.0")]}
    (tmp_path / "nvml.json").write_text(json.dumps(desc))
    bindir = tmp_path / "bin"
    fakebin.journal(bindir, [{
        "__CURSOR": "c1", "_SOURCE_MONOTONIC_TIMESTAMP": "9000000",
        "MESSAGE": "NVRM: Xid (PCI:0000:3b:00): 74, pid=1, name=x, NVLink: fatal error"}])
    opts = {"cuda_gate": str(tmp_path / "cuda.gate"), "stop": str(tmp_path / "stop"),
            "sample_every": 0.05}
    (tmp_path / "opts.json").write_text(json.dumps(opts))
    out = tmp_path / "monitor.jsonl"
    env = {**os.environ, "PYTHONPATH": str(FAKE_NVML), "PATH": f"{bindir}:{os.environ['PATH']}",
           "UMPROV_FAKE_NVML": str(tmp_path / "nvml.json")}
    proc = subprocess.Popen([sys.executable, str(agent_zipapp(cache=tmp_path)), "--child",
                             "monitor", "--child-opts", str(tmp_path / "opts.json"),
                             "--child-out", str(out)], env=env)
    try:
        while '"sample"' not in (out.read_text() if out.exists() else ""):
            assert proc.poll() is None, "the monitor ended early"
            time.sleep(0.05)
        assert Path(opts["cuda_gate"]).exists()  # open once the processes were listed
        Path(opts["stop"]).touch()
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
    events = [json.loads(ln) for ln in out.read_text().splitlines()]
    origin = min(e["m"] for e in events)
    recs, got, found = monitor_records(
        events, DEVICES, exclusive=False, infos={0: {}, 1: {}}, profile_of=lambda i: H200,
        window=None, origin=origin, record=record)
    by = _by(recs)
    assert by[("gpu0", "gpu.processes")]["verdict"] == "warn" and me in [
        p["pid"] for p in found["gpu0"]]
    assert by[("gpu1", "xid.74")]["verdict"] == "fail"
    assert by[("gpu0", "nvlink.links")]["verdict"] == "pass"
    assert by[("gpu0", "nvlink.errors")]["verdict"] == "pass"
    first = got[0]
    assert set(first) == {"t", "gpu", "temp_c", "power_w", "sm_clock_mhz", "mem_clock_mhz",
                          "throttle"}
    assert first["t"] >= 0 and first["power_w"] == 300.0
    assert [s["throttle"] for s in got if s["gpu"] == 0][0] == ["sw-power-cap"]


# -- burn-in verdicts from the samples
def _sample(m: float, pci: str = "00000000:18:00.0", **kw) -> dict:
    return {"ev": "sample", "m": m, "pci_bus_id": pci, "temperature_c": 60,
            "power_w": 690.0, "sm_clock_mhz": 1755, "mem_clock_mhz": 3201,
            "throttle_mask": 0x4, "ecc_uncorrected_volatile": 0,
            "ecc_corrected_volatile": 0, **kw}


def test_a_burn_in_at_the_power_cap_passes_and_other_slowdowns_fail():
    evs = [_sample(100.0 + i) for i in range(10)]
    evs += [_sample(100.0 + i, "00000000:3B:00.0", throttle_mask=0x4 | (0x40 if i == 5 else 0),
                    ecc_uncorrected_volatile=1 if i > 7 else 0, temperature_c=50 + 5 * i)
            for i in range(10)]
    evs.append(_sample(500.0, throttle_mask=0x8))  # after the burn-in: not counted
    per = samples.by_gpu(evs, DEVICES)
    recs = _by(samples.burnin_records(per, (100.0, 109.5), {0: {}, 1: {"temp_slowdown_c": 90}},
                                      lambda i: H200, record))
    ok = recs[("gpu0", "burnin.throttle")]
    assert ok["verdict"] == "pass" and "power cap in 10 of them" in ok["detail"]
    hot = recs[("gpu1", "burnin.throttle")]
    assert hot["verdict"] == "fail" and "hw-thermal" in hot["detail"] and hot["hint"] == "cooling"
    assert recs[("gpu1", "burnin.ecc")]["verdict"] == "fail"
    assert recs[("gpu0", "burnin.ecc")]["verdict"] == "pass"
    temp = recs[("gpu1", "burnin.temperature")]
    assert temp["measured"] == 95 and temp["verdict"] == "fail"  # past its slowdown (90 C)


def test_xids_found_while_the_burn_in_runs_are_told_once():
    old = {"xid": 43, "pci": "0000:18:00", "ts": 5.0, "message": "Ch 1"}
    new = {"xid": 79, "pci": "0000:18:00", "ts": 90.0, "message": "GPU has fallen off the bus."}
    events = [{"ev": "xids", "phase": "start", "xids": [old]},
              {"ev": "xids", "phase": "during", "xids": [old]},
              {"ev": "xids", "phase": "during", "xids": [old, new]},
              {"ev": "xids", "phase": "during", "xids": [old, new]}]
    assert new_xids(events) == [new]


def test_progress_line_shows_each_gpu():
    per = samples.by_gpu([_sample(1.0)], DEVICES)
    line = samples.progress_line(40, 600, per, {0: {"tflops": 701.4, "gbps": 4150.2}})
    assert line == "burn-in 40/600 s: gpu0 60 C 690 W 1755 MHz 701 TFLOP/s 4150 GB/s"


@pytest.mark.parametrize(("text", "seconds"), [
    ("0", 0), ("90", 90), ("90s", 90), ("10m", 600), ("10min", 600), ("1h", 3600),
    ("1h30m", 5400), ("1.5m", 90)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "10x", "-5", "m", "1d", "ten"])
def test_bad_durations_name_the_value(text):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


# -- sizing under little free memory
def test_buffers_follow_free_memory_and_checks_skip_rather_than_run_out():
    assert gpuchild.share_of(140 * GiB, 2 * GiB, 0.04) == 2 * GiB
    assert gpuchild.share_of(2 * GiB, 2 * GiB, 0.04) == 81 * MiB
    assert gpuchild.skip_reason(512 * MiB, 20 * GiB) is None
    why = gpuchild.skip_reason(512 * MiB, 600 * MiB)
    assert why == "skipped: needs 512 MiB and 256 MiB to spare, 600 MiB free on this GPU"
    assert gpuchild.skip_reason(gpuchild.share_of(100 * MiB, GiB, 0.04),
                                100 * MiB)  # too small to time


def test_the_nccl_sweep_stops_where_free_memory_does():
    sizes = sorted(busbw.SWEEP)
    assert busbw.sizes_that_fit(sizes, 140 * GiB) == sizes
    assert busbw.sizes_that_fit(sizes, 10 * GiB)[-1] == GiB  # no 4 GiB point
    assert busbw.sizes_that_fit(sizes, 100 * MiB)[-1] == 16 * MiB


def test_the_burn_in_sizes_its_buffers_from_free_memory():
    roomy, tight = plan(140 * GiB, False, 2), plan(4 * GiB, False, 2)
    assert roomy["copy"] == GiB and roomy["nccl"] == 256 * MiB
    assert tight["copy"] < 200 * MiB and tight["nccl"] < 100 * MiB
    assert gpuchild.skip_reason(plan(300 * MiB, False, 2)["total"], 300 * MiB)


# -- the pair schedule
@pytest.mark.parametrize("world", [1, 2, 3, 4, 7, 8])
def test_every_pair_once_and_each_gpu_once_per_round(world):
    rounds = pair_rounds(world)
    pairs = [p for r in rounds for p in r]
    assert sorted(pairs) == [(a, b) for a in range(world) for b in range(a + 1, world)]
    for r in rounds:
        members = [g for p in r for g in p]
        assert len(members) == len(set(members))
    assert len(rounds) <= max(world, 1)
