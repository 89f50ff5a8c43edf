"""The host report: one versioned JSON document per host, its records, verdicts and exit codes.

Every host document (``schema: umprov.verify.host``, ``schema_version: 1``) comes from
``host_report``: the agent's own run, a host the agent could not run on
(umprov.verify.report.failed_host_report) and each host of a multi-node run
(umprov.verify.multinode_judge.host_reports). Each record::

    scope     host | gpu | pair
    target    "host", "gpu3", or "gpu0-gpu5" for a pair (gpu/peer hold the indices)
    check     dotted name, e.g. managed.prefetch_vs_pinned, nccl.busbw_1g, nccl.send_recv
    measured  number, string, bool or null;  unit: string or null
    limit     the pass limit (null: informational), expected: the profile's value or null
    verdict   pass | warn | fail | skip;  hint: reboot | reset | isolate | ... (warn/fail only)
    detail    one line for people;  reason: null, or error | timeout | crash
    size_bytes  optional (additive in version 1, present only where it applies): the message
              size of a sweep point, e.g. each nccl.allreduce_sweep record

Optional top-level keys of the agent's own documents (additive, version 1): ``samples`` (the
monitor child's readings: {"t": seconds since the run started, "gpu": index, "temp_c",
"power_w", "sm_clock_mhz", "mem_clock_mhz": numbers or null, "throttle": [reason names]}),
``timings`` (where the time went: {"name", "start_s", "seconds", "gpu": index or null,
"child": process name}), ``children_wall_s``.

The exit codes are plain integers here (the agent runs without umprov); umprov.errors.ExitCode
holds the same values, and a unit test keeps them equal.
"""

from __future__ import annotations

import re
import time
from typing import Any

from .profiles import METRICS, judge

SCHEMA = "umprov.verify.host"
SCHEMA_VERSION = 1
AGENT_VERSION = "0.1.0"  # umprov's version, copied: the agent imports no umprov (a test checks)
VERDICTS = ("pass", "warn", "fail", "skip")
SCOPES = ("host", "gpu", "pair")
# Remediation hints, a closed set so dashboards can group by them, and what each asks of a
# person (the HTML page's "Needs action" says it beside the hint).
REMEDIES = {
    "reboot": "reboot the host: a GPU fell off the bus or the driver state is broken",
    "reset": "reset the GPU (nvidia-smi -r) or reboot: pending remaps, sticky errors, hangs",
    "isolate": "drain the GPU or host and replace the hardware (remap failure, wrong results)",
    "reseat": "a PCIe or NVLink link is degraded: check seating, risers and cables",
    "cooling": "the GPU slows down for heat: check airflow and fans",
    "power": "a power brake or hardware slowdown: check the power supply and its limits",
    "fabric-manager": "start nvidia-fabricmanager at the driver's version",
    "persistence": "enable persistence mode (nvidia-persistenced)",
    "driver": "install or fix the NVIDIA driver or the container toolkit",
    "config": "a setting to fix: the expected GPU count, the profile or the environment",
    "investigate": "no known remedy: read the check's detail",
}
HINTS = tuple(REMEDIES)
EXIT_PASS, EXIT_WARN, EXIT_FAIL, EXIT_USAGE = 0, 12, 13, 2


def worst(verdicts: Any) -> str:
    """The host verdict: fail > warn > pass; skips do not count; nothing at all is a fail."""
    seen = set(verdicts)
    for v in ("fail", "warn", "pass"):
        if v in seen:
            return v
    return "fail"


def exit_code_for(verdict: str) -> int:
    """The one verdict -> exit code mapping (0 pass, 12 warn, 13 anything else)."""
    return {"pass": EXIT_PASS, "warn": EXIT_WARN}.get(verdict, EXIT_FAIL)


def record(
    scope: str,
    target: str,
    check: str,
    verdict: str,
    *,
    measured: Any = None,
    unit: str | None = None,
    limit: float | None = None,
    expected: float | None = None,
    detail: str = "",
    hint: str | None = None,
    reason: str | None = None,
    size_bytes: int | None = None,
) -> dict:
    """One result row; the unit of the JSON schema (``size_bytes`` only where given)."""
    if verdict not in VERDICTS:
        raise ValueError(f"bad verdict {verdict}")
    if isinstance(measured, float):
        measured = round(measured, 4)
    gpu = peer = None
    m = re.fullmatch(r"gpu(\d+)(?:-gpu(\d+))?", target)
    if m:
        gpu = int(m.group(1))
        peer = int(m.group(2)) if m.group(2) is not None else None
    rec = {
        "scope": scope,
        "target": target,
        "gpu": gpu,
        "peer": peer,
        "check": check,
        "measured": measured,
        "unit": unit,
        "limit": limit,
        "expected": expected,
        "verdict": verdict,
        "hint": hint if verdict in ("warn", "fail") else None,
        "detail": " ".join(str(detail).split()),
        "reason": reason,
    }
    if size_bytes is not None:
        rec["size_bytes"] = int(size_bytes)
    return rec


