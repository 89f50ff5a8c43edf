"""Xid errors: the NVIDIA driver's ``NVRM: Xid`` lines in the kernel log, read and judged.

The log comes from the first source this host offers and this user may read: the systemd
journal (``journalctl -k -b -o json``), /dev/kmsg, or ``dmesg``. A log that cannot be read is a
``skip`` naming every reason, never a pass. Each Xid is classified by its documented meaning
(NVIDIA's Xid catalogue) into fail / warn / info with a remediation hint, grouped per GPU and
code, and named by the PCI address the line carries (mapped to the GPU index through the
devices' PCI bus ids). The monitor child reads the log at the start and at the end of the run;
what the second read adds happened during the run, and an informational Xid then warns.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import subprocess
from typing import Any

# code -> (verdict, hint, meaning); "info" is a passing record that says what happened.
XID_MEANINGS: dict[int, tuple[str, str | None, str]] = {
    13: ("warn", "investigate", "graphics engine exception, usually an application fault"),
    31: ("warn", "investigate", "GPU memory page fault, usually an application's bad address"),
    43: ("info", None, "GPU stopped an application's channel (an application fault)"),
    45: ("info", None, "preemptive cleanup of channels after an earlier error"),
    48: ("fail", "reset", "uncorrectable double-bit ECC error in GPU memory"),
    63: ("warn", "reset", "ECC page retirement or row remap recorded: a GPU reset applies it"),
    64: ("fail", "isolate", "ECC page retirement or row remapping failed"),
    74: ("fail", "reseat", "NVLink error"),
    79: ("fail", "reboot", "GPU has fallen off the bus"),
    92: ("warn", "investigate", "high single-bit ECC error rate"),
    94: ("warn", "reset", "contained ECC error: the application was stopped, reset to remap"),
    95: ("fail", "reset", "uncontained ECC error: every application on the GPU was affected"),
    119: ("fail", "reset", "GSP RPC timeout (GPU System Processor firmware)"),
    120: ("fail", "reset", "GSP error (GPU System Processor firmware)"),
}
# Xid 154 says which recovery the driver now needs, in its own words.
RECOVERY_154 = (("reboot required", "fail", "reboot"), ("reset required", "fail", "reset"),
                ("drain", "warn", "reset"))
XID_LINE = re.compile(
    r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.\d)?\): "
    r"(\d+),?\s*(.*)")
BRACKET_TS = re.compile(r"^\[\s*(\d+\.\d+)\]\s?(.*)$")


class LogUnreadable(Exception):
    pass


class Log(list):
    """(seconds since boot or None, message) pairs; ``cursor``: where a journal read ended."""

    cursor: str | None = None


# -- line formats: each gives (seconds since boot or None, message)
def parse_bracketed(text: str) -> list[tuple[float | None, str]]:
    """``dmesg`` and ``journalctl -o short-monotonic`` lines: ``[ 1234.567890] message``."""
    out: list[tuple[float | None, str]] = []
    for line in text.splitlines():
        m = BRACKET_TS.match(line.strip())
        if m:
            out.append((float(m.group(1)), m.group(2)))
        elif line.strip() and not line.startswith("--"):
            out.append((None, line.strip()))
    return out


def parse_journal_json(text: str) -> list[tuple[float | None, str]]:
    """``journalctl -o json``: one object a line; MESSAGE may be a list of bytes."""
    out: list[tuple[float | None, str]] = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            out += parse_bracketed(line)  # a journalctl that ignored -o json
            continue
        msg = entry.get("MESSAGE")
        if isinstance(msg, list):
            msg = bytes(x for x in msg if isinstance(x, int) and 0 <= x < 256).decode(
                errors="replace")
        raw = entry.get("_SOURCE_MONOTONIC_TIMESTAMP") or entry.get("__MONOTONIC_TIMESTAMP")
        ts = int(raw) / 1e6 if str(raw or "").isdigit() else None
        out.append((ts, str(msg or "")))
    return out


def parse_kmsg_record(raw: str) -> tuple[float | None, str] | None:
    """One /dev/kmsg record: ``prio,seq,usec,flags[,...];message`` (continuation lines after
    a newline carry key=value pairs)."""
    head, sep, rest = raw.partition(";")
    if not sep:
        return None
    fields = head.split(",")
    ts = int(fields[2]) / 1e6 if len(fields) > 2 and fields[2].isdigit() else None
    return ts, rest.split("\n", 1)[0].rstrip()


# -- sources
def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,  # noqa: S603
                              errors="replace")
    except FileNotFoundError:
        raise LogUnreadable(f"{argv[0]} not installed") from None
    except subprocess.TimeoutExpired:
        raise LogUnreadable(f"{argv[0]} did not answer within {timeout:.0f} s") from None
    except OSError as exc:
        raise LogUnreadable(str(exc)) from None


def read_journal(timeout: float = 20, after: str | None = None) -> Log:
    """This boot's kernel messages; with ``after`` (a cursor) only those that came later."""
    argv = ["journalctl", "-k", "-b", "-o", "json", "--no-pager", "-q"]
    if after:
        argv.append(f"--after-cursor={after}")
    res = _run(argv, timeout)
    why = " ".join(res.stderr.split())[:160]
    if res.returncode != 0 or "No journal files" in res.stderr or "not seeing" in res.stderr:
        raise LogUnreadable(why or f"exit code {res.returncode}")
    msgs = Log(parse_journal_json(res.stdout))
    if not msgs and not after:  # every boot has kernel messages: none kept, or none visible
        raise LogUnreadable("no kernel messages for this boot (" + (why or "none kept") + ")")
    lines = res.stdout.strip().splitlines()
    with contextlib.suppress(ValueError, AttributeError):
        msgs.cursor = json.loads(lines[-1]).get("__CURSOR") if lines else after
    return msgs


