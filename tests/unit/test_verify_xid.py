"""Xid errors: the kernel log in each format it comes in (journal JSON and short-monotonic,
/dev/kmsg records, dmesg), classified by documented meaning, mapped to GPUs by PCI address;
an unreadable log is a skip that names every reason, never a pass."""

from __future__ import annotations

import json
import os

import pytest

from tests import fakebin
from umprov.verify.agent import xid
from umprov.verify.agent.schema import record

FELL_OFF = ("NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off "
            "the bus.")
DBE = ("NVRM: Xid (PCI:0000:3b:00): 48, pid=2877, name=python3, An uncorrectable double bit error "
       "(DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.")
REMAP = ("NVRM: Xid (PCI:0000:86:00): 63, pid='<unknown>', name=<unknown>, Row Remapper: New row "
         "(0x00000000deadbeef) marked for remapping, reset gpu to activate.")
APP = ("NVRM: Xid (PCI:0000:18:00): 13, pid=3254, name=python, Graphics SM Warp Exception on "
       "(GPC 0, TPC 0, SM 0): Out Of Range Address")
STOPPED = "NVRM: Xid (PCI:0000:18:00): 43, pid=12345, name=python3, Ch 00000010"
DEVICES = [{"index": 0, "pci_bus_id": "00000000:18:00.0"},
           {"index": 1, "pci_bus_id": "00000000:3B:00.0"}]


def test_dmesg_lines():
    text = ("[    3.141593] pci 0000:18:00.0: [10de:2335] type 00 class 0x030200\n"
            f"[ 5112.309562] {FELL_OFF}\n")
    (ev,) = xid.xid_events(xid.parse_bracketed(text))
    assert ev == {"xid": 79, "pci": "0000:18:00", "ts": 5112.309562,
                  "message": "pid='<unknown>', name=<unknown>, GPU has fallen off the bus."}


def test_journal_short_monotonic_lines():
    text = ("-- Journal begins at Mon 2026-11-30 08:00:01 UTC. --\n"
            f"[ 6001.000311] gpu-node-7 kernel: {DBE}\n")
    (ev,) = xid.xid_events(xid.parse_bracketed(text))
    assert (ev["xid"], ev["pci"], ev["ts"]) == (48, "0000:3b:00", 6001.000311)


def test_journal_json_lines_with_text_and_byte_array_messages():
    entries = [
        {"__CURSOR": "s=1;i=1", "__MONOTONIC_TIMESTAMP": "7000000123", "_TRANSPORT": "kernel",
         "_SOURCE_MONOTONIC_TIMESTAMP": "7000000100", "PRIORITY": "4", "MESSAGE": REMAP},
        {"__CURSOR": "s=1;i=2", "__MONOTONIC_TIMESTAMP": "7100000000", "_TRANSPORT": "kernel",
         "MESSAGE": list(APP.encode())},  # journald stores non-UTF-8 text as bytes
    ]
    msgs = xid.parse_journal_json("\n".join(json.dumps(e) for e in entries))
    evs = xid.xid_events(msgs)
    assert [(e["xid"], e["ts"]) for e in evs] == [(63, 7000.0001), (13, 7100.0)]


def test_kmsg_records():
    raw = (f"4,1234,5112309562,-;{FELL_OFF}\n SUBSYSTEM=pci\n DEVICE=+pci:0000:18:00.0\n")
    ts, msg = xid.parse_kmsg_record(raw)
    assert ts == 5112.309562 and msg == FELL_OFF
    assert xid.parse_kmsg_record("no separator") is None


@pytest.mark.parametrize(("code", "message", "verdict", "hint"), [
    (79, "GPU has fallen off the bus.", "fail", "reboot"),
    (48, "An uncorrectable double bit error", "fail", "reset"),
    (63, "Row Remapper: New row marked for remapping", "warn", "reset"),
    (64, "Row Remapper Error", "fail", "isolate"),
    (94, "Contained: SM (0x1). RST: No, D-RST: No", "warn", "reset"),
    (95, "Uncontained: FBHUB. RST: Yes, D-RST: No", "fail", "reset"),
    (74, "NVLink: fatal error detected on link 3", "fail", "reseat"),
    (119, "Timeout after 6s of waiting for RPC response from GPU0 GSP!", "fail", "reset"),
    (120, "GSP task timeout @ pc:0x1b3e200, task: 1", "fail", "reset"),
    (13, "Graphics SM Warp Exception", "warn", "investigate"),
    (31, "MMU Fault: ENGINE GRAPHICS", "warn", "investigate"),
    (43, "Ch 00000010", "info", None),
    (154, "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", "fail",
     "reset"),
    (154, "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", "fail",
     "reboot"),
    (154, "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)", "info",
     None),
    (999, "something new", "info", None),
])
def test_classification_by_documented_meaning(code, message, verdict, hint):
    got = xid.classify(code, message)
    assert (got[0], got[1]) == (verdict, hint)
    assert got[2]


