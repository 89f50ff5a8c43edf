"""The monitor child's samples, as the parent uses them: the report's ``samples`` list, the
burn-in's verdicts on throttling, ECC and temperature, and the progress line on stderr.

``samples`` (a top-level list of the host document; the HTML report draws it)::

    {"t": seconds since the run started, "gpu": index (torch's), "temp_c", "power_w",
     "sm_clock_mhz", "mem_clock_mhz": numbers or null, "throttle": [reason names]}
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .health import POWER_CAP, SLOWDOWNS, THERMAL, temperature, throttle_names
from .xid import pci_key

if TYPE_CHECKING:
    from collections.abc import Callable

FIELDS = (("temp_c", "temperature_c"), ("power_w", "power_w"),
          ("sm_clock_mhz", "sm_clock_mhz"), ("mem_clock_mhz", "mem_clock_mhz"))


def by_gpu(events: list[dict], devices: list[dict]) -> dict[int, list[dict]]:
    """The monitor's "sample" events of each GPU torch sees, by its index, in time order."""
    gpu_of = {pci_key(d.get("pci_bus_id")): d["index"] for d in devices}
    out: dict[int, list[dict]] = {}
    for e in events:
        if e.get("ev") == "sample":
            idx = gpu_of.get(pci_key(e.get("pci_bus_id")))
            if idx is not None:
                out.setdefault(idx, []).append(e)
    return out


def contract_samples(per_gpu: dict[int, list[dict]], origin: float) -> list[dict]:
    out = []
    for idx, evs in sorted(per_gpu.items()):
        for e in evs:
            s: dict[str, Any] = {"t": round(float(e["m"]) - origin, 2), "gpu": idx}
            for key, raw in FIELDS:
                v = e.get(raw)
                s[key] = round(float(v), 1) if isinstance(v, (int, float)) else None
            s["throttle"] = throttle_names(e.get("throttle_mask"))
            out.append(s)
    out.sort(key=lambda s: (s["t"], s["gpu"]))
    return out


def burnin_records(per_gpu: dict[int, list[dict]], window: tuple[float, float],
                   infos: dict[int, dict], profile_of: Callable[[int], dict],
                   record: Callable[..., dict]) -> list[dict]:
    """burnin.throttle, burnin.ecc and burnin.temperature per GPU, from the samples taken
    between the burn-in's start and end (monotonic seconds)."""
    out: list[dict] = []
    for idx in sorted(infos):
        tgt = f"gpu{idx}"

        def rec(check: str, verdict: str, _tgt: str = tgt, **kw: Any) -> None:
            out.append(record("gpu", _tgt, check, verdict, **kw))

        inside = [e for e in per_gpu.get(idx, []) if window[0] <= float(e["m"]) <= window[1]]
        if not inside:
            rec("burnin.throttle", "skip", detail="no NVML samples during the burn-in")
            continue
        _throttle(rec, inside)
        _ecc(rec, inside)
        temperature(rec, infos[idx], inside, profile_of(idx).get("limits", {}),
                    check="burnin.temperature", when=f"hottest of {len(inside)} samples "
                    "during the burn-in")
    return out


def _throttle(rec: Callable[..., None], inside: list[dict]) -> None:
    masks = [int(e["throttle_mask"]) for e in inside if e.get("throttle_mask") is not None]
    if not masks:
        rec("burnin.throttle", "skip", detail="clock event reasons not reported")
        return
    union = 0
    for m in masks:
        union |= m
    slow = union & SLOWDOWNS
    capped = sum(1 for m in masks if m & POWER_CAP)
    rec("burnin.throttle", "fail" if slow else "pass", measured=hex(union),
        hint="cooling" if union & THERMAL else "power",
        detail=f"clock event reasons over {len(masks)} samples: "
        f"{', '.join(throttle_names(union)) or 'none'}; power cap in {capped} of them "
        "(allowed); any other slowdown fails")


def _ecc(rec: Callable[..., None], inside: list[dict]) -> None:
    unc = [e["ecc_uncorrected_volatile"] for e in inside
           if e.get("ecc_uncorrected_volatile") is not None]
    cor = [e["ecc_corrected_volatile"] for e in inside
           if e.get("ecc_corrected_volatile") is not None]
    if not unc:
        rec("burnin.ecc", "skip", detail="ECC counters not reported")
        return
    added = unc[-1] - unc[0]
    rec("burnin.ecc", "fail" if added > 0 else "pass", measured=added, unit="errors", limit=0,
        hint="reset", detail="uncorrectable ECC errors added during the burn-in"
        + (f"; correctable +{cor[-1] - cor[0]}" if cor else ""))


def progress_line(elapsed: float, seconds: float, per_gpu: dict[int, list[dict]],
                  probes: dict[int, dict]) -> str:
    """One line on stderr: per GPU its latest temperature, power, clock and probe figures."""
    parts = []
    for idx in sorted(set(per_gpu) | set(probes)):
        s = per_gpu.get(idx, [{}])[-1]
        p = probes.get(idx, {})
        bits = [f"{s['temperature_c']:.0f} C" if s.get("temperature_c") is not None else "",
                f"{s['power_w']:.0f} W" if s.get("power_w") is not None else "",
                f"{s['sm_clock_mhz']:.0f} MHz" if s.get("sm_clock_mhz") is not None else "",
                f"{p['tflops']:.0f} TFLOP/s" if "tflops" in p else "",
                f"{p['gbps']:.0f} GB/s" if "gbps" in p else ""]
        parts.append(f"gpu{idx} " + " ".join(b for b in bits if b))
    return (f"burn-in {elapsed:.0f}/{seconds:.0f} s: " + "; ".join(parts)).rstrip(": ")
