#!/usr/bin/env python3
"""umprov's GPU verification agent: one file, standard library and torch only.

Copy it alone into any PyTorch image (or run it on a GPU host) and run::

    python3 agent.py --json report.json [--quick] [--expected-gpus N] [--profile-file F]
                     [--profile NAME] [--timeout S]

It writes one versioned JSON document (schema below) and exits 0 (pass), 12 (warnings only) or
13 (a failing check). It is importable too: umprov's profiles and reports read its constants.

How it runs: this process never touches a GPU. Every test runs in a child process (this file,
started again with ``--child KIND``) with a deadline; a child that does not finish in time is
killed with its whole process group and its check is reported as failed with reason "timeout",
so one hung GPU cannot hang the run. Children append JSON lines (a start marker before each
check, then its record) to a file, so a killed child still leaves the checks it finished and
names the one that hung. Order: ``discover`` (versions, devices), then one ``gpu`` child per
GPU plus the ``alloc`` child (cudaMallocAsync backend) in parallel, then one ``nccl`` child per
GPU (a process group over loopback). Across hosts, torchrun starts ``--child multinode`` once
per GPU of every host (umprov/verify/multinode.py drives it). Timed host-link transfers of the
per-GPU children take a file lock, so GPUs measured in parallel do not share the host's memory
bandwidth while timed.

Safety: NVLink multicast stays off in every child (NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 are set where absent); managed
memory buffers are a small fraction of the free device memory, never oversubscribed.

Compatible with Python 3.8+ (images ship old interpreters): no match statements, no zip(strict).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import ctypes
import ctypes.util
import glob
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any

SCHEMA = "umprov.verify.host"
SCHEMA_VERSION = 1
AGENT_VERSION = "0.1.0"
VERDICTS = ("pass", "warn", "fail", "skip")
SCOPES = ("host", "gpu", "pair")
# Remediation hints, a closed set so dashboards can group by them.
HINTS = (
    "reboot",  # a GPU fell off the bus or the driver state is broken
    "reset",  # GPU reset (nvidia-smi -r) or reboot: pending remaps, sticky errors, hangs
    "isolate",  # drain the GPU/host and replace hardware (remap failure, wrong results)
    "reseat",  # PCIe or NVLink link degraded: check seating, risers, cables
    "cooling",  # thermal slowdown
    "power",  # power brake or hardware slowdown
    "fabric-manager",  # start nvidia-fabricmanager at the driver's version
    "persistence",  # enable persistence mode (nvidia-persistenced)
    "driver",  # install or fix the NVIDIA driver / container toolkit
    "config",  # a setting to fix: expected GPU count, profile, environment
    "investigate",  # a failure without a known remedy: read the detail
)
EXIT_PASS, EXIT_WARN, EXIT_FAIL, EXIT_USAGE = 0, 12, 13, 2
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
_T0 = time.monotonic()
HANG_ENV = "UMPROV_VERIFY_TEST_HANG"  # test hook: a child or check of this name sleeps forever
DEFAULT_TIMEOUT = 120.0
GiB = 1 << 30
MiB = 1 << 20

# ---------------------------------------------------------------------------------------------
# Profiles: expected values per GPU model, as plain data so they travel inside this file.
# Thresholds are ratios of the expected value: measured >= expected*pass -> pass,
# >= expected*warn -> warn, else fail. Expected values are healthy measurements, not spec
# sheet peaks (reference: a 2x H200 SXM machine, bench/README.md).

METRICS: dict[str, tuple[str, str]] = {
    # key: (unit, meaning)
    "bf16_tflops": ("TFLOP/s", "bf16 8192^3 matmul rate"),
    "hbm_copy_gbps": ("GB/s", "device-to-device copy, bytes read + written"),
    "h2d_gbps": ("GB/s", "pinned host-to-device copy"),
    "d2h_gbps": ("GB/s", "pinned device-to-host copy"),
    "managed_prefetch_ratio": ("x", "managed prefetch to GPU / pinned host-to-device, same run"),
    "managed_fault_gbps": ("GB/s", "managed memory migrated by GPU page faults"),
    "managed_prefetch_d2h_gbps": ("GB/s", "managed prefetch back to the host"),
    "managed_remote_read_ratio": ("x", "GPU reads of host-preferred managed memory / pinned H2D"),
    "p2p_gbps": ("GB/s", "NCCL send/recv between two GPUs, one direction"),
    "nccl_busbw_1g_gbps": ("GB/s", "NCCL all_reduce bus bandwidth at 1 GiB"),
    "nccl_busbw_4g_gbps": ("GB/s", "NCCL all_reduce bus bandwidth at 4 GiB"),
}
LIMITS: dict[str, str] = {
    "temperature_warn_c": "GPU temperature that warns (the GPU's slowdown threshold wins)",
    "temperature_fail_c": "GPU temperature that fails",
    "ecc_uncorrected_max": "volatile uncorrectable ECC errors allowed",
    "pair_outlier_ratio": "a GPU pair below this fraction of the best pair warns",
}
DEFAULT_RATIOS = (0.85, 0.70)
WARN_ONLY_DEFAULT = ("managed_fault_gbps", "managed_prefetch_d2h_gbps")
_BASE_LIMITS = {
    "temperature_warn_c": 85.0,
    "temperature_fail_c": 92.0,
    "ecc_uncorrected_max": 0.0,
    "pair_outlier_ratio": 0.7,
}


def _profile(name: str, description: str, match: list[str], expect: dict[str, float]) -> dict:
    return {
        "name": name,
        "description": description,
        "match": match,
        "expect": expect,
        "ratios": {"default": list(DEFAULT_RATIOS), "managed_fault_gbps": [0.4, 0.0],
                   "managed_prefetch_d2h_gbps": [0.5, 0.0]},
        "warn_only": list(WARN_ONLY_DEFAULT),
        "limits": dict(_BASE_LIMITS),
    }


BUILTIN_PROFILES: dict[str, dict] = {
    p["name"]: p
    for p in (
        _profile(
            "h200-sxm",
            "NVIDIA H200 SXM: 141 GB HBM3e, NVLink through NVSwitch, PCIe Gen5 x16",
            [r"\bH200\b(?!\s*NVL)"],
            {
                "bf16_tflops": 740, "hbm_copy_gbps": 4270, "h2d_gbps": 53, "d2h_gbps": 54,
                "managed_prefetch_ratio": 0.89, "managed_fault_gbps": 7,
                "managed_prefetch_d2h_gbps": 11, "managed_remote_read_ratio": 0.95,
                "p2p_gbps": 350, "nccl_busbw_1g_gbps": 327, "nccl_busbw_4g_gbps": 345,
            },
        ),
        _profile(
            "h100-pcie",
            "NVIDIA H100 PCIe / NVL: 80-94 GB HBM, PCIe Gen5 x16, NVLink bridge at most",
            [r"\bH100\b.*\b(PCIe|NVL)\b"],
            {
                "bf16_tflops": 560, "hbm_copy_gbps": 1750, "h2d_gbps": 53, "d2h_gbps": 54,
                "managed_prefetch_ratio": 0.89, "managed_fault_gbps": 7,
                "managed_prefetch_d2h_gbps": 11, "managed_remote_read_ratio": 0.9,
            },
        ),
        _profile(
            "h100-sxm",
            "NVIDIA H100 SXM: 80 GB HBM3, NVLink through NVSwitch, PCIe Gen5 x16",
            [r"\bH100\b"],
            {
                "bf16_tflops": 720, "hbm_copy_gbps": 2950, "h2d_gbps": 53, "d2h_gbps": 54,
                "managed_prefetch_ratio": 0.89, "managed_fault_gbps": 7,
                "managed_prefetch_d2h_gbps": 11, "managed_remote_read_ratio": 0.95,
                "p2p_gbps": 350, "nccl_busbw_1g_gbps": 320, "nccl_busbw_4g_gbps": 340,
            },
        ),
        _profile(
            "a100-sxm-80gb",
            "NVIDIA A100 SXM 80GB: HBM2e, NVLink 3 through NVSwitch, PCIe Gen4 x16",
            [r"\bA100\b.*\bSXM", r"\bA100-SXM"],
            {
                "bf16_tflops": 270, "hbm_copy_gbps": 1800, "h2d_gbps": 24, "d2h_gbps": 25,
                "managed_prefetch_ratio": 0.85, "managed_fault_gbps": 5,
                "managed_prefetch_d2h_gbps": 8, "managed_remote_read_ratio": 0.9,
                "p2p_gbps": 240, "nccl_busbw_1g_gbps": 210, "nccl_busbw_4g_gbps": 225,
            },
        ),
        _profile(
            "generic",
            "Any other GPU: functional checks judged, figures reported without a limit",
            [],
            {},
        ),
    )
}


def merge_profiles(base: dict[str, dict], overrides: dict[str, Any]) -> dict[str, dict]:
    """Apply an override document ({"profiles": {name: partial profile}}) to profiles.

    Known profiles are merged section by section (expect, ratios, limits: key by key; match,
    description, warn_only: replaced). New names start from a copy of ``generic``. Raises
    ValueError naming the first problem.
    """
    out = copy.deepcopy(base)
    raw = overrides.get("profiles") or {}
    if not isinstance(raw, dict):
        raise ValueError("'profiles' must be a mapping of profile name to settings")
    for name, spec in raw.items():
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
            raise ValueError(f"profile name {name!r} is not valid")
        if spec is None:
            spec = {}
        if not isinstance(spec, dict):
            raise ValueError(f"profile {name}: must be a mapping")
        unknown = set(spec) - {"description", "match", "expect", "ratios", "limits",
                               "warn_only", "base"}
        if unknown:
            raise ValueError(f"profile {name}: unknown key {_show(sorted(unknown, key=str)[0])}")
        base_name = spec.get("base", name if name in out else "generic")
        if not isinstance(base_name, str) or base_name not in out:
            raise ValueError(f"profile {name}: base profile {_show(base_name)} does not exist")
        prof = copy.deepcopy(out[base_name])
        prof["name"] = name
        if "description" in spec:
            prof["description"] = str(spec["description"])
        if "match" in spec:
            prof["match"] = _check_match(name, spec["match"])
        if "expect" in spec:
            prof["expect"].update(_check_numbers(name, "expect", spec["expect"], METRICS))
        if "limits" in spec:
            prof["limits"].update(_check_numbers(name, "limits", spec["limits"], LIMITS))
        if "ratios" in spec:
            prof["ratios"].update(_check_ratios(name, spec["ratios"]))
        if "warn_only" in spec:
            wo = spec["warn_only"]
            if not isinstance(wo, list) or any(not isinstance(k, str) or k not in METRICS
                                               for k in wo):
                raise ValueError(f"profile {name}: warn_only must list metric names")
            prof["warn_only"] = list(wo)
        out[name] = prof
    forced = overrides.get("profile")
    if forced is not None and (not isinstance(forced, str) or forced not in out):
        raise ValueError(f"profile {_show(forced)} does not exist "
                         f"(known: {', '.join(sorted(out))})")
    return out


def _show(value: Any, limit: int = 60) -> str:
    """repr() for one-line messages: shortened, and safe for integers too long to print."""
    try:
        text = repr(value)
    except ValueError:
        return f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_match(name: str, value: Any) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"profile {name}: match must be a list of regular expressions")
    for pattern in value:
        try:
            re.compile(pattern)
        except (re.error, OverflowError, RecursionError) as exc:
            raise ValueError(f"profile {name}: match {_show(pattern)}: {exc}") from None
    return list(value)


def _check_numbers(name: str, section: str, value: Any, known: dict) -> dict[str, float]:
    if not isinstance(value, dict):
        raise ValueError(f"profile {name}: {section} must be a mapping")
    out: dict[str, float] = {}
    for key, num in value.items():
        if key not in known:
            close = [k for k in known if k.split("_")[0] == str(key).split("_")[0]]
            tip = f" (did you mean {close[0]}?)" if close else ""
            raise ValueError(f"profile {name}: unknown {section} key {_show(key)}{tip}")
        if num is None:
            out[key] = None  # type: ignore[assignment]  # null removes an expectation
            continue
        try:
            ok = not isinstance(num, bool) and isinstance(num, (int, float)) and num >= 0
            ok = ok and math.isfinite(float(num))
        except OverflowError:  # an integer too large for a float
            ok = False
        if not ok:
            raise ValueError(
                f"profile {name}: {section}.{key} must be a number >= 0, and finite"
            )
        out[key] = float(num)
    return out


def _check_ratios(name: str, value: Any) -> dict[str, list[float]]:
    if not isinstance(value, dict):
        raise ValueError(f"profile {name}: ratios must be a mapping of metric to [pass, warn]")
    out: dict[str, list[float]] = {}
    for key, pair in value.items():
        if key != "default" and key not in METRICS:
            raise ValueError(f"profile {name}: unknown ratios key {_show(key)}")
        if (
            not isinstance(pair, (list, tuple))
            or len(pair) != 2
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in pair)
            or not 0 <= pair[1] <= pair[0] <= 2
        ):
            raise ValueError(
                f"profile {name}: ratios.{key} must be [pass, warn] with 0 <= warn <= pass <= 2"
            )
        out[key] = [float(pair[0]), float(pair[1])]
    return out


def select_profile(profiles: dict[str, dict], gpu_name: str | None, forced: str | None) -> dict:
    """The forced profile, else the first whose match pattern finds the GPU name, else generic."""
    if forced:
        return profiles[forced]
    for prof in profiles.values():
        for pattern in prof.get("match", []):
            if gpu_name and re.search(pattern, gpu_name, re.IGNORECASE):
                return prof
    return profiles["generic"]


def judge(
    measured: float | None, metric: str, profile: dict, *, judged: bool = True
) -> tuple[str, float | None, float | None, str]:
    """(verdict, pass limit, expected, explanation) for a higher-is-better figure."""
    if measured is None or (isinstance(measured, float) and math.isnan(measured)):
        return "fail", None, None, "no measurement"
    expected = profile.get("expect", {}).get(metric)
    if expected is None:
        return "pass", None, None, f"no expected value in profile {profile.get('name')}"
    ratios = profile.get("ratios", {})
    p, w = ratios.get(metric) or ratios.get("default") or DEFAULT_RATIOS
    pass_limit, warn_limit = expected * p, expected * w
    if not judged:
        return "pass", None, expected, "not judged in this mode"
    if measured >= pass_limit:
        return "pass", round(pass_limit, 3), expected, ""
    warn_only = metric in profile.get("warn_only", [])
    if warn_only or measured >= warn_limit:
        why = f"below {pass_limit:.3g} ({p:g} x expected {expected:g})"
        return "warn", round(pass_limit, 3), expected, why + (" (warn-only)" if warn_only else "")
    return (
        "fail",
        round(pass_limit, 3),
        expected,
        f"below {warn_limit:.3g} ({w:g} x expected {expected:g})",
    )


def worst(verdicts: Any) -> str:
    """The host verdict: fail > warn > pass; skips do not count; nothing at all is a fail."""
    seen = set(verdicts)
    for v in ("fail", "warn", "pass"):
        if v in seen:
            return v
    return "fail"


def exit_code_for(verdict: str) -> int:
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
) -> dict:
    """One result row; the unit of the JSON schema (see umprov/verify/report.py)."""
    if verdict not in VERDICTS:
        raise ValueError(f"bad verdict {verdict}")
    if isinstance(measured, float):
        measured = round(measured, 4)
    gpu = peer = None
    m = re.fullmatch(r"gpu(\d+)(?:-gpu(\d+))?", target)
    if m:
        gpu = int(m.group(1))
        peer = int(m.group(2)) if m.group(2) is not None else None
    return {
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


def figure(scope: str, target: str, check: str, measured: float | None, metric: str,
           profile: dict, *, judged: bool = True, detail: str = "",
           hint: str = "investigate") -> dict:
    """A bandwidth/rate record judged against the profile."""
    verdict, limit, expected, why = judge(measured, metric, profile, judged=judged)
    text = "; ".join(x for x in (detail, why) if x)
    return record(scope, target, check, verdict, measured=measured, unit=METRICS[metric][0],
                  limit=limit, expected=expected, detail=text, hint=hint)


# ---------------------------------------------------------------------------------------------
# Child-process plumbing


class Emitter:
    """What a child tells the parent: JSON lines, flushed one by one (survives a kill)."""

    def __init__(self, path: str, kind: str) -> None:
        self.kind = kind
        self.fh = open(path, "a", buffering=1)  # noqa: SIM115 (lives as long as the child)

    def _write(self, obj: dict) -> None:
        obj["t"] = round(time.monotonic() - _T0, 3)  # seconds since the child started
        self.fh.write(json.dumps(obj, default=str) + "\n")
        self.fh.flush()

    def start(self, check: str, target: str) -> None:
        self._write({"ev": "start", "check": check, "target": target})
        hang = os.environ.get(HANG_ENV, "")
        names = (self.kind, self.kind.rstrip("0123456789"), check, f"{target}:{check}")
        if hang and hang in names:
            while True:  # the test hook: behave like a hung GPU call
                time.sleep(3600)

    def record(self, rec: dict) -> None:
        self._write({"ev": "record", "record": rec})

    def facts(self, **facts: Any) -> None:
        self._write({"ev": "facts", "facts": facts})

    def event(self, ev: str, **data: Any) -> None:
        self._write({"ev": ev, **data})

    def done(self) -> None:
        self._write({"ev": "done"})


def guarded(em: Emitter, scope: str, target: str, check: str, fn: Any, *args: Any) -> Any:
    """Run one check; an exception becomes a failing record naming it."""
    em.start(check, target)
    try:
        return fn(*args)
    except Exception as exc:  # any error in a check is its result, not the agent's crash
        text = f"{type(exc).__name__}: {exc}"
        hint = "reset" if "CUDA" in text or "cuda" in text else "investigate"
        em.record(record(scope, target, check, "fail", detail=text[:500], hint=hint,
                         reason="error"))
        return None


def child_env(extra: dict[str, str] | None = None, threads: int | None = None) -> dict[str, str]:
    env = dict(os.environ)
    for key, value in MULTICAST_OFF.items():
        env.setdefault(key, value)  # set where absent; a value already there is left alone
    env.setdefault("PYTHONUNBUFFERED", "1")
    if threads:
        env.setdefault("OMP_NUM_THREADS", str(threads))
    if extra:
        env.update(extra)
    return env


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
            self.proc = subprocess.Popen(  # noqa: S603 (our own file, our interpreter)
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

    def wall(self) -> float:
        return round((self.ended or time.monotonic()) - self.started, 2)

    def wait_for(self, ev: str) -> dict | None:
        """Block until the child writes an event of this kind (or ends); that event or None."""
        while True:
            for e in self.events():
                if e.get("ev") == ev:
                    return e
            if self.poll():
                for e in self.events():
                    if e.get("ev") == ev:
                        return e
                return None
            time.sleep(0.02)

    def timeline(self) -> list[list[Any]]:
        """[check, seconds] for each check that took a noticeable time."""
        out = []
        prev: dict | None = None
        for e in self.events():
            if prev is not None and prev.get("ev") == "start" and "t" in e:
                secs = e["t"] - prev["t"]
                if secs >= 0.05:
                    out.append([f"{prev['target']}:{prev['check']}", round(secs, 2)])
            if e.get("ev") in ("start", "record", "done", "facts", "mark"):
                prev = e
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
        out = []
        with contextlib.suppress(OSError), open(self.out_path) as fh:
            for line in fh:
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
        return out

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
            check = (last_start or {}).get("check", self.check)
            target = (last_start or {}).get("target", self.target)
            scope = "pair" if "-gpu" in target else ("gpu" if target.startswith("gpu") else "host")
            if self.timed_out:
                records.append(record(
                    scope, target, check, "fail", hint="reset", reason="timeout",
                    detail=f"timeout: no result within {self.timeout:.0f} s; child process "
                    f"{self.name} was killed (a hung GPU or driver call)",
                ))
            else:
                records.append(record(
                    scope, target, check, "fail", hint="investigate", reason="crash",
                    detail=f"child process {self.name} exited with code {self.rc} before "
                    f"finishing: {self.stderr_tail() or 'no output'}",
                ))
        return records, facts, other


def wait_all(children: list[Child], groups: list[list[Child]] | None = None) -> None:
    """Wait for every child; a group (NCCL ranks) dies together when one member fails."""
    groups = groups or []
    while True:
        pending = [c for c in children if not c.poll()]
        for group in groups:
            failed = [c for c in group if c.rc is not None and (c.rc != 0 or c.timed_out)]
            if failed:
                # Peers of a dead rank wait for it forever: give them a short grace only.
                for c in group:
                    if c.rc is None:
                        c.deadline = min(c.deadline, time.monotonic() + 10)
        if not pending:
            return
        time.sleep(0.05)


# ---------------------------------------------------------------------------------------------
# NVML: nvidia-ml-py (pynvml) when importable, else nvidia-smi's CSV query


class Nvml:
    """Per-GPU management facts. ``info`` returns a dict; missing facts are None."""

    def __init__(self) -> None:
        self.kind = "none"
        self.pynvml: Any = None
        self.smi = shutil.which("nvidia-smi")
        self.error = ""
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            self.pynvml = pynvml
            self.kind = "pynvml"
        except Exception as exc:  # not installed, or no driver: fall back
            self.error = f"{type(exc).__name__}: {exc}"
            if self.smi:
                self.kind = "nvidia-smi"

    # -- system
    def system(self) -> dict:
        out: dict[str, Any] = {"source": self.kind, "driver": None, "cuda_driver": None,
                               "count": None}
        n = self.pynvml
        if n is not None:
            with contextlib.suppress(Exception):
                out["driver"] = _s(n.nvmlSystemGetDriverVersion())
            with contextlib.suppress(Exception):
                v = n.nvmlSystemGetCudaDriverVersion_v2()
                out["cuda_driver"] = f"{v // 1000}.{(v % 1000) // 10}"
            with contextlib.suppress(Exception):
                out["count"] = n.nvmlDeviceGetCount()
        elif self.smi:
            rows = self._smi(["driver_version", "uuid"], None)
            if rows:
                out["driver"] = rows[0].get("driver_version")
                out["count"] = len(rows)
        return out

    def handle(self, uuid: str | None, pci: str | None, index: int) -> Any:
        n = self.pynvml
        for how, key in ((n.nvmlDeviceGetHandleByUUID, uuid), (n.nvmlDeviceGetHandleByPciBusId,
                                                                pci)):
            if key:
                with contextlib.suppress(Exception):
                    return how(key)
        return n.nvmlDeviceGetHandleByIndex(index)

    def info(self, uuid: str | None = None, pci: str | None = None, index: int = 0) -> dict:
        if self.pynvml is not None:
            return self._info_pynvml(self.handle(uuid, pci, index))
        if self.smi:
            return self._info_smi(uuid, pci, index)
        return {}

    def sample(self, uuid: str | None = None, pci: str | None = None, index: int = 0) -> dict:
        """The fast-changing facts, read while the GPU works: link, throttle, temperature."""
        if self.pynvml is not None:
            return self.sample_from_handle(self.handle(uuid, pci, index))
        if self.smi:
            keys = ["pcie_gen", "pcie_width", "throttle_mask", "temperature_c", "sm_clock_mhz",
                    "power_w"]
            full = self._info_smi(uuid, pci, index, keys)
            return {k: full.get(k) for k in keys}
        return {}

    def _info_pynvml(self, h: Any) -> dict:
        n = self.pynvml
        out: dict[str, Any] = {}
        out["name"] = _s(_try(n.nvmlDeviceGetName, h))
        out["uuid"] = _s(_try(n.nvmlDeviceGetUUID, h))
        pci = _try(n.nvmlDeviceGetPciInfo, h)
        out["pci_bus_id"] = _s(getattr(pci, "busId", None)) if pci is not None else None
        pm = _try(n.nvmlDeviceGetPersistenceMode, h)
        out["persistence"] = None if pm is None else bool(pm)
        out["temperature_c"] = _try(n.nvmlDeviceGetTemperature, h, 0)
        out["temp_slowdown_c"] = _try(n.nvmlDeviceGetTemperatureThreshold, h, 1)
        out["temp_shutdown_c"] = _try(n.nvmlDeviceGetTemperatureThreshold, h, 0)
        ecc = _try(n.nvmlDeviceGetEccMode, h)
        out["ecc_enabled"] = None if ecc is None else bool(ecc[0])
        # NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1, NVML_VOLATILE_ECC = 0
        out["ecc_uncorrected_volatile"] = _try(n.nvmlDeviceGetTotalEccErrors, h, 1, 0)
        rows = _try(n.nvmlDeviceGetRemappedRows, h)
        out["remap_pending"] = None if rows is None else bool(rows[2])
        out["remap_failure"] = None if rows is None else bool(rows[3])
        out["remap_uncorrectable_rows"] = None if rows is None else rows[1]
        pend = _try(n.nvmlDeviceGetRetiredPagesPendingStatus, h)
        out["retired_pending"] = None if pend is None else bool(pend)
        out["pcie_gen_max"] = _try(n.nvmlDeviceGetMaxPcieLinkGeneration, h)
        out["pcie_width_max"] = _try(n.nvmlDeviceGetMaxPcieLinkWidth, h)
        out.update(self.sample_from_handle(h))
        # NVLink: active links and whether they end on an NVSwitch
        active = 0
        switch = False
        links = 0
        for link in range(getattr(n, "NVML_NVLINK_MAX_LINKS", 18)):
            state = _try(n.nvmlDeviceGetNvLinkState, h, link)
            if state is None:
                break
            links += 1
            if state:
                active += 1
                rtype = _try(n.nvmlDeviceGetNvLinkRemoteDeviceType, h, link)
                if rtype == 2:  # NVML_NVLINK_DEVICE_TYPE_SWITCH
                    switch = True
        out["nvlink_links"] = links or None
        out["nvlink_active"] = active if links else None
        out["nvswitch"] = switch if links else None
        out["fabric_state"] = out["fabric_status"] = None
        for fn_name, struct_name in (("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t"),
                                     ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t")):
            fn, struct = getattr(n, fn_name, None), getattr(n, struct_name, None)
            if fn is None or struct is None:
                continue
            fab = struct()  # the versioned struct's constructor sets its version field
            if _try(fn, h, ctypes.byref(fab)) is not None and int(fab.state) != 0:
                out["fabric_state"], out["fabric_status"] = int(fab.state), int(fab.status)
                break
        if out["fabric_state"] is None and self.smi and out.get("uuid"):
            # Some drivers answer only through nvidia-smi (seen: NVML v1 says N/A, smi says
            # Completed on the same GPU).
            smi = self._info_smi(out["uuid"], None, 0, ["fabric_state_text",
                                                        "fabric_status_text"])
            out["fabric_state"], out["fabric_status"] = (smi.get("fabric_state"),
                                                         smi.get("fabric_status"))
        return out

    def sample_from_handle(self, h: Any) -> dict:
        n = self.pynvml
        out: dict[str, Any] = {}
        out["pcie_gen"] = _try(n.nvmlDeviceGetCurrPcieLinkGeneration, h)
        out["pcie_width"] = _try(n.nvmlDeviceGetCurrPcieLinkWidth, h)
        reasons = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            n, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        out["throttle_mask"] = _try(reasons, h) if reasons else None
        out["temperature_c"] = _try(n.nvmlDeviceGetTemperature, h, 0)
        out["sm_clock_mhz"] = _try(n.nvmlDeviceGetClockInfo, h, 1)
        power = _try(n.nvmlDeviceGetPowerUsage, h)
        out["power_w"] = power / 1000 if power is not None else None
        return out

    # nvidia-smi field -> our key (and a converter)
    SMI_FIELDS: dict[str, tuple[str, Any]] = {
        "name": ("name", str),
        "uuid": ("uuid", str),
        "pci_bus_id": ("pci.bus_id", str),
        "persistence": ("persistence_mode", lambda v: v.lower() == "enabled"),
        "temperature_c": ("temperature.gpu", float),
        "temp_slowdown_c": ("temperature.gpu.tlimit", None),
        "ecc_enabled": ("ecc.mode.current", lambda v: v.lower() == "enabled"),
        "ecc_uncorrected_volatile": ("ecc.errors.uncorrected.volatile.total", int),
        "remap_pending": ("remapped_rows.pending", lambda v: v.lower() in ("yes", "1")),
        "remap_failure": ("remapped_rows.failure", lambda v: v.lower() in ("yes", "1")),
        "retired_pending": ("retired_pages.pending", lambda v: v.lower() in ("yes", "1")),
        "pcie_gen": ("pcie.link.gen.current", int),
        "pcie_gen_max": ("pcie.link.gen.max", int),
        "pcie_width": ("pcie.link.width.current", int),
        "pcie_width_max": ("pcie.link.width.max", int),
        "throttle_mask": ("clocks_event_reasons.active", lambda v: int(v, 16)),
        "sm_clock_mhz": ("clocks.sm", float),
        "power_w": ("power.draw", float),
        "fabric_state_text": ("fabric.state", str),
        "fabric_status_text": ("fabric.status", str),
    }

    def _info_smi(self, uuid: str | None, pci: str | None, index: int,
                  keys: list[str] | None = None) -> dict:
        keys = keys or [k for k, (_f, conv) in self.SMI_FIELDS.items() if conv is not None]
        fields = [self.SMI_FIELDS[k][0] for k in keys]
        ident = uuid or pci or str(index)
        rows = self._smi(fields, ident)
        out: dict[str, Any] = {}
        row = rows[0] if rows else {}
        for key in keys:
            field, conv = self.SMI_FIELDS[key]
            raw = row.get(field)
            if raw is None or conv is None or raw.startswith("[") or raw in ("N/A", ""):
                out[key] = None
                continue
            try:
                out[key] = conv(raw)
            except ValueError:
                out[key] = None
        if out.get("fabric_state_text"):
            state = {"not supported": 0, "not started": 1, "in progress": 2,
                     "completed": 3}.get(out["fabric_state_text"].lower())
            out["fabric_state"] = state
            status = out.get("fabric_status_text") or ""
            out["fabric_status"] = 0 if status.lower() in ("success", "") else 1
        return out

    def _smi(self, fields: list[str], ident: str | None) -> list[dict]:
        """Rows of a --query-gpu; a field this nvidia-smi does not know is left out."""
        assert self.smi  # noqa: S101 (callers check)

        def query(fs: list[str]) -> list[list[str]] | None:
            argv = [self.smi, f"--query-gpu={','.join(fs)}", "--format=csv,noheader,nounits"]
            if ident is not None:
                argv.insert(1, f"--id={ident}")
            try:
                res = subprocess.run(argv, capture_output=True, text=True, timeout=30)  # noqa: S603
            except (OSError, subprocess.TimeoutExpired):
                return None
            if res.returncode != 0:
                return None
            return [[c.strip() for c in ln.split(",")] for ln in res.stdout.strip().splitlines()]

        rows = query(fields)
        good = fields
        if rows is None:  # one unknown field fails the whole query: keep the ones that work
            good = [f for f in fields if query([f]) is not None]
            rows = query(good) if good else None
        out = []
        for row in rows or []:
            out.append(dict(zip(good, row)))  # noqa: B905 (Python 3.8 compatible)
        return out


def _s(v: Any) -> Any:
    return v.decode() if isinstance(v, bytes) else v


def _try(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:  # NVML_ERROR_NOT_SUPPORTED and friends: the fact is unknown
        return None


# ---------------------------------------------------------------------------------------------
# CUDA runtime through ctypes: the libcudart that torch loaded (one context, one runtime)


class CudaError(RuntimeError):
    pass


class MemLocation(ctypes.Structure):
    # CUDA 13's cudaMemLocation, passed BY VALUE to cudaMemPrefetchAsync / cudaMemAdvise
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


LOC_DEVICE, LOC_HOST = 1, 2
CPU_DEVICE_ID = -1  # cudaCpuDeviceId in CUDA 12's int-device forms
ADVISE = {"read_mostly": 1, "unset_read_mostly": 2, "preferred": 3, "unset_preferred": 4,
          "accessed_by": 5, "unset_accessed_by": 6}
RANGE_ATTR = {"read_mostly": 1, "preferred": 2, "accessed_by": 3, "last_prefetch": 4}


def find_cudart() -> str | None:
    """The path of the libcudart mapped into this process (torch loads it), if any."""
    with contextlib.suppress(OSError), open("/proc/self/maps") as fh:
        for line in fh:
            if "libcudart.so" in line:
                return line.split()[-1]
    return None


class CudaRt:
    def __init__(self, lib: ctypes.CDLL, path: str) -> None:
        self.lib = lib
        self.path = path
        ver = ctypes.c_int()
        self._check(lib.cudaRuntimeGetVersion(ctypes.byref(ver)), "cudaRuntimeGetVersion")
        self.version = ver.value
        self.v13 = self.version >= 13000
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        lib.cudaMallocManaged.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                                          ctypes.c_uint]
        lib.cudaFree.argtypes = [ctypes.c_void_p]
        lib.cudaDeviceGetAttribute.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int,
                                               ctypes.c_int]
        lib.cudaMemRangeGetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                 ctypes.c_void_p, ctypes.c_size_t]
        if self.v13:
            lib.cudaMemPrefetchAsync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, MemLocation,
                                                 ctypes.c_uint, ctypes.c_void_p]
            lib.cudaMemAdvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                          MemLocation]
        else:
            lib.cudaMemPrefetchAsync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                 ctypes.c_void_p]
            lib.cudaMemAdvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                          ctypes.c_int]

    @classmethod
    def load(cls) -> CudaRt:
        path = find_cudart()
        candidates = [path] if path else []
        candidates += ["libcudart.so", "libcudart.so.13", "libcudart.so.12"]
        found = ctypes.util.find_library("cudart")
        if found:
            candidates.append(found)
        errors = []
        for cand in candidates:
            try:
                return cls(ctypes.CDLL(cand), cand)
            except OSError as exc:
                errors.append(str(exc))
        raise CudaError("no libcudart found (torch may link it statically): " + "; ".join(
            errors[:2]))

    def _check(self, rc: int, what: str) -> None:
        if rc:
            try:
                text = self.lib.cudaGetErrorString(rc).decode()
            except Exception:
                text = ""
            raise CudaError(f"{what} returned {rc} {text}".strip())

    def form(self) -> str:
        return "cudaMemLocation (CUDA 13)" if self.v13 else "int device (CUDA 12)"

    def attr(self, attr: int, dev: int) -> int:
        v = ctypes.c_int()
        self._check(self.lib.cudaDeviceGetAttribute(ctypes.byref(v), attr, dev),
                    f"cudaDeviceGetAttribute({attr})")
        return v.value

    def set_device(self, dev: int) -> None:
        self._check(self.lib.cudaSetDevice(dev), "cudaSetDevice")

    def malloc_managed(self, nbytes: int) -> int:
        p = ctypes.c_void_p()
        self._check(self.lib.cudaMallocManaged(ctypes.byref(p), nbytes, 1), "cudaMallocManaged")
        return int(p.value or 0)

    def free(self, ptr: int) -> None:
        self._check(self.lib.cudaFree(ctypes.c_void_p(ptr)), "cudaFree")

    def _loc(self, dev: int) -> Any:
        if self.v13:
            return MemLocation(LOC_HOST, 0) if dev == CPU_DEVICE_ID else MemLocation(
                LOC_DEVICE, dev)
        return dev

    def prefetch(self, ptr: int, nbytes: int, dev: int, stream: int = 0) -> None:
        """Prefetch to a device, or to the host with dev=-1; the call form by runtime version."""
        if self.v13:
            rc = self.lib.cudaMemPrefetchAsync(ctypes.c_void_p(ptr), nbytes, self._loc(dev), 0,
                                               ctypes.c_void_p(stream))
        else:
            rc = self.lib.cudaMemPrefetchAsync(ctypes.c_void_p(ptr), nbytes, dev,
                                               ctypes.c_void_p(stream))
        self._check(rc, "cudaMemPrefetchAsync")

    def advise(self, ptr: int, nbytes: int, advice: str, dev: int) -> None:
        rc = self.lib.cudaMemAdvise(ctypes.c_void_p(ptr), nbytes, ADVISE[advice], self._loc(dev))
        self._check(rc, f"cudaMemAdvise({advice})")

    def range_attr(self, ptr: int, nbytes: int, attr: str) -> int | None:
        v = ctypes.c_int()
        rc = self.lib.cudaMemRangeGetAttribute(ctypes.byref(v), 4, RANGE_ATTR[attr],
                                               ctypes.c_void_p(ptr), nbytes)
        return None if rc else v.value


class DevArray:
    """Describes raw device (or managed) memory so torch.as_tensor can view it zero-copy."""

    def __init__(self, ptr: int, count: int, typestr: str = "<i4") -> None:
        self.__cuda_array_interface__ = {
            "shape": (count,), "typestr": typestr, "data": (ptr, False), "version": 3,
            "strides": None, "stream": None,
        }


# ---------------------------------------------------------------------------------------------
# Children: discover


def child_discover(em: Emitter, opts: dict) -> None:
    em.start("host.discover", "host")
    import warnings

    facts: dict[str, Any] = {"python": sys.version.split()[0], "executable": sys.executable}
    caught: list[str] = []
    with warnings.catch_warnings(record=True) as warns:
        warnings.simplefilter("always")
        import torch

        facts["torch"] = torch.__version__
        facts["torch_cuda_build"] = torch.version.cuda
        available = torch.cuda.is_available()
        count = torch.cuda.device_count() if available else 0
        caught = [str(w.message) for w in warns if "CUDA" in str(w.message)
                  or "driver" in str(w.message).lower()]
    facts["cuda_available"] = available
    facts["cuda_error"] = ""
    if not available and torch.version.cuda:
        try:
            torch.cuda.init()
        except Exception as exc:  # the CUDA error text is the diagnosis
            facts["cuda_error"] = " ".join(str(exc).split())[:400]
        if not facts["cuda_error"] and caught:
            facts["cuda_error"] = " ".join(caught[0].split())[:400]
    devices = [device_identity(torch, i) for i in range(count)]
    facts["devices"] = devices
    # The parent starts the NCCL ranks on this; the slower facts follow.
    em.event("devices", devices=devices, cuda_error=facts["cuda_error"],
             torch=facts["torch"], torch_cuda_build=facts["torch_cuda_build"],
             cuda_available=available)
    facts["cuda_runtime"] = None
    facts["nccl"] = None
    if available:
        with contextlib.suppress(Exception):
            v = torch.cuda.nccl.version()
            facts["nccl"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
        with contextlib.suppress(Exception):
            rt = CudaRt.load()
            facts["cuda_runtime"] = f"{rt.version // 1000}.{(rt.version % 1000) // 10}"
            facts["cudart_path"] = rt.path
    nv = Nvml()
    facts["nvml"] = nv.system()
    facts["nvml_error"] = nv.error if nv.kind != "pynvml" else ""
    facts["gpus_nvml"] = []
    for d in devices:
        info = nv.info(d["uuid"], d["pci_bus_id"], d["index"]) if nv.kind != "none" else {}
        facts["gpus_nvml"].append(info)
    em.facts(**facts)
    # This child was started with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync for this.
    if devices:
        alloc_checks(em, torch, opts)
    em.done()


def device_lock(opts: dict, dev: int) -> str | None:
    lock = opts.get("lock")
    return os.path.join(os.path.dirname(lock), f"gpu{dev}.lock") if lock else None


def device_identity(torch: Any, i: int) -> dict:
    """Name, UUID and PCI address of torch's device i (NVML is matched by UUID, then PCI)."""
    p = torch.cuda.get_device_properties(i)
    uuid = getattr(p, "uuid", None)
    pci = None
    if hasattr(p, "pci_bus_id"):
        pci = f"{getattr(p, 'pci_domain_id', 0):08X}:{p.pci_bus_id:02X}:" \
              f"{getattr(p, 'pci_device_id', 0):02X}.0"
    return {
        "index": i, "name": p.name, "uuid": f"GPU-{uuid}" if uuid else None,
        "pci_bus_id": pci, "memory_gib": round(p.total_memory / GiB, 1),
        "compute_capability": f"{p.major}.{p.minor}", "sms": p.multi_processor_count,
    }


