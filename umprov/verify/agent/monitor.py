"""The monitor child: no torch and no CUDA, only NVML and the kernel log, for the whole run.

First the compute processes of every GPU (before any child of the agent has a CUDA context:
they wait for this child's gate, so every process listed is someone else's), then the NVLink
counters and the Xid lines since boot; then a sample of every GPU (clocks, temperature, power,
clock event reasons, ECC counters) every ``sample_every`` seconds until the parent creates the
stop file; then the same readings again, which the parent compares with the first.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from . import nvlink, processes
from .nvml import Nvml
from .runner import Emitter, open_gate
from .samples import burnin_records, by_gpu, contract_samples
from .xid import read_kernel_log, xid_key, xid_records

if TYPE_CHECKING:
    from collections.abc import Callable

XID_EVERY = 30.0  # seconds between reads of the kernel log during a burn-in


def child_monitor(em: Emitter, opts: dict) -> None:
    em.start("monitor.processes", "host")
    nv = Nvml()
    try:
        em.facts(nvml_source=nv.kind, nvml_error=nv.error)
        em.event("processes", phase="start", **processes.snapshot(nv))
    finally:
        open_gate(opts["cuda_gate"])  # the other children may create CUDA contexts now
    em.start("monitor.nvlink", "host")
    em.event("nvlink", phase="start", **nvlink.snapshot(nv))
    em.start("monitor.xid", "host")
    log = read_kernel_log()
    em.event("xids", phase="start", **log)
    em.start("monitor.samples", "host")
    # a burn-in reads the log as it goes too (cheap: a journal read goes on from its cursor)
    log_every = XID_EVERY if float(opts.get("duration") or 0) else None
    sample_until_stopped(em, nv, float(opts.get("sample_every") or 1.0), opts["stop"],
                         lambda: em.event("xids", phase="during", **read_kernel_log(log)),
                         log_every)
    em.start("monitor.end", "host")
    em.event("processes", phase="end", **processes.snapshot(nv))
    em.event("nvlink", phase="end", **nvlink.snapshot(nv))
    em.event("xids", phase="end", **read_kernel_log(log))
    em.done()


def sample_until_stopped(em: Emitter, nv: Nvml, every: float, stop: str,
                         read_log: Callable[[], None], log_every: float | None) -> None:
    """One "sample" event per GPU every ``every`` seconds, and ``read_log()`` every
    ``log_every`` seconds (None: never); the stop file ends it."""
    now = time.monotonic()
    due, log_due = now, now + (log_every or 0)
    while not os.path.exists(stop):
        now = time.monotonic()
        if now >= due and nv.kind != "none":
            due = max(due + every, now)
            for s in nv.sample_all():
                em.event("sample", **s)
        if log_every and now >= log_due:
            log_due = now + log_every
            read_log()
        time.sleep(0.05)


# -- the parent's side: records and samples from this child's events
def _first(events: list[dict], ev: str, phase: str) -> dict | None:
    return next((e for e in events if e.get("ev") == ev and e.get("phase") == phase), None)


def monitor_records(events: list[dict], devices: list[dict], *, exclusive: bool,
                    infos: dict[int, dict], profile_of: Callable[[int], dict],
                    window: tuple[float, float] | None, origin: float,
                    record: Callable[..., dict], ours: frozenset[int] = frozenset(),
                    ) -> tuple[list[dict], list[dict], Any]:
    """(records, the report's samples, other processes by GPU) from the monitor's events:
    gpu.processes, nvlink.*, xid.* / host.xid and, after a burn-in, burnin.throttle, .ecc and
    .temperature. ``ours``: the agent's own PIDs."""
    procs = (_first(events, "processes", "start"), _first(events, "processes", "end"))
    recs = processes.process_records(*procs, devices, exclusive, record, ours)
    recs += nvlink.nvlink_records(_first(events, "nvlink", "start"),
                                  _first(events, "nvlink", "end"), devices, profile_of, record)
    recs += xid_records(_first(events, "xids", "start") or {"unreadable": [
        "the monitor child did not read it"]}, _first(events, "xids", "end"), devices, record)
    per_gpu = by_gpu(events, devices)
    if window is not None:
        recs += burnin_records(per_gpu, window, infos, profile_of, record)
    return recs, contract_samples(per_gpu, origin), processes.foreign_by_gpu(*procs, devices,
                                                                             ours)


def found_xids(events: list[dict], record: Callable[..., dict]) -> list[dict]:
    """Without a GPU to check: only the Xids the log holds (a GPU that fell off the bus
    explains its absence); nothing that would read as a pass."""
    start = _first(events, "xids", "start") or {}
    if not start.get("xids"):
        return []
    return xid_records(start, _first(events, "xids", "end"), [], record)


def new_xids(events: list[dict]) -> list[dict]:
    """Xids the burn-in's reads of the log found since the first read, for the progress line."""
    start = _first(events, "xids", "start") or {}
    seen = {xid_key(e) for e in start.get("xids", [])}
    out: dict[tuple, dict] = {}
    for ev in events:
        if ev.get("ev") == "xids" and ev.get("phase") == "during":
            out.update({xid_key(e): e for e in ev.get("xids", []) if xid_key(e) not in seen})
    return list(out.values())