def _read(*lines: tuple[float, str]) -> dict:
    msgs = list(lines)
    return {"source": "dmesg", "messages": len(msgs) + 100, "oldest_s": 1.0,
            "xids": xid.xid_events(msgs), "unreadable": []}


def test_records_name_the_gpu_by_its_pci_address():
    start = _read((10.0, FELL_OFF), (20.0, DBE), (30.0, APP), (31.0, APP),
                  (40.0, "NVRM: Xid (PCI:0000:cc:00): 79, GPU has fallen off the bus."))
    recs = {(r["target"], r["check"]): r for r in xid.xid_records(start, None, DEVICES, record)}
    fell = recs[("gpu0", "xid.79")]
    assert fell["verdict"] == "fail" and fell["hint"] == "reboot" and fell["scope"] == "gpu"
    assert "PCI 0000:18:00" in fell["detail"] and "fallen off the bus" in fell["detail"]
    assert recs[("gpu1", "xid.48")]["verdict"] == "fail"
    app = recs[("gpu0", "xid.13")]
    assert app["verdict"] == "warn" and app["measured"] == 2  # grouped: one record a code
    hidden = recs[("host", "xid.79")]  # a GPU torch does not see (hidden or fallen off)
    assert hidden["scope"] == "host" and "PCI 0000:cc:00" in hidden["detail"]


def test_an_informational_xid_passes_saying_so_and_warns_when_it_came_during_the_run():
    start = _read((30.0, STOPPED))
    (before,) = xid.xid_records(start, None, DEVICES, record)
    assert before["verdict"] == "pass" and before["detail"].startswith("informational: ")
    end = _read((30.0, STOPPED), (90.0, STOPPED))
    (during,) = xid.xid_records(start, end, DEVICES, record)
    assert during["verdict"] == "warn" and "1 during this run" in during["detail"]


def test_a_clean_log_passes_and_names_its_source():
    (rec,) = xid.xid_records(_read((1.0, "Linux version 6.8")), None, DEVICES, record)
    assert rec["check"] == "host.xid" and rec["verdict"] == "pass" and "dmesg" in rec["detail"]


@pytest.fixture
def bindir(tmp_path, monkeypatch):
    d = tmp_path / "bin"
    d.mkdir()
    monkeypatch.setenv("PATH", f"{d}{os.pathsep}{os.environ['PATH']}")
    no_kmsg = str(tmp_path / "no-kmsg")  # this machine's own /dev/kmsg stays out of it
    monkeypatch.setattr(xid, "SOURCES", (("journal", xid.read_journal),
                                         ("/dev/kmsg", lambda: xid.read_kmsg(no_kmsg)),
                                         ("dmesg", xid.read_dmesg)))
    return d


def test_an_unreadable_log_is_a_skip_naming_every_reason(bindir):
    fakebin.shell(bindir, "journalctl", "echo 'No journal files were found.' >&2; echo '-- No entries --'")
    fakebin.shell(bindir, "dmesg", "echo 'dmesg: read kernel buffer failed: Operation not permitted' >&2"
          "; exit 1")
    got = xid.read_kernel_log()
    assert got["source"] is None
    (rec,) = xid.xid_records(got, None, DEVICES, record)
    assert rec["check"] == "host.xid" and rec["verdict"] == "skip"
    for why in ("journal: No journal files were found", "/dev/kmsg: No such file",
                "dmesg: dmesg: read kernel buffer failed: Operation not permitted"):
        assert why in rec["detail"]


def test_a_journal_that_hides_kernel_messages_from_this_user_is_not_a_clean_log(bindir):
    fakebin.shell(bindir, "journalctl", "echo 'Hint: You are currently not seeing messages from other "
          "users and the system.' >&2")
    (bindir / "dmesg.out").write_text(f"[    5.000000] {FELL_OFF}\n")
    fakebin.shell(bindir, "dmesg", f"cat {bindir / 'dmesg.out'}")
    got = xid.read_kernel_log()
    assert got["source"] == "dmesg" and got["xids"][0]["xid"] == 79
    assert "not seeing messages" in got["unreadable"][0]


def test_the_journal_is_read_first_and_then_only_from_its_cursor(bindir, tmp_path):
    line = json.dumps({"__CURSOR": "s=9;i=7", "_SOURCE_MONOTONIC_TIMESTAMP": "5000000",
                       "MESSAGE": FELL_OFF})
    args, out = tmp_path / "args", tmp_path / "journal.out"
    out.write_text(line + "\n")
    fakebin.shell(bindir, "journalctl", f'echo "$@" >> {args}; cat {out}')
    first = xid.read_kernel_log()
    assert first["source"] == "journal" and first["cursor"] == "s=9;i=7"
    xid.read_kernel_log(first)
    calls = args.read_text().splitlines()
    assert "-k -b -o json" in calls[0] and "--after-cursor=s=9;i=7" in calls[1]