# ---------------------------------------------------------------------------------------------
# Children: one GPU


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


def _elapsed(torch: Any, fn: Any, iters: int, warmup: int = 1) -> float:
    """Seconds per call of fn on the current stream, by CUDA events."""
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000.0 / iters


class GpuChild:
    def __init__(self, em: Emitter, dev: int, opts: dict) -> None:
        import torch

        self.torch = torch
        self.em = em
        self.dev = dev
        self.opts = opts
        self.quick = bool(opts.get("quick"))
        self.tgt = f"gpu{dev}"
        self.lock = opts.get("lock")
        torch.cuda.set_device(dev)
        self.device = torch.device("cuda", dev)
        info = device_identity(torch, dev)
        # Each GPU is judged by its own model's profile (a mixed host stays right).
        self.profile = select_profile(opts["profiles"], info["name"], opts.get("forced"))
        em.facts(profile=self.profile["name"])
        self.uuid, self.pci = info.get("uuid"), info.get("pci_bus_id")
        self.dev_lock = device_lock(opts, dev)
        self.nv = Nvml()
        self.samples: list[dict] = []
        self.figures: dict[str, float] = {}

    def rec(self, check: str, verdict: str, **kw: Any) -> None:
        self.em.record(record("gpu", self.tgt, check, verdict, **kw))

    def fig(self, check: str, measured: float | None, metric: str, **kw: Any) -> None:
        self.em.record(figure("gpu", self.tgt, check, measured, metric, self.profile, **kw))

    def sample(self) -> None:
        if self.nv.kind != "none":
            s = self.nv.sample(self.uuid, self.pci, self.dev)
            if s:
                self.samples.append(s)

    def run(self) -> None:
        g = self.guard
        g("gpu.smoke_kernel", self.smoke)
        g("gpu.gemm_fp32_exact", self.gemm_fp32_exact)
        g("gpu.gemm_bf16_checked", self.gemm_bf16_checked)
        g("gpu.gemm_bf16_rate", self.gemm_rate)  # NVML is sampled during this burst
        g("gpu.health", self.health)
        if not self.quick:
            g("gpu.hbm_copy", self.hbm_copy)
            g("gpu.pinned_copy", self.pinned_copy)
        g("managed.setup", self.managed)
        self.em.done()

    def guard(self, check: str, fn: Any) -> Any:
        return guarded(self.em, "gpu", self.tgt, check, fn)

    # -- basic compute
    def smoke(self) -> None:
        torch = self.torch
        t0 = time.perf_counter()
        n = 1 << 24
        x = torch.arange(n, device=self.device, dtype=torch.int64)
        y = (x * 3 + 1) % 1000003
        total = int(y.sum().item())
        # the modulus makes a closed form awkward: the CPU computes the reference
        expected = int(((torch.arange(n, dtype=torch.int64) * 3 + 1) % 1000003).sum())
        ok = total == expected
        ms = (time.perf_counter() - t0) * 1000
        self.rec("gpu.smoke_kernel", "pass" if ok else "fail", measured=ok,
                 detail=f"elementwise + reduction over {n} int64, {ms:.0f} ms"
                 + ("" if ok else f"; got {total}, expected {expected}"), hint="reset")

    def _int_mats(self, m: int, k: int, n: int) -> tuple[Any, Any, Any]:
        torch = self.torch
        gen = torch.Generator().manual_seed(1234 + self.dev)
        a = torch.randint(-3, 4, (m, k), generator=gen).float()
        b = torch.randint(-3, 4, (k, n), generator=gen).float()
        # Small integers: every product and partial sum is exact in fp32 (< 2**24).
        return a, b, a @ b

    def gemm_fp32_exact(self) -> None:
        torch = self.torch
        size = 1024 if self.quick else 2048
        a, b, ref = self._int_mats(size, size, size)
        torch.backends.cuda.matmul.allow_tf32 = False
        got = (a.to(self.device) @ b.to(self.device)).cpu()
        bad = int((got != ref).sum())
        self.rec("gpu.gemm_fp32_exact", "pass" if bad == 0 else "fail", measured=bad,
                 unit="wrong elements", limit=0,
                 detail=f"{size}^3 fp32 on integer data vs CPU reference, must be exact",
                 hint="isolate")

    def gemm_bf16_checked(self) -> None:
        torch = self.torch
        size = 1024 if self.quick else 2048
        a, b, ref = self._int_mats(size, size, size)
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        got = (a.to(self.device, torch.bfloat16) @ b.to(self.device, torch.bfloat16)).float().cpu()
        want = ref.to(torch.bfloat16).float()  # one rounding of the exact sum
        rel = ((got - want).abs() / want.abs().clamp(min=1.0)).max().item()
        exact = int((got != want).sum())
        ok = rel <= 2.0 ** -7  # at most one bf16 rounding step apart
        self.rec("gpu.gemm_bf16_checked", "pass" if ok else "fail", measured=round(rel, 6),
                 unit="max rel error", limit=2.0 ** -7,
                 detail=f"{size}^3 bf16 on integer data vs CPU reference; "
                 f"{exact} elements not bit-identical", hint="isolate")

    def gemm_rate(self) -> None:
        torch = self.torch
        size = 4096 if self.quick else 8192
        iters = 30 if self.quick else 50
        gen = torch.Generator(device=self.device).manual_seed(7)
        a = torch.randn(size, size, device=self.device, dtype=torch.bfloat16, generator=gen)
        b = torch.randn(size, size, device=self.device, dtype=torch.bfloat16, generator=gen)
        first = a @ b
        out = torch.empty_like(first)
        for _ in range(3):
            torch.mm(a, b, out=out)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with HostLinkLock(self.dev_lock):
            start.record()
            for _ in range(iters):
                torch.mm(a, b, out=out)
            end.record()
            # NVML while the burst runs: link state, throttle reasons, clocks, temperature.
            for _ in range(3):
                time.sleep(0.02)
                self.sample()
            end.synchronize()
        secs = start.elapsed_time(end) / 1000.0
        tflops = 2 * size**3 * iters / secs / 1e12
        self.figures["bf16_tflops"] = tflops
        self.fig("gpu.gemm_bf16_rate", tflops, "bf16_tflops", judged=not self.quick,
                 detail=f"{size}^3 bf16 x{iters}", hint="power")
        same = bool(torch.equal(first, out))
        self.rec("gpu.gemm_repeatable", "pass" if same else "fail", measured=same,
                 detail="first and last of identical bf16 GEMMs are bit-identical"
                 if same else "identical GEMMs gave different bits: unstable GPU", hint="isolate")

    # -- NVML health
    def health(self) -> None:
        if self.nv.kind == "none":
            self.rec("gpu.health", "skip", detail=f"no NVML (nvidia-ml-py) and no nvidia-smi: "
                     f"{self.nv.error}")
            return
        info = self.nv.info(self.uuid, self.pci, self.dev)
        self.em.facts(**{f"nvml_gpu{self.dev}": info})
        lim = self.profile.get("limits", {})
        # ECC
        unc = info.get("ecc_uncorrected_volatile")
        if info.get("ecc_enabled") is False:
            self.rec("ecc.mode", "warn", measured="disabled", detail="ECC is off on this GPU",
                     hint="config")
        if unc is None:
            self.rec("ecc.uncorrected_volatile", "skip", detail="not reported")
        else:
            cap = lim.get("ecc_uncorrected_max", 0)
            self.rec("ecc.uncorrected_volatile", "pass" if unc <= cap else "fail", measured=unc,
                     unit="errors", limit=cap, hint="reset",
                     detail="volatile uncorrectable ECC errors since the last driver load")
        if info.get("remap_failure") is not None:
            bad = bool(info["remap_failure"])
            self.rec("ecc.row_remap_failure", "fail" if bad else "pass", measured=bad,
                     hint="isolate", detail="row remapping failed: the GPU needs replacing"
                     if bad else "no row remap failure")
        if info.get("remap_pending") is not None:
            pend = bool(info["remap_pending"])
            self.rec("ecc.row_remap_pending", "warn" if pend else "pass", measured=pend,
                     hint="reset", detail="a row remap waits for a GPU reset" if pend else
                     f"{info.get('remap_uncorrectable_rows') or 0} rows remapped for "
                     "uncorrectable errors, none pending")
        elif info.get("retired_pending") is not None:
            pend = bool(info["retired_pending"])
            self.rec("ecc.retired_pages_pending", "warn" if pend else "pass", measured=pend,
                     hint="reset", detail="page retirement waits for a reset" if pend else "")
        # PCIe link, read while busy (the link trains down when idle)
        gens = [s.get("pcie_gen") for s in self.samples if s.get("pcie_gen")]
        widths = [s.get("pcie_width") for s in self.samples if s.get("pcie_width")]
        gen, width = (max(gens) if gens else None), (max(widths) if widths else None)
        gmax, wmax = info.get("pcie_gen_max"), info.get("pcie_width_max")
        if gen is None or gmax is None:
            self.rec("pcie.link_gen", "skip", detail="link generation not reported")
        else:
            self.rec("pcie.link_gen", "pass" if gen >= gmax else "warn", measured=gen,
                     unit="gen", limit=gmax, hint="reseat",
                     detail=f"read while busy over {len(gens)} samples; max Gen{gmax}")
        if width is None or wmax is None:
            self.rec("pcie.link_width", "skip", detail="link width not reported")
        else:
            self.rec("pcie.link_width", "pass" if width >= wmax else "fail", measured=width,
                     unit="lanes", limit=wmax, hint="reseat",
                     detail=f"read while busy; max x{wmax}")
        # Throttle (clock event) reasons seen while busy
        masks = [s.get("throttle_mask") for s in self.samples if s.get("throttle_mask") is not None]
        if masks:
            mask = 0
            for m in masks:
                mask |= int(m)
            hard = mask & (0x8 | 0x40 | 0x80)  # HW slowdown, HW thermal, HW power brake
            soft = mask & 0x20  # SW thermal slowdown
            names = [n for bit, n in ((0x4, "sw-power-cap"), (0x8, "hw-slowdown"),
                                      (0x20, "sw-thermal"), (0x40, "hw-thermal"),
                                      (0x80, "hw-power-brake")) if mask & bit]
            verdict = "fail" if hard else ("warn" if soft else "pass")
            self.rec("gpu.throttle", verdict, measured=hex(mask),
                     hint="cooling" if mask & 0x60 else "power",
                     detail=f"clock event reasons under load: {', '.join(names) or 'none'}")
        else:
            self.rec("gpu.throttle", "skip", detail="clock event reasons not reported")
        temps = [s.get("temperature_c") for s in self.samples if s.get("temperature_c")]
        temp = max(temps) if temps else info.get("temperature_c")
        if temp is None:
            self.rec("gpu.temperature", "skip", detail="not reported")
        else:
            slow = info.get("temp_slowdown_c")
            warn_at = float(lim.get("temperature_warn_c", 85))
            fail_at = float(lim.get("temperature_fail_c", 92))
            if slow:
                warn_at = min(warn_at, float(slow) - 3)
                fail_at = min(fail_at, float(slow))
            verdict = "fail" if temp >= fail_at else ("warn" if temp >= warn_at else "pass")
            self.rec("gpu.temperature", verdict, measured=temp, unit="C", limit=warn_at,
                     hint="cooling", detail=f"under load; fails at {fail_at:g} C"
                     + (f" (slowdown {slow} C)" if slow else ""))

    # -- bandwidth
    def hbm_copy(self) -> None:
        torch = self.torch
        free, _total = torch.cuda.mem_get_info(self.dev)
        n = int(min(2 * GiB, free * 0.04)) // MiB * MiB
        src = torch.empty(n, dtype=torch.uint8, device=self.device)
        dst = torch.empty_like(src)
        dst.copy_(src)
        with HostLinkLock(self.dev_lock):
            # best of three short rounds: a health figure, robust to a moment of interference
            secs = min(_elapsed(torch, lambda: dst.copy_(src), iters=7, warmup=1)
                       for _ in range(3))
        gbps = 2 * n / secs / 1e9  # bytes read + written
        self.figures["hbm_copy_gbps"] = gbps
        self.fig("gpu.hbm_copy", gbps, "hbm_copy_gbps", hint="reset",
                 detail=f"{n // MiB} MiB device-to-device copy, read + write counted")

    def pinned_copy(self) -> None:
        torch = self.torch
        free, _ = torch.cuda.mem_get_info(self.dev)
        n = int(min(GiB, free * 0.02)) // MiB * MiB
        host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        host.fill_(1)
        devbuf = torch.empty(n, dtype=torch.uint8, device=self.device)
        with HostLinkLock(self.lock):
            def h2d() -> None:
                devbuf.copy_(host, non_blocking=True)

            for _ in range(2):
                h2d()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(8):
                h2d()
            end.record()
            time.sleep(0.03)
            self.sample()  # PCIe link state while data crosses it
            end.synchronize()
            up = n * 8 / (start.elapsed_time(end) / 1000) / 1e9
            down_s = _elapsed(torch, lambda: host.copy_(devbuf, non_blocking=True), iters=8,
                              warmup=2)
            down = n / down_s / 1e9
        self.figures["h2d_gbps"], self.figures["d2h_gbps"] = up, down
        self.fig("pcie.h2d_pinned", up, "h2d_gbps", hint="reseat",
                 detail=f"{n // MiB} MiB pinned host-to-device")
        self.fig("pcie.d2h_pinned", down, "d2h_gbps", hint="reseat",
                 detail=f"{n // MiB} MiB pinned device-to-host")

    # -- managed memory
    def managed(self) -> None:
        ManagedTests(self).run()