def read_kmsg(path: str = "/dev/kmsg") -> Log:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise LogUnreadable(exc.strerror or str(exc)) from None
    out = Log()
    try:
        while True:
            try:
                raw = os.read(fd, 8192)
            except BlockingIOError:
                break  # read everything the ring buffer holds
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # a record was overwritten while reading
                    continue
                raise LogUnreadable(exc.strerror or str(exc)) from None
            if not raw:
                break
            rec = parse_kmsg_record(raw.decode(errors="replace"))
            if rec is not None:
                out.append(rec)
    finally:
        os.close(fd)
    if not out:
        raise LogUnreadable("no records")
    return out


def read_dmesg(timeout: float = 20) -> Log:
    res = _run(["dmesg"], timeout)
    if res.returncode != 0:
        raise LogUnreadable(" ".join(res.stderr.split())[:160] or f"exit {res.returncode}")
    msgs = Log(parse_bracketed(res.stdout))
    if not msgs:
        raise LogUnreadable("empty output")
    return msgs


SOURCES = (("journal", read_journal), ("/dev/kmsg", read_kmsg), ("dmesg", read_dmesg))


def read_kernel_log(earlier: dict | None = None) -> dict:
    """{"source", "messages" (count), "oldest_s", "xids": [...], "unreadable": [reasons],
    "cursor"}; after an ``earlier`` read of the journal, only what came since."""
    reasons = []
    sources = SOURCES
    if earlier and earlier.get("cursor"):
        sources = (("journal", lambda: read_journal(after=earlier["cursor"])),)
    for name, reader in sources:
        try:
            msgs = reader()
        except LogUnreadable as exc:
            reasons.append(f"{name}: {exc}")
            continue
        stamps = [ts for ts, _m in msgs if ts is not None]
        return {"source": name, "messages": len(msgs),
                "oldest_s": min(stamps) if stamps else None, "xids": xid_events(msgs),
                "unreadable": reasons, "cursor": getattr(msgs, "cursor", None)}
    return {"source": None, "messages": 0, "oldest_s": None, "xids": [], "unreadable": reasons}


