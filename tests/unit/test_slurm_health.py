"""The drain/resume rules (verify/agent/slurm.py): reading ``scontrol show node -o``, the
reason umprov writes, and what it does to a node in each state.

The scontrol lines follow Slurm 22.05's one-line format (Debian 12's slurm-wlm 22.05.8): the
fields and their order of that release's node_info.c, the State as BASE+FLAG..., the reason
last with who set it and when. They were written from that format, not captured from a
running slurmctld; the lab tests (docs/slurm.md) check against a real one.
"""

from __future__ import annotations

import pytest

from umprov.verify.agent.schema import host_report, record
from umprov.verify.agent.slurm import (
    MAX_REASON,
    Node,
    decide,
    decide_hold,
    parse_fields,
    parse_node,
    reason_for,
)

HEAD = ("NodeName=gpu07 Arch=x86_64 CoresPerSocket=48 CPUAlloc={alloc} CPUEfctv=192 CPUTot=192 "
        "CPULoad=3.41 AvailableFeatures=h200 ActiveFeatures=h200 Gres=gpu:h200:8(S:0-1) "
        "NodeAddr=10.2.0.17 NodeHostName=gpu07 Version=22.05.8 OS=Linux 6.1.0-18-amd64 #1 SMP "
        "PREEMPT_DYNAMIC Debian 6.1.76-1 (2024-02-01)  RealMemory=2063000 AllocMem=0 "
        "FreeMem=1987011 Sockets=2 Boards=1 State={state} ThreadsPerCore=2 TmpDisk=0 Weight=1 "
        "Owner=N/A MCS_label=N/A Partitions=gpu,debug  BootTime=2024-03-01T09:58:12 "
        "SlurmdStartTime=2024-03-01T10:01:40 LastBusyTime=2024-03-04T17:45:03 "
        "CfgTRES=cpu=192,mem=2063000M,billing=192,gres/gpu=8 AllocTRES={tres} CapWatts=n/a "
        "CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s")


def line(state: str, reason: str = "", *, alloc: int = 0, tail: str = "") -> str:
    tres = "cpu=96,mem=1000G,gres/gpu=4" if alloc else ""
    text = HEAD.format(state=state, alloc=alloc, tres=tres)
    if reason:
        text += f" Reason={reason} [root@2024-03-04T17:46:10]"
    return text + tail


ADMIN = "bad DIMM B3, ticket=4711"
UMPROV = "umprov: gpu3 hbm_copy 2100 GB/s < 2990"
HELD = "umprov: rolling driver change 2024-03-04T17:40Z"


# -- reading scontrol
def test_a_whole_line_is_read_field_by_field():
    fields = parse_fields(line("MIXED", alloc=96))
    assert fields["NodeName"] == "gpu07"
    assert fields["OS"] == "Linux 6.1.0-18-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.76-1 (2024-02-01)"
    assert fields["CfgTRES"] == "cpu=192,mem=2063000M,billing=192,gres/gpu=8"
    assert fields["AllocTRES"] == "cpu=96,mem=1000G,gres/gpu=4"
    assert fields["Gres"] == "gpu:h200:8(S:0-1)"
    assert fields["ExtSensorsTemp"] == "n/s"


@pytest.mark.parametrize(("state", "base", "flags"), [
    ("IDLE", "IDLE", set()),
    ("MIXED", "MIXED", set()),
    ("ALLOCATED+DRAIN", "ALLOCATED", {"DRAIN"}),
    ("IDLE+DRAIN", "IDLE", {"DRAIN"}),
    ("MIXED+COMPLETING+DRAIN", "MIXED", {"COMPLETING", "DRAIN"}),
    ("DOWN+DRAIN+NOT_RESPONDING", "DOWN", {"DRAIN", "NOT_RESPONDING"}),
    ("DOWN*+DRAIN", "DOWN", {"DRAIN", "NOT_RESPONDING"}),  # older scontrol's spelling
    ("IDLE+CLOUD+POWERED_DOWN", "IDLE", {"CLOUD", "POWERED_DOWN"}),
])
def test_the_state_is_a_base_and_flags(state, base, flags):
    node = parse_node(line(state, "x" if "DRAIN" in state else ""))
    assert (node.state, set(node.flags)) == (base, flags)