class ManagedTests:
    """cudaMallocManaged through ctypes, viewed by torch on both sides."""

    def __init__(self, gc: GpuChild) -> None:
        self.gc = gc
        self.torch = gc.torch
        self.dev = gc.dev
        self.quick = gc.quick

    def run(self) -> None:
        gc, torch = self.gc, self.torch
        rt = CudaRt.load()
        rt.set_device(self.dev)
        self.rt = rt
        a83, a88, a89 = (rt.attr(83, self.dev), rt.attr(88, self.dev), rt.attr(89, self.dev))
        gc.em.facts(**{f"managed_gpu{self.dev}": {
            "cudart": rt.path, "runtime_version": rt.version, "call_form": rt.form(),
            "attr_managed_83": a83, "attr_pageable_88": a88, "attr_concurrent_89": a89}})
        gc.rec("managed.attr_managed_memory", "pass" if a83 == 1 else "fail", measured=a83,
               limit=1, hint="driver", detail="cudaDevAttrManagedMemory (83)")
        gc.rec("managed.attr_concurrent_access", "pass" if a89 == 1 else "warn", measured=a89,
               limit=1, hint="driver",
               detail="cudaDevAttrConcurrentManagedAccess (89)" + (
                   "" if a89 == 1 else ": no on-demand migration; prefetch/concurrency skipped"))
        gc.rec("managed.attr_pageable_access", "pass", measured=a88,
               detail="cudaDevAttrPageableMemoryAccess (88), reported only: "
               + ("HMM on" if a88 else "HMM off on this host"))
        if a83 != 1:
            return
        free, _ = torch.cuda.mem_get_info(self.dev)
        want = int(gc.opts.get("managed_mib") or (64 if self.quick else 1024)) * MiB
        # Never more than 3% of what is free: managed oversubscription can hang a shared GPU.
        n = int(min(want, free * 0.03)) // (2 * MiB) * (2 * MiB)
        if n < 4 * MiB:
            gc.rec("managed.roundtrip_exact", "fail", measured=free, unit="bytes free",
                   detail="too little free GPU memory for a safe managed buffer", hint="reset")
            return
        self.n, self.k = n, n // 4
        ptr = rt.malloc_managed(n)
        self.ptr = ptr
        try:
            self.g = torch.as_tensor(DevArray(ptr, self.k), device=gc.device)
            # A float view for timed reads: the int32 sum (used to check values) widens to
            # int64 and runs far below memory speed; a float sum reads at full speed.
            self.gf = torch.as_tensor(DevArray(ptr, self.k, "<f4"), device=gc.device)
            self.c = torch.frombuffer((ctypes.c_byte * n).from_address(ptr), dtype=torch.int32)
            gc.guard("managed.roundtrip_exact", self.roundtrip)
            if a89 == 1:
                gc.guard("managed.prefetch", self.prefetch)
                if not self.quick:
                    gc.guard("managed.preferred_host_accessed_by", self.preferred)
                    gc.guard("managed.read_mostly", self.read_mostly)
                gc.guard("managed.concurrent_access", self.concurrent)
            else:
                for check in ("managed.prefetch", "managed.concurrent_access"):
                    gc.rec(check, "skip", detail="attribute 89 (concurrent managed access) is 0")
        finally:
            self.g = self.gf = self.c = None
            torch.cuda.synchronize()
            rt.free(ptr)

    # helpers
    def _chunks(self, size: int = 16 * MiB) -> Any:
        for a in range(0, self.k, size):
            yield a, min(self.k, a + size)

    def _cpu_fill(self, offset: int = 0) -> None:
        torch = self.torch
        for a, b in self._chunks():
            self.c[a:b] = torch.arange(a + offset, b + offset, dtype=torch.int32)

    def _cpu_mismatches(self, offset: int) -> int:
        torch = self.torch
        bad = 0
        for a, b in self._chunks():
            bad += int((self.c[a:b] != torch.arange(a + offset, b + offset,
                                                    dtype=torch.int32)).sum())
        return bad

    def _expected_sum(self, offset: int) -> int:
        k = self.k
        return k * (k - 1) // 2 + offset * k

    def _gpu_read(self) -> tuple[float, int]:
        """(GB/s of one timed GPU pass reading the whole buffer, exact int sum of a second)."""
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        self.gf.sum()
        end.record()
        end.synchronize()
        return self.n / (start.elapsed_time(end) / 1000) / 1e9, int(self.g.sum().item())

    def _timed(self, fn: Any) -> float:
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000

    def roundtrip(self) -> None:
        gc, torch = self.gc, self.torch
        self._cpu_fill(0)  # CPU writes: the pages are now host-resident
        with HostLinkLock(gc.lock):
            secs = self._timed(lambda: self.g.add_(1))  # GPU first touch: fault migration
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        bad = self._cpu_mismatches(1)  # CPU reads back what the GPU wrote
        cpu_secs = time.perf_counter() - t0
        gc.rec("managed.roundtrip_exact", "pass" if bad == 0 else "fail", measured=bad,
               unit="wrong values", limit=0, hint="isolate",
               detail=f"cudaMallocManaged {self.n // MiB} MiB: CPU write, GPU +1, CPU read "
               f"back ({self.n / cpu_secs / 1e9:.1f} GB/s CPU-side)")
        fault = self.n / secs / 1e9
        gc.fig("managed.fault_migration", fault, "managed_fault_gbps", judged=not self.quick,
               hint="driver", detail="GPU first touch of host-resident pages")

    def prefetch(self) -> None:
        gc, rt, torch = self.gc, self.rt, self.torch
        n, ptr, dev = self.n, self.ptr, self.dev
        rt.prefetch(ptr, n, CPU_DEVICE_ID)
        torch.cuda.synchronize()
        with HostLinkLock(gc.lock):
            up = n / self._timed(lambda: rt.prefetch(ptr, n, dev)) / 1e9
        loc_dev = rt.range_attr(ptr, n, "last_prefetch")
        resident_bw, total = self._gpu_read()
        resident_bw = max(resident_bw, self._gpu_read()[0])
        with HostLinkLock(gc.lock):
            down = n / self._timed(lambda: rt.prefetch(ptr, n, CPU_DEVICE_ID)) / 1e9
        loc_host = rt.range_attr(ptr, n, "last_prefetch")
        bad = self._cpu_mismatches(1)
        self.resident_bw = resident_bw
        pinned = gc.figures.get("h2d_gbps")
        right_sum = total == self._expected_sum(1)
        moved = resident_bw > 4 * (pinned or 60)  # reads at HBM speed: the pages moved
        loc_ok = loc_dev in (None, dev) and loc_host in (None, CPU_DEVICE_ID)
        ok = right_sum and bad == 0 and loc_ok and (moved or self.quick)
        gc.rec("managed.prefetch", "pass" if ok else "fail", measured=ok, hint="driver",
               detail=f"call form {rt.form()}; last prefetch location {loc_dev} then {loc_host}; "
               f"GPU read after prefetch {resident_bw:.0f} GB/s; values "
               + ("exact" if right_sum and bad == 0 else f"WRONG ({bad} on CPU)"))
        if self.quick:
            return
        gc.rec("managed.prefetch_to_gpu_gbps", "pass", measured=up, unit="GB/s",
               detail="cudaMemPrefetchAsync to the GPU (judged as a ratio to pinned below)")
        if pinned:
            gc.fig("managed.prefetch_vs_pinned", up / pinned, "managed_prefetch_ratio",
                   hint="driver", detail=f"{up:.1f} GB/s prefetch / {pinned:.1f} GB/s pinned H2D")
        gc.fig("managed.prefetch_to_host", down, "managed_prefetch_d2h_gbps", hint="driver",
               detail="cudaMemPrefetchAsync back to the host")

    def preferred(self) -> None:
        gc, rt, torch = self.gc, self.rt, self.torch
        n, ptr, dev = self.n, self.ptr, self.dev
        rt.advise(ptr, n, "preferred", CPU_DEVICE_ID)
        rt.advise(ptr, n, "accessed_by", dev)
        rt.prefetch(ptr, n, CPU_DEVICE_ID)
        torch.cuda.synchronize()
        pref = rt.range_attr(ptr, n, "preferred")
        with HostLinkLock(gc.lock):
            self._gpu_read()
            bw, total = self._gpu_read()  # second read: still remote if nothing migrated
        rt.advise(ptr, n, "unset_accessed_by", dev)
        rt.advise(ptr, n, "unset_preferred", CPU_DEVICE_ID)
        stayed = bw < 0.5 * getattr(self, "resident_bw", bw * 10)
        right = total == self._expected_sum(1)
        ok = stayed and right and pref in (None, CPU_DEVICE_ID)
        pinned = gc.figures.get("h2d_gbps")
        detail = (f"preferred location host (attribute reads {pref}) + accessed-by GPU; second "
                  f"GPU read {bw:.1f} GB/s vs {getattr(self, 'resident_bw', 0):.0f} GB/s "
                  "GPU-resident: " + ("pages stayed on the host" if stayed else
                                      "pages MIGRATED despite the advice"))
        if not ok:
            gc.rec("managed.preferred_host_accessed_by", "fail", measured=round(bw, 2),
                   unit="GB/s", hint="driver",
                   detail=detail + ("" if right else "; values WRONG"))
        elif pinned:
            gc.fig("managed.preferred_host_accessed_by", bw / pinned, "managed_remote_read_ratio",
                   hint="driver", detail=detail + f"; {bw:.1f} / {pinned:.1f} GB/s pinned")
        else:
            gc.rec("managed.preferred_host_accessed_by", "pass", measured=round(bw, 2),
                   unit="GB/s", detail=detail)

    def read_mostly(self) -> None:
        gc, rt, torch = self.gc, self.rt, self.torch
        n, ptr, dev = self.n, self.ptr, self.dev
        rt.prefetch(ptr, n, CPU_DEVICE_ID)
        rt.advise(ptr, n, "read_mostly", dev)
        torch.cuda.synchronize()
        flag = rt.range_attr(ptr, n, "read_mostly")
        self._gpu_read()  # faults create read-only copies on the GPU
        dup_bw, total = max(self._gpu_read(), self._gpu_read())
        # The CPU reads too: with read-mostly nothing is invalidated, the GPU copy stays.
        cpu_sum = int(self.c[: 1 << 20].sum(dtype=torch.int64))
        again_bw, _ = self._gpu_read()
        # A CPU write must invalidate the copies: the GPU then sees the new values.
        self.c[: 1 << 20] += 1
        _bw, after = self._gpu_read()
        rt.advise(ptr, n, "unset_read_mostly", dev)
        self.c[: 1 << 20] -= 1
        torch.cuda.synchronize()
        fast = dup_bw > 4 * (gc.figures.get("h2d_gbps") or 60)
        kept = again_bw > 0.5 * dup_bw
        coherent = after == total + (1 << 20)
        right = total == self._expected_sum(1) and cpu_sum == (1 << 20) * ((1 << 20) + 1) // 2
        ok = fast and coherent and right and flag in (None, 1)
        verdict = "pass" if ok else ("warn" if right and coherent else "fail")
        gc.rec("managed.read_mostly", verdict, measured=round(dup_bw, 1), unit="GB/s",
               hint="driver",
               detail=f"attribute reads {flag}; second GPU read {dup_bw:.0f} GB/s (GPU copy "
               f"{'made' if fast else 'NOT made'}); after a CPU read {again_bw:.0f} GB/s (copy "
               f"{'kept' if kept else 'dropped'}); CPU write then "
               f"{'seen' if coherent else 'NOT seen'} by the GPU"
               + ("" if right else "; values WRONG"))

    def concurrent(self) -> None:
        gc, rt, torch = self.gc, self.rt, self.torch
        half = (self.k // 2) // (512 * 1024) * (512 * 1024)  # 2 MiB aligned split
        if half == 0:
            half = self.k // 2
        a = self.g[:half]
        rt.prefetch(self.ptr, half * 4, self.dev)
        torch.cuda.synchronize()
        before = int(a.sum().item())
        # Enough GPU work on managed pages to outlast several CPU passes over the other half.
        reps = 200 if self.quick else 400
        done = torch.cuda.Event()
        for _ in range(reps):
            a.add_(1)
        done.record()
        cpu_part = self.c[half:]
        cpu_part = cpu_part[: min(cpu_part.numel(), 16 * MiB)]  # 64 MiB per CPU pass at most
        passes = busy_passes = 0
        cpu_ok = True
        while passes < 100:
            gpu_busy = not done.query()
            cpu_part.fill_(passes + 7)
            cpu_ok = cpu_ok and bool((cpu_part == passes + 7).all())
            passes += 1
            busy_passes += int(gpu_busy and not done.query())
            if not gpu_busy:
                break
        torch.cuda.synchronize()
        after = int(a.sum().item())
        gpu_ok = after == before + reps * half
        ok = cpu_ok and gpu_ok
        gc.rec("managed.concurrent_access", "pass" if ok else "fail", measured=ok, hint="driver",
               detail=f"CPU wrote and read one half {passes} times, {busy_passes} of them "
               f"while GPU kernels updated the other half; GPU values "
               f"{'exact' if gpu_ok else 'WRONG'}, CPU values {'exact' if cpu_ok else 'WRONG'}")


def child_gpu(em: Emitter, opts: dict, dev: int) -> None:
    em.start("gpu.init", f"gpu{dev}")
    import torch

    em.event("mark", what="torch imported")
    if dev >= torch.cuda.device_count():  # started on a guess that was too high
        em.event("absent", device=dev)
        em.done()
        return
    GpuChild(em, dev, opts).run()


# ---------------------------------------------------------------------------------------------
# Children: the cudaMallocAsync backend (started with PYTORCH_CUDA_ALLOC_CONF set)


def alloc_checks(em: Emitter, torch: Any, opts: dict) -> None:
    em.start("alloc.cuda_malloc_async", "host")
    backend = torch.cuda.get_allocator_backend()
    for dev in range(torch.cuda.device_count()):
        tgt = f"gpu{dev}"
        em.start("alloc.cuda_malloc_async", tgt)
        try:
            with HostLinkLock(device_lock(opts, dev)):  # not during that GPU's timed checks
                em.record(alloc_check(torch, dev, backend))
        except Exception as exc:
            em.record(record("gpu", tgt, "alloc.cuda_malloc_async", "fail", hint="investigate",
                             detail=f"{type(exc).__name__}: {exc}"[:400], reason="error"))


def alloc_check(torch: Any, dev: int, backend: str) -> dict:
    device = torch.device("cuda", dev)
    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator().manual_seed(99 + dev)
    a = torch.randint(-3, 4, (512, 512), generator=gen).float()
    b = torch.randint(-3, 4, (512, 512), generator=gen).float()
    bufs = [torch.empty(64 * MiB, dtype=torch.uint8, device=device) for _ in range(4)]
    del bufs  # returns to the stream-ordered pool
    got = (a.to(device) @ b.to(device)).cpu()
    exact = bool(torch.equal(got, a @ b))
    ok = backend == "cudaMallocAsync" and exact
    return record(
        "gpu", f"gpu{dev}", "alloc.cuda_malloc_async", "pass" if ok else "fail",
        measured=backend, hint="driver" if exact else "isolate",
        detail=f"PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync: backend reports {backend}; "
        f"matmul copied to the CPU {'matches' if exact else 'DIFFERS from'} the reference")


# ---------------------------------------------------------------------------------------------
# Children: one NCCL rank


def child_nccl(em: Emitter, opts: dict, rank: int) -> None:
    em.start("nccl.init", "host")
    import datetime

    import torch
    import torch.distributed as dist

    world = int(opts["world"])
    quick = bool(opts.get("quick"))
    backend = opts.get("nccl_backend", "nccl")  # "gloo" only in the CPU self-test
    cpu = backend == "gloo"
    device = torch.device("cpu") if cpu else torch.device("cuda", rank)
    if not quick:
        # What DDP imports on first use (torch's compiler stack, seconds): done now, while the
        # per-GPU checks run; nothing here touches a GPU.
        for mod in ("torch._dynamo", "torch.nn.parallel.distributed"):
            with contextlib.suppress(Exception):
                importlib.import_module(mod)
    gate = opts.get("gate")
    if gate:
        em.start("nccl.wait_for_gpu_checks", "host")
        while not os.path.exists(gate):  # the parent opens it when the GPUs are free
            time.sleep(0.02)
        em.start("nccl.init", "host")
    if not cpu:
        torch.cuda.set_device(rank)
    name0 = torch.cuda.get_device_name(0) if not cpu else "cpu"
    profile = select_profile(opts["profiles"], name0, opts.get("forced"))
    kw: dict[str, Any] = {
        "backend": backend, "init_method": f"tcp://127.0.0.1:{opts['port']}", "rank": rank,
        "world_size": world, "timeout": datetime.timedelta(seconds=float(opts["timeout"])),
    }
    t0 = time.perf_counter()
    if not cpu:
        kw["device_id"] = device  # eager NCCL communicator: init cost shows here, not later
    try:
        dist.init_process_group(**kw)
    except TypeError:
        kw.pop("device_id", None)
        dist.init_process_group(**kw)

    def sync() -> None:
        if not cpu:
            torch.cuda.synchronize()

    dist.barrier()
    init_s = time.perf_counter() - t0
    lead = rank == 0
    one = " (collective test had one rank)" if world == 1 else ""
    # Quick mode leaves the DDP step out (its set-up alone costs seconds).
    ddp_state = None if quick else ddp_prepare(torch, device, rank, cpu)

    def emit(check: str, verdict: str, **k: Any) -> None:
        if lead:
            em.record(record("host", "host", check, verdict, **k))

    def agree(bad: int) -> int:
        """Sum of a per-rank mismatch count over all ranks (every rank learns it)."""
        t = torch.tensor([bad], dtype=torch.int64, device=device)
        dist.all_reduce(t)
        return int(t.item())

    nccl_v = ""
    if not cpu:
        with contextlib.suppress(Exception):
            nccl_v = ".".join(str(x) for x in torch.cuda.nccl.version())
    emit("nccl.init", "pass", measured=round(init_s, 2), unit="s",
         detail=f"{backend} {nccl_v} process group of {world} rank(s) over loopback{one}")

    weights = [(r % 3) + 1 for r in range(world)]
    wsum = sum(weights)
    n = (4 if quick else 16) * MiB  # elements
    idx = torch.arange(n, device=device)

    def check_allreduce(dtype: Any, modulus: int, name: str) -> None:
        em.start(name, "host")
        x = ((idx % modulus) * weights[rank]).to(dtype)
        dist.all_reduce(x)
        want = ((idx % modulus) * wsum).to(dtype)
        bad = agree(int((x != want).sum()))
        emit(name, "pass" if bad == 0 else "fail", measured=bad, unit="wrong elements", limit=0,
             hint="isolate", detail=f"sum of {n} {str(dtype).replace('torch.', '')} over "
             f"{world} rank(s), exact integers{one}")

    check_allreduce(torch.float32, 1024, "nccl.all_reduce_f32")
    # Integers up to 256 are exact in bf16; every partial sum stays below that.
    check_allreduce(torch.bfloat16, max(2, 256 // wsum + 1) if wsum <= 256 else 2,
                    "nccl.all_reduce_bf16")

    em.start("nccl.all_gather", "host")
    chunk = n // 4
    mine = (idx[:chunk] % 251 + rank * 1000).float()
    out = torch.empty(chunk * world, device=device)
    dist.all_gather_into_tensor(out, mine)
    want = torch.cat([(idx[:chunk] % 251 + r * 1000).float() for r in range(world)])
    bad = agree(int((out != want).sum()))
    emit("nccl.all_gather", "pass" if bad == 0 else "fail", measured=bad, unit="wrong elements",
         limit=0, hint="isolate", detail=f"{chunk} float32 per rank{one}")

    em.start("nccl.reduce_scatter", "host")
    inp = torch.cat([torch.full((chunk,), float((rank + 1) * (j + 1)), device=device)
                     for j in range(world)])
    res = torch.empty(chunk, device=device)
    dist.reduce_scatter_tensor(res, inp)
    bad = agree(int((res != float((rank + 1) * world * (world + 1) // 2)).sum()))
    emit("nccl.reduce_scatter", "pass" if bad == 0 else "fail", measured=bad,
         unit="wrong elements", limit=0, hint="isolate", detail=f"{chunk} float32 per rank{one}")

    em.start("nccl.broadcast", "host")
    roots = list(range(world)) if world <= 8 else [0, world - 1]
    bad = 0
    for root in roots:
        t = (idx[:chunk] % 241 + root).float() if rank == root else torch.zeros(chunk,
                                                                                 device=device)
        dist.broadcast(t, src=root)
        bad += int((t != (idx[:chunk] % 241 + root).float()).sum())
    bad = agree(bad)
    emit("nccl.broadcast", "pass" if bad == 0 else "fail", measured=bad, unit="wrong elements",
         limit=0, hint="isolate", detail=f"from root(s) {roots}{one}")

    # send/recv between every ordered pair; the receiver reports (the parent pairs them up)
    pair_bytes = (16 if quick else 256) * MiB
    iters = 3 if quick else 5
    k = pair_bytes // 4
    buf = torch.empty(k, dtype=torch.int32, device=device)
    base = torch.arange(k, dtype=torch.int32, device=device)
    for src in range(world):
        for dst in range(world):
            if src == dst:
                continue
            tgt = f"gpu{min(src, dst)}-gpu{max(src, dst)}"
            em.start("nccl.send_recv", tgt)
            pattern = base ^ (src * 1000 + dst)
            if rank == src:
                dist.send(pattern, dst)  # warm-up: connects the pair
            elif rank == dst:
                dist.recv(buf, src)
            sync()
            dist.barrier()
            t1 = time.perf_counter()
            for _ in range(iters):
                if rank == src:
                    dist.send(pattern, dst)
                elif rank == dst:
                    dist.recv(buf, src)
            sync()
            secs = time.perf_counter() - t1
            if rank == dst:
                wrong = int((buf != pattern).sum())
                em.event("pair", src=src, dst=dst, gbps=pair_bytes * iters / secs / 1e9,
                         wrong=wrong, bytes=pair_bytes, quick=quick)
    del buf, base

    # bus bandwidth, one large size (nccl-tests' definition: algbw * 2(n-1)/n)
    sizes = [1] if quick else [1, 4]
    for gib in sizes:
        check = f"nccl.busbw_{gib}g"
        em.start(check, "host")
        if world == 1:
            emit(check, "skip", detail="collective test had one rank: no bus bandwidth")
            continue
        free = torch.cuda.mem_get_info(rank)[0] if not cpu else 64 * GiB
        nbytes = gib * GiB
        ok_mem = agree(0 if free > 4 * nbytes else 1) == 0
        if not ok_mem:
            emit(check, "skip", detail=f"not enough free GPU memory for {gib} GiB")
            continue
        if cpu:
            nbytes = 16 * MiB  # the CPU self-test only exercises the code path
        x = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)
        reps = 3 if quick else (10 if gib == 1 else 5)
        for _ in range(2):
            dist.all_reduce(x)
        sync()
        dist.barrier()
        t1 = time.perf_counter()
        for _ in range(reps):
            dist.all_reduce(x)
        sync()
        secs = (time.perf_counter() - t1) / reps
        # the slowest rank's time is the collective's time
        tt = torch.tensor([secs], dtype=torch.float64, device=device)
        dist.all_reduce(tt, op=dist.ReduceOp.MAX)
        secs = float(tt.item())
        busbw = nbytes / secs / 1e9 * 2 * (world - 1) / world
        if lead:
            em.record(figure("host", "host", check, busbw, f"nccl_busbw_{gib}g_gbps", profile,
                             judged=not quick and not cpu, hint="reseat",
                             detail=f"all_reduce float32 {gib} GiB x{reps}, {world} ranks, "
                             f"algbw {nbytes / secs / 1e9:.1f} GB/s"
                             + ("; quick: measured while other checks ran" if quick else "")))
        del x

    # one DistributedDataParallel step: all ranks must end with identical parameters
    if ddp_state is not None:
        em.start("ddp.step", "host")
        ddp_step(em, torch, dist, device, rank, world, lead, one, ddp_state)
    em.done()
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# Multi-node: one worker per rank, started by torchrun on every host (umprov/verify/multinode.py)


def net_info(target: str | None) -> dict:
    """This network namespace's IPv4 addresses, and the one (with its interface) that routes to
    ``target`` (a UDP connect sends nothing). Used to pick rendezvous and local addresses."""
    import fcntl
    import struct

    addrs: dict[str, str] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _idx, ifname in socket.if_nameindex():
            with contextlib.suppress(OSError):
                raw = fcntl.ioctl(s.fileno(), 0x8915,  # SIOCGIFADDR
                                  struct.pack("256s", ifname[:15].encode()))
                addrs[ifname] = socket.inet_ntoa(raw[20:24])
    route: dict[str, Any] = {"ip": None, "ifname": None}
    probe = target or "192.0.2.1"  # TEST-NET-1: any route out, default route first
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((probe, 9))
        ip = s.getsockname()[0]
        route = {"ip": ip, "ifname": next((n for n, a in addrs.items() if a == ip), None)}
    loopback_only = route["ip"] is not None and route["ip"].startswith("127.")
    if route["ip"] is None or (loopback_only and not (target or "").startswith("127.")):
        outside = [(n, a) for n, a in addrs.items() if not a.startswith("127.")]
        if outside:
            route = {"ip": outside[0][1], "ifname": outside[0][0]}
    return {"addresses": addrs, "route": route, "hostname": socket.gethostname()}


def child_multinode(em: Emitter, opts: dict) -> None:
    """One rank of the multi-node job: torchrun's env (RANK, WORLD_SIZE, LOCAL_RANK, ...) says
    who it is. Events, not records: the controller judges (it knows the inventory)."""
    import datetime

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    node = int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "0")))
    backend = opts.get("backend", "nccl")
    cpu = backend == "gloo"
    em.event("started", rank=rank, world=world, local_rank=local, node=node,
             host=socket.gethostname(), master=os.environ.get("MASTER_ADDR"), at=time.time())
    import torch
    import torch.distributed as dist

    if not cpu:
        torch.cuda.set_device(local)
    device = torch.device("cpu") if cpu else torch.device("cuda", local)
    em.start("multinode.init", "host")
    t0 = time.perf_counter()
    kw: dict[str, Any] = {"backend": backend,
                          "timeout": datetime.timedelta(seconds=float(opts["timeout"]))}
    if not cpu:
        kw["device_id"] = device
    try:
        dist.init_process_group(**kw)
    except TypeError:
        kw.pop("device_id", None)
        dist.init_process_group(**kw)
    dist.barrier()
    em.event("joined", init_s=round(time.perf_counter() - t0, 3), torch=torch.__version__,
             at=time.time(),
             nccl=".".join(str(x) for x in torch.cuda.nccl.version()) if not cpu else None)

    def sync() -> None:
        if not cpu:
            torch.cuda.synchronize()

    def agree(bad: int) -> int:
        t = torch.tensor([bad], dtype=torch.int64, device=device)
        dist.all_reduce(t)
        return int(t.item())

    n = int(opts.get("elements", 4 * MiB))
    idx = torch.arange(n, device=device)
    t1 = time.perf_counter()
    # all_reduce: each rank adds (i % 1024) * w(rank); the exact sum is known (f32-exact ints)
    em.start("multinode.all_reduce", "host")
    weights = [(r % 3) + 1 for r in range(world)]
    x = ((idx % 1024) * weights[rank]).float()
    dist.all_reduce(x)
    bad = agree(int((x != ((idx % 1024) * sum(weights)).float()).sum()))
    em.event("check", check="multinode.all_reduce", wrong=bad, elements=n, world=world)
    # all_gather: rank r contributes (i % 251) + 1000 r; every rank checks all pieces
    em.start("multinode.all_gather", "host")
    chunk = max(1, n // 4)
    mine = (idx[:chunk] % 251 + rank * 1000).float()
    parts = [torch.empty(chunk, device=device) for _ in range(world)]
    dist.all_gather(parts, mine)
    wrong = sum(int((p != (idx[:chunk] % 251 + r * 1000).float()).sum())
                for r, p in enumerate(parts))
    bad = agree(wrong)
    em.event("check", check="multinode.all_gather", wrong=bad, elements=chunk, world=world)
    # bus bandwidth: all_reduce of one large buffer (nccl-tests' busbw = algbw * 2(n-1)/n)
    em.start("multinode.busbw", "host")
    nbytes = int(opts.get("busbw_bytes", GiB))
    buf = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)
    reps = int(opts.get("reps", 5))
    for _ in range(2):
        dist.all_reduce(buf)
    sync()
    dist.barrier()
    t2 = time.perf_counter()
    for _ in range(reps):
        dist.all_reduce(buf)
    sync()
    secs = (time.perf_counter() - t2) / reps
    tt = torch.tensor([secs], dtype=torch.float64, device=device)
    dist.all_reduce(tt, op=dist.ReduceOp.MAX)
    secs = float(tt.item())
    algbw = nbytes / secs / 1e9
    em.event("busbw", bytes=nbytes, reps=reps, seconds=round(secs, 6), algbw=round(algbw, 4),
             busbw=round(algbw * 2 * (world - 1) / world, 4) if world > 1 else None)
    em.event("collectives", seconds=round(time.perf_counter() - t1, 3), at=time.time())
    em.done()
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


def ddp_prepare(torch: Any, device: Any, rank: int, cpu: bool) -> dict:
    nn = torch.nn
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(1000 + rank)  # different on purpose: DDP must broadcast rank 0's
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8)).to(device)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=None if cpu else [device.index])
    return {"model": model, "ddp": ddp}