def figure(scope: str, target: str, check: str, measured: float | None, metric: str,
           profile: dict, *, judged: bool = True, detail: str = "",
           hint: str = "investigate") -> dict:
    """A bandwidth/rate record judged against the profile."""
    verdict, limit, expected, why = judge(measured, metric, profile, judged=judged)
    text = "; ".join(x for x in (detail, why) if x)
    return record(scope, target, check, verdict, measured=measured, unit=METRICS[metric][0],
                  limit=limit, expected=expected, detail=text, hint=hint)


def host_report(host: str, records: list[dict], *, mode: str, profile: str,
                facts: dict | None = None, wall_s: float = 0.0, started: float | None = None,
                **extra: Any) -> dict:
    """The host document around ``records``: verdict, exit code and summary follow from them;
    ``started`` is a time.time() (default: now). ``extra`` keys (the agent's children_wall_s,
    timings and samples) go between summary and facts."""
    summary = dict.fromkeys(VERDICTS, 0)
    for r in records:
        summary[r["verdict"]] += 1
    verdict = worst(r["verdict"] for r in records)
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "agent_version": AGENT_VERSION,
        "host": host,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "wall_s": round(wall_s, 2),
        "mode": mode,
        "verdict": verdict,
        "exit_code": exit_code_for(verdict),
        "profile": profile,
        "summary": summary,
        **extra,
        "facts": facts if facts is not None else {},
        "records": records,
    }


_RECORD_FIELDS: dict[str, tuple[type, ...]] = {
    "scope": (str,),
    "target": (str,),
    "gpu": (int, type(None)),
    "peer": (int, type(None)),
    "check": (str,),
    "measured": (int, float, str, bool, type(None)),
    "unit": (str, type(None)),
    "limit": (int, float, type(None)),
    "expected": (int, float, type(None)),
    "verdict": (str,),
    "hint": (str, type(None)),
    "detail": (str,),
    "reason": (str, type(None)),
}
_DOC_FIELDS: dict[str, tuple[type, ...]] = {
    "schema": (str,),
    "schema_version": (int,),
    "agent_version": (str,),
    "host": (str,),
    "started": (str,),
    "wall_s": (int, float),
    "mode": (str,),
    "verdict": (str,),
    "exit_code": (int,),
    "profile": (str,),
    "summary": (dict,),
    "facts": (dict,),
    "records": (list,),
}


def validate(doc: Any) -> list[str]:
    """Problems with a host document against schema version 1; empty when it is valid."""
    if not isinstance(doc, dict):
        return ["the report is not a JSON object"]
    problems = []
    for key, types in _DOC_FIELDS.items():
        if key not in doc:
            problems.append(f"missing field {key}")
        elif not isinstance(doc[key], types) or (isinstance(doc[key], bool) and bool not in types):
            problems.append(f"field {key} has type {type(doc[key]).__name__}")
    if problems:
        return problems
    if doc["schema"] != SCHEMA:
        problems.append(f"schema is {doc['schema']!r}, not {SCHEMA!r}")
    if doc["schema_version"] != SCHEMA_VERSION:
        problems.append(f"schema_version {doc['schema_version']} is not {SCHEMA_VERSION}")
    if doc["verdict"] not in VERDICTS:
        problems.append(f"verdict {doc['verdict']!r} is not one of {VERDICTS}")
    for i, rec in enumerate(doc["records"]):
        problems += [f"records[{i}]: {p}" for p in validate_record(rec)]
    if not problems and doc["records"] and doc["verdict"] != worst(
        r["verdict"] for r in doc["records"]
    ):
        problems.append("verdict does not match the records")
    return problems


def validate_record(rec: Any) -> list[str]:
    if not isinstance(rec, dict):
        return ["not an object"]
    problems = []
    for key, types in _RECORD_FIELDS.items():
        if key not in rec:
            problems.append(f"missing field {key}")
        elif not isinstance(rec[key], types):
            problems.append(f"field {key} has type {type(rec[key]).__name__}")
    if problems:
        return problems
    if rec["scope"] not in SCOPES:
        problems.append(f"scope {rec['scope']!r}")
    if rec["verdict"] not in VERDICTS:
        problems.append(f"verdict {rec['verdict']!r}")
    if rec["hint"] is not None and rec["hint"] not in HINTS:
        problems.append(f"hint {rec['hint']!r}")
    size = rec.get("size_bytes")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
        problems.append(f"size_bytes {size!r}")
    return problems