def test_the_reason_is_read_whole_without_who_set_it():
    node = parse_node(line("IDLE+DRAIN", ADMIN))  # "ticket=4711" looks like a field: it is not
    assert node.reason == ADMIN and not node.ours
    node = parse_node(line("IDLE+DRAIN", UMPROV, tail=" Comment=rack 12"))
    assert node.reason == UMPROV and node.ours and not node.held
    assert parse_node(line("MIXED+DRAIN", HELD, alloc=96)).held


def test_a_line_that_is_not_a_node_is_refused():
    with pytest.raises(ValueError, match="not a scontrol node line"):
        parse_node("Node gpu99 not found")


# -- the reason
def report(*records: dict) -> dict:
    return host_report("gpu07", list(records), mode="full", profile="h200-sxm")


def gpu(target: str, check: str, verdict: str, **kw) -> dict:
    return record("gpu", target, check, verdict, **kw)


HBM = gpu("gpu3", "gpu.hbm_copy", "fail", measured=2100.4, unit="GB/s", limit=2990.0)


@pytest.mark.parametrize(("rec", "text"), [
    (HBM, "umprov: gpu3 hbm_copy 2100 GB/s < 2990"),
    (record("host", "host", "host.gpu_count", "fail", measured=7, unit="GPUs", limit=8),
     "umprov: host gpu_count 7 GPUs < 8"),
    (gpu("gpu1", "ecc.uncorrected_volatile", "fail", measured=3, unit="errors", limit=0),
     "umprov: gpu1 ecc.uncorrected_volatile 3 errors > 0"),
    (gpu("gpu0", "ecc.row_remap_failure", "fail", measured=True),
     "umprov: gpu0 ecc.row_remap_failure"),
    (gpu("gpu2", "gpu.throttle", "fail", measured="0x48"), "umprov: gpu2 throttle 0x48"),
    (gpu("gpu5", "xid.79", "fail", measured=1, unit="events"), "umprov: gpu5 xid.79 1 events"),
    (record("host", "host", "host.driver", "fail", detail="the NVIDIA driver does not answer: "
            "NVML error 18; reboot"), "umprov: host driver the NVIDIA driver does not answer: "
     "NVML error 18"),
    (gpu("gpu4", "managed.prefetch_h2d", "fail", measured=0.8123, unit="x", limit=0.9),
     "umprov: gpu4 managed.prefetch_h2d 0.812 x < 0.9"),
])
def test_the_reason_names_target_check_and_figure(rec, text):
    assert reason_for(report(rec)) == text


def test_more_failures_are_counted_and_passes_give_no_reason():
    two = gpu("gpu6", "gpu.hbm_copy", "fail", measured=1.0, unit="GB/s", limit=2990.0)
    assert reason_for(report(HBM, two)) == "umprov: gpu3 hbm_copy 2100 GB/s < 2990 (+1)"
    assert reason_for(report(gpu("gpu0", "gpu.hbm_copy", "warn", measured=2900))) is None


def test_a_long_reason_is_cut_to_the_limit_keeping_the_start_and_the_count():
    long = record("host", "host", "agent.run", "fail", detail="x" * 300 + "\n\"quoted\" é")
    text = reason_for(report(long, HBM))
    assert len(text) == MAX_REASON
    assert text.startswith("umprov: host agent.run xxx") and text.endswith("... (+1)")
    assert all(c.isascii() and c.isprintable() and c not in "\"'" for c in text)


# -- decisions
FAILED = report(HBM)
PASSED = report(gpu("gpu3", "gpu.hbm_copy", "pass", measured=3100.0, unit="GB/s", limit=2990.0))
PASSIVE_PASS = report(gpu("gpu3", "ecc.uncorrected_volatile", "pass", measured=0))


def node(state: str, reason: str = "") -> Node:
    return parse_node(line(state, reason, alloc=96 if state.startswith(("MIXED", "ALLOC")) else 0))


