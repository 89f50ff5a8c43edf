"""The verify report: the run document, exit codes and renderers.

One document per host (``schema: umprov.verify.host``, ``schema_version: 1``; its shape, the
record fields and ``validate`` live with the agent in umprov/verify/agent/schema.py), produced
by the agent or, for a host the agent could not run on, by ``failed_host_report``. ``umprov
verify --json`` prints a run document (``schema: umprov.verify.run``) holding the host
documents. Renderers: a terminal table (stderr), JUnit XML, and a node_exporter textfile.
"""

from __future__ import annotations

import math
import socket
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from umprov.errors import ExitCode, TrustError, UmprovError, Unreachable
from umprov.hosts.results import HostOutcome
from umprov.hosts.results import exit_code as outcomes_exit_code
from umprov.verify.agent.busbw import size_text
from umprov.verify.agent.schema import (
    SCHEMA_VERSION,
    VERDICTS,
    exit_code_for,
    host_report,
    record,
    validate,
    worst,
)

RUN_SCHEMA = "umprov.verify.run"
PROM_FILE = "umprov_verify.prom"
VERDICT_CODE = {"pass": 0, "warn": 1, "fail": 2, "skip": 3}


def failed_host_report(host: str, check: str, detail: str, *, hint: str = "investigate",
                       reason: str | None = "error", mode: str = "full") -> dict:
    """A host document for a host the agent never ran on (unreachable, no container...)."""
    rec = record("host", "host", check, "fail", detail=detail, hint=hint, reason=reason)
    return host_report(host, [rec], mode=mode, profile="none")


def checked(doc: Any, host: str) -> dict:
    """The document if it is valid, else a failing document saying why."""
    problems = validate(doc)
    if problems:
        return failed_host_report(
            host, "agent.report", f"the agent's report is not valid: {'; '.join(problems[:3])}"
        )
    return doc


def exit_code(verdict: str) -> ExitCode:
    """The agent's verdict -> exit code mapping, as umprov's ExitCode."""
    return ExitCode(exit_code_for(verdict))


def run_verdict(docs: Sequence[dict]) -> str:
    return worst(d["verdict"] for d in docs) if docs else "fail"


# How a host that could not be reached is written in its failing record's detail; the writers
# (remote.py, multinode.py) and unreachable() below share it.
UNREACHABLE = "unreachable: "


# ... and a host whose SSH key is unknown or changed (exit 6, as in every command).
UNTRUSTED = "untrusted: "


def connect_failure(exc: UmprovError) -> tuple[str, str, str]:
    """How a host whose connection failed is written: its progress state, the failing
    record's detail and hint. Only Unreachable is unreachable (exit 11) and only TrustError
    untrusted (exit 6); a refused login or a stopped engine fails as any other error."""
    if isinstance(exc, Unreachable):
        return "unreachable", f"{UNREACHABLE}{exc}", "investigate"
    if isinstance(exc, TrustError):
        return "untrusted", f"{UNTRUSTED}{exc}", "config"
    return "failed", str(exc), "config"


def unreachable(doc: Mapping[str, Any], prefix: str = UNREACHABLE) -> bool:
    """A host that failed only because it could not be reached (or was lost mid-run); with
    ``prefix`` UNTRUSTED: only because its SSH key was refused."""
    fails = [r for r in doc.get("records", []) if r.get("verdict") == "fail"]
    return bool(fails) and all(
        r.get("check") in ("agent.connect", "connect")
        and str(r.get("detail") or "").startswith(prefix)
        for r in fails
    )


def outcome(doc: Mapping[str, Any]) -> HostOutcome:
    """A host's report as the outcome every command gives: its verdict, or unreachable (or
    untrusted) when that is all that failed; a host with nothing but skips has not passed."""
    verdict, detail = str(doc["verdict"]), ""
    if verdict == "fail" and unreachable(doc):
        verdict = "unreachable"
    elif verdict == "fail" and unreachable(doc, UNTRUSTED):
        verdict = "untrusted"
        detail = str(doc["records"][0].get("detail") or "").removeprefix(UNTRUSTED)
    elif verdict not in ("pass", "warn", "unreachable"):
        verdict = "fail"
    return HostOutcome(str(doc.get("host", "")), verdict, detail)


def run_exit_code(docs: Sequence[dict]) -> ExitCode:
    """As provision and deploy (umprov.hosts.results): 11 when the only failures are hosts that
    could not be reached, 13 as soon as one reachable host fails a check; no host is a fail."""
    if not docs:
        return ExitCode.VERIFY_FAIL
    return outcomes_exit_code([outcome(d) for d in docs], failed=ExitCode.VERIFY_FAIL)