def ddp_step(em: Emitter, torch: Any, dist: Any, device: Any, rank: int, world: int,
             lead: bool, one: str, state: dict) -> None:
    nn = torch.nn
    model, ddp = state["model"], state["ddp"]
    start = [p.detach().clone() for p in model.parameters()]
    ref = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8)).to(device)
    ref.load_state_dict(model.state_dict())  # rank 0's weights, as DDP broadcast them
    gen = torch.Generator().manual_seed(2000 + rank)
    x = torch.randn(16, 64, generator=gen).to(device)
    y = torch.randn(16, 8, generator=gen).to(device)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    loss = nn.functional.mse_loss(ddp(x), y)
    loss.backward()
    opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = torch.empty(world * flat.numel(), device=device)
    dist.all_gather_into_tensor(every, flat)
    rows = every.view(world, -1)
    identical = bool((rows == rows[0]).all())
    changed = any(not torch.equal(a, b) for a, b in zip(start, model.parameters()))  # noqa: B905
    # Reference on every rank: the same step on all ranks' data, gradients averaged.
    xs = torch.empty(world * 16, 64, device=device)
    ys = torch.empty(world * 16, 8, device=device)
    dist.all_gather_into_tensor(xs, x)
    dist.all_gather_into_tensor(ys, y)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    ref_loss = sum(nn.functional.mse_loss(ref(xs[r * 16:(r + 1) * 16]), ys[r * 16:(r + 1) * 16])
                   for r in range(world)) / world
    ref_loss.backward()
    ref_opt.step()
    ref_flat = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
    err = float((ref_flat - flat).abs().max())
    averaged = err <= 1e-4
    ok = identical and changed and averaged
    if lead:
        em.record(record(
            "host", "host", "ddp.step", "pass" if ok else "fail", measured=identical,
            hint="investigate",
            detail=f"one DDP SGD step on {world} rank(s){one}: parameters "
            f"{'identical' if identical else 'DIFFER'} across ranks, "
            f"{'updated' if changed else 'NOT updated'}, max diff to an averaged-gradient "
            f"reference {err:.2e}"))