@pytest.mark.parametrize(("state", "reason", "doc", "kind"), [
    # in service: drain on a failure (running jobs finish), nothing otherwise
    ("IDLE", "", FAILED, "drain"),
    ("ALLOCATED", "", FAILED, "drain"),
    ("MIXED", "", FAILED, "drain"),
    ("IDLE", "", PASSED, "leave"),
    ("MIXED", "", PASSED, "leave"),
    # drained by an administrator: never touched, pass or fail
    ("IDLE+DRAIN", ADMIN, PASSED, "leave"),
    ("IDLE+DRAIN", ADMIN, FAILED, "leave"),
    ("MIXED+DRAIN", ADMIN, FAILED, "leave"),
    ("IDLE+DRAIN", "", PASSED, "leave"),  # drained with no reason at all: not ours either
    # drained by umprov: resumed when the check it failed passes
    ("IDLE+DRAIN", UMPROV, PASSED, "resume"),
    ("MIXED+DRAIN", UMPROV, PASSED, "resume"),
    ("IDLE+DRAIN", UMPROV, PASSIVE_PASS, "leave"),  # a passive pass did not run hbm_copy
    ("IDLE+DRAIN", UMPROV, FAILED, "leave"),  # still failing for the same check
    # down: Slurm keeps jobs off it already
    ("DOWN+NOT_RESPONDING", "", FAILED, "leave"),
    ("DOWN+DRAIN", UMPROV, PASSED, "leave"),
    # held by a rolling change: the health check leaves it to the change's gate
    ("IDLE+DRAIN", HELD, PASSED, "leave"),
    ("IDLE+DRAIN", HELD, FAILED, "leave"),
])
def test_the_health_check_decision_table(state, reason, doc, kind):
    assert decide(node(state, reason), doc).kind == kind


def test_a_new_failure_relabels_a_node_umprov_drained_for_another():
    ecc = gpu("gpu1", "ecc.uncorrected_volatile", "fail", measured=2, unit="errors", limit=0)
    action = decide(node("IDLE+DRAIN", UMPROV), report(ecc))
    assert action.kind == "drain" and action.reason.startswith("umprov: gpu1 ecc.")


def test_an_xid_drain_ends_when_the_log_of_this_boot_is_clean():
    xid = "umprov: gpu5 xid.79 1 events"
    clean = report(record("host", "host", "host.xid", "pass", measured=0))
    assert decide(node("IDLE+DRAIN", xid), clean).kind == "resume"


@pytest.mark.parametrize(("reason", "doc", "kind", "why"), [
    (HELD, PASSED, "resume", "the rolling change's gate passed"),
    (HELD, FAILED, "drain", "1 check(s) failed"),
    (ADMIN, PASSED, "leave", "drained by someone else"),
    ("", PASSED, "leave", "in service"),
])
def test_the_gate_releases_its_own_hold_only(reason, doc, kind, why):
    state = "IDLE+DRAIN" if reason else "IDLE"
    action = decide(node(state, reason), doc, gate=True)
    assert action.kind == kind and action.why.startswith(why)
    if kind == "drain":
        assert action.reason == "umprov: gpu3 hbm_copy 2100 GB/s < 2990"


@pytest.mark.parametrize(("state", "reason", "kind"), [
    ("IDLE", "", "drain"),
    ("MIXED", "", "drain"),
    ("MIXED+DRAIN", HELD, "drain"),  # a re-run: the hold is renewed
    ("IDLE+DRAIN", ADMIN, "leave"),  # the administrator's reason stays
    ("IDLE+DRAIN", UMPROV, "leave"),  # the failing check's reason stays for the gate to judge
    ("DOWN+NOT_RESPONDING", "", "leave"),
])
def test_the_hold_before_a_change(state, reason, kind):
    action = decide_hold(node(state, reason), "driver change 2024-03-04T17:40Z")
    assert action.kind == kind
    if kind == "drain":
        assert action.reason == "umprov: rolling driver change 2024-03-04T17:40Z"


def test_relabelling_a_failed_step_never_drains_a_node_in_service():
    assert decide_hold(node("IDLE"), "failed: x", only_if_held=True).kind == "leave"
    action = decide_hold(node("IDLE+DRAIN", HELD), "failed: Install the driver: apt", only_if_held=True)
    assert action.reason == "umprov: rolling failed: Install the driver: apt"