def read_run(path: Path) -> list[dict]:
    """The host documents of a run file (``umprov verify --json``: a run document, or a single
    host document); one-line errors naming the file: missing (exit 2), not a report (exit 4)."""
    import json

    from umprov.errors import ConfigError, UmprovError

    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UmprovError(f"{path}: no such file", exit_code=ExitCode.USAGE) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read it: {exc}") from None
    except ValueError as exc:
        raise ConfigError(f"{path}: not JSON: {exc}") from None
    docs = data.get("hosts") if isinstance(data, dict) and data.get("schema") == RUN_SCHEMA \
        else [data]
    if not isinstance(docs, list):
        raise ConfigError(f"{path}: its 'hosts' is not a list of host reports")
    for i, doc in enumerate(docs):
        problems = validate(doc)
        if problems:
            where = f"hosts[{i}]: " if len(docs) > 1 or doc is not data else ""
            raise ConfigError(f"{path}: not a verify report ({RUN_SCHEMA} or "
                              f"umprov.verify.host): {where}{'; '.join(problems[:2])}")
    return docs


def run_document(docs: Sequence[dict], seconds: float) -> dict:
    verdict = run_verdict(docs)
    return {
        "schema": RUN_SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "verdict": verdict,
        "exit_code": int(run_exit_code(docs)),
        "seconds": round(seconds, 2),
        "hosts": list(docs),
    }


# ---------------------------------------------------------------------------------------------
# Terminal


def _cell(value: Any, unit: str | None = None) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        text = f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    else:
        text = str(value)
    return f"{text} {unit}" if unit else text


def table_rows(docs: Sequence[dict], *, all_rows: bool = True) -> list[list[str]]:
    rows = []
    for doc in docs:
        for r in doc["records"]:
            if not all_rows and r["verdict"] in ("pass", "skip"):
                continue
            rows.append([
                doc["host"], r["target"], check_label(r), _cell(r["measured"], r["unit"]),
                _cell(r["limit"]), r["verdict"].upper(), r["hint"] or "", _short(r["detail"]),
            ])
    return rows


def check_label(r: Mapping[str, Any]) -> str:
    """A record's check as people read it: a sweep point with its size ("... 4 GiB")."""
    size = r.get("size_bytes")
    return str(r["check"]) + (f" {size_text(size)}" if size is not None else "")


def _short(text: str, limit: int = 90) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def print_report(docs: Sequence[dict], *, all_rows: bool = True) -> None:
    from umprov.output import print_table, say

    rows = table_rows(docs, all_rows=all_rows)
    verdict = run_verdict(docs)
    if rows:
        print_table(
            f"verify: {len(docs)} host(s), {verdict}",
            ["host", "target", "check", "measured", "limit", "verdict", "hint", "detail"],
            rows,
        )
    for doc in docs:
        for r in doc["records"]:
            if r["verdict"] in ("warn", "fail") and len(r["detail"]) > 90:
                say(f"{r['verdict'].upper()} {doc['host']} {r['target']} {r['check']}: "
                    f"{r['detail']}")
    for doc in docs:
        s = doc["summary"]
        say(f"{doc['host']}: {doc['verdict']} ({s['fail']} fail, {s['warn']} warn, "
            f"{s['pass']} pass, {s['skip']} skip; profile {doc['profile']}, {doc['mode']}, "
            f"{doc['wall_s']:.1f} s)")


# ---------------------------------------------------------------------------------------------
# JUnit XML


def to_junit(docs: Sequence[dict]) -> str:
    """One testsuite per host, one testcase per record: fail -> failure (or error for a
    timeout/crash), skip -> skipped, warn -> a passing case whose system-out says WARN."""
    root = ET.Element("testsuites", name="umprov verify")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for doc in docs:
        suite = ET.SubElement(root, "testsuite", name=f"umprov.verify.{doc['host']}",
                              hostname=doc["host"], timestamp=doc["started"],
                              time=f"{doc['wall_s']:.2f}")
        props = ET.SubElement(suite, "properties")
        for key in ("schema_version", "agent_version", "profile", "mode", "verdict"):
            ET.SubElement(props, "property", name=key, value=str(doc[key]))
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        for r in doc["records"]:
            counts["tests"] += 1
            case = ET.SubElement(suite, "testcase", classname=f"{doc['host']}.{r['target']}",
                                 name=check_label(r), time="0")
            text = _junit_text(r)
            if r["verdict"] == "fail":
                kind = "error" if r["reason"] in ("timeout", "crash") else "failure"
                counts["errors" if kind == "error" else "failures"] += 1
                el = ET.SubElement(case, kind, message=_short(r["detail"], 200),
                                   type=r["reason"] or r["hint"] or "fail")
                el.text = text
            elif r["verdict"] == "skip":
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", message=_short(r["detail"], 200))
            else:
                out = ET.SubElement(case, "system-out")
                out.text = ("WARN " if r["verdict"] == "warn" else "") + text
        for key, value in counts.items():
            suite.set(key, str(value))
            totals[key] += value
    for key, value in totals.items():
        root.set(key, str(value))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _junit_text(r: dict) -> str:
    parts = [f"measured={_cell(r['measured'], r['unit'])}"]
    if r["limit"] is not None:
        parts.append(f"limit={_cell(r['limit'])}")
    if r["expected"] is not None:
        parts.append(f"expected={_cell(r['expected'])}")
    if r["hint"]:
        parts.append(f"hint={r['hint']}")
    return " ".join(parts) + (f"\n{r['detail']}" if r["detail"] else "")