def xid_events(msgs: list[tuple[float | None, str]]) -> list[dict]:
    out = []
    for ts, text in msgs:
        m = XID_LINE.search(text)
        if m:
            pci = f"{int(m.group(1), 16):04x}:{m.group(2).lower()}:{m.group(3).lower()}"
            out.append({"xid": int(m.group(4)), "pci": pci, "ts": ts,
                        "message": " ".join(m.group(5).split())[:300]})
    return out


# -- judging (in the parent)
def classify(code: int, message: str) -> tuple[str, str | None, str]:
    """(verdict: fail | warn | info, hint, meaning) of one Xid."""
    if code == 154:
        wanted = message.lower().rsplit(" to ", 1)[-1]  # "... from 0x0 (None) to 0x1 (...)"
        for needle, verdict, hint in RECOVERY_154:
            if needle in wanted:
                return verdict, hint, f"the driver asks for recovery: {needle}"
        return "info", None, "the driver's recovery action changed"
    return XID_MEANINGS.get(code, ("info", None, "see NVIDIA's Xid catalogue"))


def pci_key(text: str | None) -> tuple[int, int, int] | None:
    """(domain, bus, device) of "00000000:18:00.0", "0000:18:00" and the like."""
    m = re.match(r"([0-9a-fA-F]+):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})", text or "")
    return (int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16)) if m else None


def xid_records(start: dict, end: dict | None, devices: list[dict],
                record: Any) -> list[dict]:
    """Records from the start and end reads (``record`` is schema.record)."""
    if not start.get("source"):
        return [record("host", "host", "host.xid", "skip",
                       detail="kernel log not readable, Xid errors not checked: "
                       + "; ".join(start.get("unreadable") or ["no source"]))]
    seen = {xid_key(e) for e in start["xids"]}
    later = [e for e in (end or {}).get("xids", []) if xid_key(e) not in seen]
    events = [(e, False) for e in start["xids"]] + [(e, True) for e in later]
    since = (f"{start['source']}, {start['messages']} kernel messages"
             + (f" from {start['oldest_s']:.0f} s after boot" if start.get("oldest_s") else ""))
    if not events:
        return [record("host", "host", "host.xid", "pass", measured=0, unit="events",
                       detail=f"no NVRM Xid in the kernel log ({since})")]
    gpu_of = {pci_key(d.get("pci_bus_id")): d["index"] for d in devices}
    groups: dict[tuple[str, int], list[tuple[dict, bool]]] = {}
    for e, during in events:
        idx = gpu_of.get(pci_key(e["pci"]))
        groups.setdefault((f"gpu{idx}" if idx is not None else "host", e["xid"]), []).append(
            (e, during))
    return [_group_record(target, code, evs, since, record)
            for (target, code), evs in sorted(groups.items())]


def xid_key(e: dict) -> tuple:
    """What tells one Xid line from another across reads of the log."""
    return e["xid"], e["pci"], e["ts"], e["message"]


def _group_record(target: str, code: int, evs: list[tuple[dict, bool]], since: str,
                  record: Any) -> dict:
    last = evs[-1][0]
    during = sum(1 for _e, d in evs if d)
    verdict, hint, meaning = classify(code, last["message"])
    if verdict == "info" and during:
        verdict, hint = "warn", "investigate"  # an Xid while the checks ran is not noise
    when = f", last at {last['ts']:.0f} s after boot" if last["ts"] is not None else ""
    detail = (f"Xid {code} ({meaning}) x{len(evs)} since boot, {during} during this run; "
              f"PCI {last['pci']}{when}: {last['message'][:160]} ({since})")
    if verdict == "info":
        verdict, detail = "pass", "informational: " + detail
    scope = "gpu" if target != "host" else "host"
    return record(scope, target, f"xid.{code}", verdict, measured=len(evs), unit="events",
                  hint=hint, detail=detail)