# ---------------------------------------------------------------------------------------------
# The parent: pre-checks, children, report


def precheck() -> dict:
    """What can be learnt without torch or a GPU: driver, device nodes, torch presence."""
    facts: dict[str, Any] = {}
    try:
        with open("/proc/driver/nvidia/version") as fh:
            facts["kernel_module"] = " ".join(fh.readline().split())[:200]
    except OSError:
        facts["kernel_module"] = None
    facts["device_nodes"] = sorted(
        p for p in glob.glob("/dev/nvidia*") if re.fullmatch(r"/dev/nvidia\d+", p))
    facts["nvidiactl"] = os.path.exists("/dev/nvidiactl")
    facts["nvidia_uvm"] = os.path.exists("/dev/nvidia-uvm")
    facts["nvidia_smi"] = shutil.which("nvidia-smi")
    lib = None
    for cand in ("libcuda.so.1", ctypes.util.find_library("cuda")):
        if cand:
            try:
                ctypes.CDLL(cand)
                lib = cand
                break
            except OSError:
                continue
    facts["libcuda"] = lib
    facts["torch_importable"] = importlib.util.find_spec("torch") is not None
    facts["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    facts["multicast_env"] = {k: os.environ.get(k, f"{v} (set by the agent)")
                              for k, v in MULTICAST_OFF.items()}
    return facts