def write_junit(path: Path, docs: Sequence[dict]) -> None:
    from umprov.paths import write_atomic

    write_atomic(path, to_junit(docs))


# ---------------------------------------------------------------------------------------------
# Prometheus node_exporter textfile


def _label(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**kv: Any) -> str:
    return "{" + ",".join(f'{k}="{_label(v)}"' for k, v in kv.items()) + "}"


def _number(value: Any) -> float | int | None:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        return value  # an int stays one: exact however large
    return None


def sample_value(value: float | int) -> str:
    """A sample value written exactly (a timestamp keeps every digit): integers as integers,
    other floats as the shortest text that reads back as the same float."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


def to_prometheus(docs: Sequence[dict], *, now: float | None = None) -> str:
    """The node_exporter textfile format (text exposition 0.0.4), one file for all hosts."""
    now = time.time() if now is None else now
    metrics: dict[str, tuple[str, list[str]]] = {
        "umprov_verify_host_verdict": (
            "Host verdict: 0 pass, 1 warn, 2 fail, 3 skip.", []),
        "umprov_verify_check_verdict": (
            "Check verdict: 0 pass, 1 warn, 2 fail, 3 skip.", []),
        "umprov_verify_measured": ("Measured value of a check, in its unit label.", []),
        "umprov_verify_limit": ("Pass limit of a check, in its unit label.", []),
        "umprov_verify_checks": ("Checks by verdict.", []),
        "umprov_verify_duration_seconds": ("Wall time of the verification.", []),
        "umprov_verify_last_run_timestamp_seconds": ("When the report was written.", []),
    }

    def add(name: str, labels: str, value: float | int) -> None:
        metrics[name][1].append(f"{name}{labels} {sample_value(value)}")

    for doc in docs:
        host = doc["host"]
        add("umprov_verify_host_verdict", _labels(host=host, profile=doc["profile"],
                                                  mode=doc["mode"]), VERDICT_CODE[doc["verdict"]])
        for verdict in VERDICTS:
            add("umprov_verify_checks", _labels(host=host, verdict=verdict),
                doc["summary"].get(verdict, 0))
        add("umprov_verify_duration_seconds", _labels(host=host), doc["wall_s"])
        add("umprov_verify_last_run_timestamp_seconds", _labels(host=host), now)
        for r in doc["records"]:
            base = {"host": host, "target": r["target"], "check": r["check"]}
            if r.get("size_bytes") is not None:  # a point of a sweep: one series per size
                base["size_bytes"] = r["size_bytes"]
            add("umprov_verify_check_verdict", _labels(**base, hint=r["hint"] or ""),
                VERDICT_CODE[r["verdict"]])
            value = _number(r["measured"])
            if value is not None:
                add("umprov_verify_measured", _labels(**base, unit=r["unit"] or ""), value)
            if r["limit"] is not None:
                add("umprov_verify_limit", _labels(**base, unit=r["unit"] or ""), r["limit"])
    lines: list[str] = []
    for name, (help_text, samples) in metrics.items():
        if not samples:
            continue
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", *samples]
    return "\n".join(lines) + "\n"


def write_prometheus(directory: Path, docs: Sequence[dict]) -> Path:
    """Write DIR/umprov_verify.prom atomically (node_exporter never reads half a file)."""
    from umprov.paths import write_atomic

    path = Path(directory) / PROM_FILE
    write_atomic(path, to_prometheus(docs))
    return path


def local_host_name() -> str:
    return socket.gethostname()


def hosts_of(docs: Iterable[dict]) -> list[str]:
    return [d["host"] for d in docs]