def guess_gpu_count(pre: dict) -> int | None:
    """How many GPUs CUDA will probably show, without starting CUDA (None: no idea)."""
    nodes = len(pre.get("device_nodes") or [])
    if not nodes:
        return None
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return nodes
    items = [x.strip() for x in cvd.split(",") if x.strip()]
    if not items or any(x.startswith("MIG-") for x in items):
        return None
    return min(len(items), nodes)


def no_gpu_reasons(pre: dict, disc: dict | None) -> list[str]:
    reasons = []
    if not pre.get("torch_importable"):
        reasons.append(f"no torch: python {sys.executable} cannot import torch")
    if not pre.get("kernel_module") and not pre.get("libcuda"):
        reasons.append("no NVIDIA driver: /proc/driver/nvidia/version missing and libcuda.so.1 "
                       "not loadable")
    elif not pre.get("libcuda"):
        reasons.append("libcuda.so.1 not loadable (container started without the NVIDIA runtime?)")
    if not pre.get("device_nodes"):
        reasons.append("no device: no /dev/nvidia0.. nodes (container without --gpus?)")
    if not pre.get("nvidia_uvm"):
        reasons.append("no /dev/nvidia-uvm (nvidia-uvm module not loaded or not passed in)")
    if disc:
        if disc.get("torch") and not disc.get("torch_cuda_build"):
            reasons.append(f"torch {disc['torch']} is a CPU-only build")
        if disc.get("cuda_error"):
            reasons.append(f"CUDA error: {disc['cuda_error']}")
        if disc.get("cuda_available") and not disc.get("devices"):
            reasons.append("CUDA reports 0 devices")
    if pre.get("cuda_visible_devices") in ("", "-1", "none", "void", "NoDevFiles"):
        reasons.append(f"CUDA_VISIBLE_DEVICES={pre['cuda_visible_devices']!r} hides every GPU")
    return reasons or ["torch sees no CUDA device (no other cause found)"]


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
        return [sys.executable, os.path.abspath(__file__), "--child", kind,
                "--child-opts", self.opts_path, *extra]

    def run(self) -> dict:
        t_start = time.time()
        m0 = time.monotonic()
        self.workdir = tempfile.mkdtemp(prefix="umprov-verify-")
        try:
            self._run()
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return self.report(t_start, time.monotonic() - m0)

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
        ncpu = os.cpu_count() or 8
        guess = guess_gpu_count(pre)
        threads = max(1, ncpu // ((guess or 1) + 1))
        # discover runs with the cudaMallocAsync backend: after the facts it checks that.
        disc_env = child_env({"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}, threads)
        disc_child = Child("discover", self.argv("discover"), disc_env, self.timeout,
                           self.workdir, check="host.discover")
        # Start the per-GPU children on a guess (device nodes, CUDA_VISIBLE_DEVICES) while
        # discover imports torch: that saves one torch start-up on the critical path. A child
        # whose device does not exist says so and exits; a low guess is topped up below.
        gpu_children = {i: self._gpu_child(i, threads) for i in range(guess or 0)}
        # The NCCL ranks start now too: torch import, NCCL set-up and the DDP model overlap
        # the per-GPU checks; in full mode they then wait at a gate so that no collective runs
        # while the per-GPU bandwidth is measured.
        gate = os.path.join(self.workdir, "nccl-gate")
        if self.quick:
            open(gate, "w").close()  # noqa: SIM115 (quick: no waiting, figures not judged)
        ranks: list[Child] = self.start_nccl(guess, threads, gate) if guess else []
        found = disc_child.wait_for("devices")
        devices = (found or {}).get("devices") or []
        world = len(devices)
        if not devices:
            for c in [*gpu_children.values(), *ranks]:
                c.kill()
            wait_all([disc_child])
            disc = self._collect(disc_child)
            disc.update({k: v for k, v in (found or {}).items() if k not in ("ev", "t")})
            self.facts["discover"] = disc
            if found is not None or disc:  # discover ran and found nothing: no GPU, honestly
                self.no_gpu(pre, disc)
            return
        for i in range(world, guess or 0):
            gpu_children.pop(i).kill()  # a guess too high: those children are not results
        for i in range(guess or 0, world):
            gpu_children[i] = self._gpu_child(i, threads)
        if len(ranks) != world:
            for c in ranks:
                c.kill()
            ranks = self.start_nccl(world, threads, gate)
        phase2 = [disc_child, *gpu_children.values()]
        if self.quick:
            wait_all(phase2 + ranks, groups=[ranks])
        else:
            wait_all(phase2)
            open(gate, "w").close()  # noqa: SIM115
            for c in ranks:  # their own deadline counts from now
                c.deadline = max(c.deadline, time.monotonic() + self.timeout)
            wait_all(ranks, groups=[ranks])
        disc = self._collect(disc_child)
        self.facts["discover"] = disc
        if not disc.get("devices"):
            disc.update({k: v for k, v in found.items() if k not in ("ev", "t")})
        self.host_facts(disc, pre)
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

    def host_facts(self, disc: dict, pre: dict) -> None:
        nvml = disc.get("nvml") or {}
        km = re.search(r"\b(\d+\.\d+(?:\.\d+)?)\b", pre.get("kernel_module") or "")
        driver = nvml.get("driver") or (km.group(1) if km else None)
        self.host("host.driver", "pass" if driver else "warn", measured=driver, hint="driver",
                  detail=f"NVIDIA driver (via {nvml.get('source')}); supports CUDA "
                  f"{nvml.get('cuda_driver') or '?'}")
        self.host("host.cuda_runtime", "pass" if disc.get("cuda_runtime") else "warn",
                  measured=disc.get("cuda_runtime"), hint="driver",
                  detail=f"cudaRuntimeGetVersion of the libcudart torch loaded; torch built for "
                  f"CUDA {disc.get('torch_cuda_build')}")
        self.host("host.torch", "pass", measured=disc.get("torch"),
                  detail=f"python {disc.get('python')}")
        self.host("host.nccl", "pass" if disc.get("nccl") else "warn", measured=disc.get("nccl"),
                  hint="driver", detail="NCCL version torch carries")
        count = len(disc["devices"])
        exp = self.args.expected_gpus
        nvml_count = nvml.get("count")
        detail = f"torch sees {count}; NVML sees {nvml_count}; /dev nodes " \
                 f"{len(pre.get('device_nodes') or [])}"
        if exp is None:
            self.host("host.gpu_count", "pass", measured=count, unit="GPUs",
                      detail=detail + "; no expected count given")
        elif count < exp:
            self.host("host.gpu_count", "fail", measured=count, unit="GPUs", limit=exp,
                      hint="reboot", detail=detail + f"; expected {exp}: a GPU is missing "
                      "(fell off the bus, Xid 79?) or hidden by CUDA_VISIBLE_DEVICES")
        elif count > exp:
            self.host("host.gpu_count", "warn", measured=count, unit="GPUs", limit=exp,
                      hint="config", detail=detail + f"; expected only {exp}: update the "
                      "inventory (umprov_expected_gpus)")
        else:
            self.host("host.gpu_count", "pass", measured=count, unit="GPUs", limit=exp,
                      detail=detail)
        infos = disc.get("gpus_nvml") or []
        pm = [i.get("persistence") for i in infos if i.get("persistence") is not None]
        if not pm:
            self.host("host.persistence_mode", "skip", detail="not reported")
        else:
            on = sum(1 for x in pm if x)
            self.host("host.persistence_mode", "pass" if on == len(pm) else "warn",
                      measured=f"{on}/{len(pm)} enabled", hint="persistence",
                      detail="persistence mode keeps the driver loaded between jobs")
        switch = any(i.get("nvswitch") for i in infos)
        states = [(i.get("fabric_state"), i.get("fabric_status")) for i in infos]
        reported = [s for s in states if s[0] not in (None, 0)]
        if reported:
            bad = [s for s in reported if s[0] != 3 or (s[1] not in (None, 0))]
            names = {1: "not started", 2: "in progress", 3: "completed"}
            text = ", ".join(f"gpu{i}: {names.get(s[0], s[0])}" for i, s in enumerate(states))
            self.host("host.fabric_manager", "fail" if bad else "pass",
                      measured="completed" if not bad else "incomplete", hint="fabric-manager",
                      detail=f"GPU fabric state: {text}" + (
                          "; start nvidia-fabricmanager at the driver's version" if bad else ""))
        elif switch:
            self.host("host.fabric_manager", "skip",
                      detail="NVLinks end on an NVSwitch but the driver reports no fabric state "
                      "(N/A, e.g. managed by a hypervisor); the NCCL checks test the fabric")
        else:
            self.host("host.fabric_manager", "skip", detail="no NVSwitch seen")
        active = [i.get("nvlink_active") for i in infos if i.get("nvlink_active") is not None]
        if active:
            self.facts["nvlink_active"] = active

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

    def report(self, t_start: float, wall: float) -> dict:
        summary = dict.fromkeys(VERDICTS, 0)
        for r in self.records:
            summary[r["verdict"]] += 1
        verdict = worst(r["verdict"] for r in self.records)
        return {
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "agent_version": AGENT_VERSION,
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t_start)),
            "wall_s": round(wall, 2),
            "mode": "quick" if self.quick else "full",
            "verdict": verdict,
            "exit_code": exit_code_for(verdict),
            "profile": self.profile["name"],
            "summary": summary,
            "children_wall_s": self.children_wall,
            "timeline": self.timelines,
            "facts": self.facts,
            "records": self.records,
        }


def pair_records(events: list[dict], profile: dict, world: int) -> list[dict]:
    """One record per GPU pair from the receivers' per-direction events."""
    by_pair: dict[tuple[int, int], dict[tuple[int, int], dict]] = {}
    for e in events:
        a, b = sorted((int(e["src"]), int(e["dst"])))
        by_pair.setdefault((a, b), {})[(int(e["src"]), int(e["dst"]))] = e
    if not by_pair:
        return []
    best = max(min(d["gbps"] for d in dirs.values()) for dirs in by_pair.values())
    outlier = float(profile.get("limits", {}).get("pair_outlier_ratio", 0.7))
    out = []
    for (a, b), dirs in sorted(by_pair.items()):
        tgt = f"gpu{a}-gpu{b}"
        quick = any(d.get("quick") for d in dirs.values())
        size = int(next(iter(dirs.values())).get("bytes") or 0)
        text = ", ".join(f"{s}->{d} {e['gbps']:.1f} GB/s" for (s, d), e in sorted(dirs.items()))
        wrong = sum(int(e["wrong"]) for e in dirs.values())
        slow = min(e["gbps"] for e in dirs.values())
        missing = 2 - len(dirs)
        if wrong or missing:
            out.append(record("pair", tgt, "nccl.send_recv", "fail", measured=wrong,
                              unit="wrong elements", limit=0, hint="isolate",
                              detail=f"{text}; " + (f"{wrong} wrong elements" if wrong else
                                                    "a direction did not report")))
            continue
        rec = figure("pair", tgt, "nccl.send_recv", slow, "p2p_gbps", profile, judged=not quick,
                     hint="reseat", detail=f"slower direction of {text}"
                     + (f"; quick: {size // MiB} MiB transfers" if quick else ""))
        if not quick and world > 2 and slow < outlier * best and rec["verdict"] == "pass":
            rec["verdict"], rec["hint"] = "warn", "reseat"
            rec["detail"] += f"; below {outlier:g} x the best pair ({best:.0f} GB/s)"
        out.append(rec)
    return out


def load_profile_file(path: str) -> dict:
    """A JSON override document (YAML too, where PyYAML is importable)."""
    with open(path) as fh:
        text = fh.read()
    try:
        data = json.loads(text)
    except ValueError:
        try:
            import yaml
        except ImportError:
            raise ValueError(f"{path}: not JSON, and PyYAML is not installed for YAML") from None
        data = yaml.safe_load(text)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: must be a mapping with 'profiles' and/or 'profile'")
    unknown = set(data) - {"profiles", "profile", "schema"}
    if unknown:
        raise ValueError(f"{path}: unknown top-level key {sorted(unknown)[0]!r}")
    merge_profiles(BUILTIN_PROFILES, data)  # validates
    return data


def summary_lines(doc: dict) -> list[str]:
    lines = []
    for r in doc["records"]:
        if r["verdict"] in ("warn", "fail"):
            unit = f" {r['unit']}" if r["unit"] else ""
            m = "" if r["measured"] is None else f" {r['measured']}{unit}"
            lines.append(f"  {r['verdict'].upper():4} {r['target']:12} {r['check']}:{m} "
                         f"{r['detail']}")
    s = doc["summary"]
    lines.append(f"umprov verify agent: {doc['verdict']} ({s['fail']} fail, {s['warn']} warn, "
                 f"{s['pass']} pass, {s['skip']} skip) in {doc['wall_s']:.1f} s, profile "
                 f"{doc['profile']}")
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="agent.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", metavar="OUT", help="write the JSON report here ('-': stdout)")
    p.add_argument("--quick", action="store_true", help="fast subset (seconds)")
    p.add_argument("--expected-gpus", type=int, metavar="N", help="fail with fewer GPUs than N")
    p.add_argument("--profile-file", metavar="F", help="profile overrides (JSON, or YAML)")
    p.add_argument("--profile", metavar="NAME", help="use this profile instead of detecting")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                   help=f"per child process (default {DEFAULT_TIMEOUT:.0f})")
    p.add_argument("--managed-mib", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--quiet", action="store_true", help="no summary on stderr")
    p.add_argument("--list-profiles", action="store_true", help="print the profiles as JSON")
    # internal: how the agent starts its own children
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--child-opts", help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    p.add_argument("--device", type=int, help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--net-info", nargs="?", const="", metavar="TARGET", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def child_main(args: argparse.Namespace) -> int:
    with open(args.child_opts) as fh:
        opts = json.load(fh)
    kind = args.child
    name = {"gpu": f"gpu{args.device}", "nccl": f"nccl{args.rank}"}.get(kind, kind)
    out = args.child_out
    if kind == "multinode":  # one file per rank: torchrun starts them all with the same argv
        out = f"{out}.{os.environ.get('RANK', '0')}"
    em = Emitter(out, name)
    try:
        if kind == "discover":
            child_discover(em, opts)
        elif kind == "gpu":
            child_gpu(em, opts, int(args.device))
        elif kind == "nccl":
            child_nccl(em, opts, int(args.rank))
        elif kind == "multinode":
            child_multinode(em, opts)
        else:
            raise ValueError(f"unknown child {kind}")
    except Exception:
        traceback.print_exc()
        sys.stderr.flush()
        em.fh.flush()
        os._exit(1)
    em.fh.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter and CUDA teardown: the parent only needs the file


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    if args.net_info is not None:
        print(json.dumps(net_info(args.net_info or None)))
        return 0
    if args.list_profiles:
        print(json.dumps(BUILTIN_PROFILES, indent=2))
        return 0
    if not args.json:
        print("agent.py: --json OUT is required", file=sys.stderr)
        return EXIT_USAGE
    if args.timeout <= 0 or (args.expected_gpus is not None and args.expected_gpus < 0):
        print("agent.py: --timeout must be > 0 and --expected-gpus >= 0", file=sys.stderr)
        return EXIT_USAGE
    try:
        agent = Agent(args)
    except (OSError, ValueError) as exc:
        print(f"agent.py: profile: {exc}", file=sys.stderr)
        return EXIT_USAGE
    doc = agent.run()
    text = json.dumps(doc, indent=2, default=str)
    if args.json == "-":
        sys.stdout.write(text + "\n")
    else:
        tmp = args.json + ".tmp"
        with open(tmp, "w") as fh:
            fh.write(text + "\n")
        os.replace(tmp, args.json)
    if not args.quiet:
        print("\n".join(summary_lines(doc)), file=sys.stderr)
    return int(doc["exit_code"])


if __name__ == "__main__":
    sys.exit(main())
