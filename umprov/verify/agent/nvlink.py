"""NVLink per GPU: active links against the profile's ``nvlink_links``, the links that are
down, and the error counters (CRC flit and data, replay, recovery) read by the monitor child
before and after the run; what they grew by during the run warns or fails per the profile's
``nvlink_*_growth_*`` limits. A GPU without NVLink (NVML: not supported) is a skip."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .xid import pci_key

if TYPE_CHECKING:
    from collections.abc import Callable

# growth kind -> the counters it sums (libnvml.NVLINK_COUNTERS)
KINDS = {"crc": ("crc_flit", "crc_data"), "replay": ("replay",), "recovery": ("recovery",)}
DEFAULT_GROWTH = {"crc": (1, 100), "replay": (1, 100), "recovery": (1, 1)}  # (warn, fail) at


def snapshot(nv: Any) -> dict:
    """Links and error counters of every GPU NVML sees (``nv`` is an nvml.Nvml)."""
    if nv.lib is None:
        return {"gpus": [], "error": "NVLink needs the driver's NVML library: "
                + (nv.error or "not loaded")}
    gpus = []
    for h in nv.handles():
        states = nv.nvlink_states(h)
        gpus.append({**nv.identity(h), "links": states,
                     "errors": nv.nvlink_errors(h, len(states)) if states else None})
    return {"gpus": gpus}


def _by_pci(snap: dict | None) -> dict:
    return {pci_key(g.get("pci_bus_id")): g for g in (snap or {}).get("gpus", [])}


def nvlink_records(start: dict | None, end: dict | None, devices: list[dict],
                   profile_of: Callable[[int], dict], record: Callable[..., dict]) -> list[dict]:
    """nvlink.links and nvlink.errors per GPU torch sees; ``profile_of(index)`` is its
    profile."""
    if not (start or {}).get("gpus"):
        why = (start or {}).get("error") or "the driver reported no GPU"
        return [record("host", "host", "nvlink.links", "skip", detail=f"not read: {why}")]
    before, after = _by_pci(start), _by_pci(end)
    out = []
    for d in devices:
        key = pci_key(d.get("pci_bus_id"))
        g = before.get(key)
        tgt = f"gpu{d['index']}"
        if g is None or not g.get("links"):
            why = "NVML has no entry for this GPU" if g is None else \
                "no NVLink on this GPU (NVML: not supported)"
            out.append(record("gpu", tgt, "nvlink.links", "skip", detail=why))
            continue
        prof = profile_of(d["index"])
        if len(devices) < 2:  # no peer to reach: a one-GPU partition's links may be down
            prof = {**prof, "nvlink_links": None, "name": f"{prof.get('name')} (one GPU "
                    "visible: a single-GPU partition may keep its links down by design, so)"}
        out.append(_links(tgt, g["links"], (after.get(key) or {}).get("links"), prof, record))
        out.append(_errors(tgt, g.get("errors"), (after.get(key) or {}).get("errors"),
                           prof.get("limits", {}), record))
    return out


def _links(tgt: str, links: list[bool], later: list[bool] | None, prof: dict,
           record: Callable[..., dict]) -> dict:
    down = [i for i, up in enumerate(links) if not up]
    if later is not None:  # a link that went down during the run counts too
        down = sorted(set(down) | {i for i, up in enumerate(later) if not up})
    active = len(links) - len(down)
    text = f"{active} of {len(links)} links active" + (
        f"; down: link {', '.join(str(i) for i in down)}" if down else "")
    want = prof.get("nvlink_links")
    if want is None:
        return record("gpu", tgt, "nvlink.links", "pass", measured=active, unit="links",
                      detail=f"{text}; not judged: profile {prof.get('name')} expects no "
                      "count")
    ok = active >= int(want)
    return record("gpu", tgt, "nvlink.links", "pass" if ok else "fail", measured=active,
                  unit="links", limit=int(want), hint="reseat",
                  detail=f"{text}; profile {prof.get('name')} expects {int(want)}")


def growth(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Errors added per kind (crc, replay, recovery); kinds the GPU does not count are left
    out. A counter that went down (a driver reload) counts from zero."""
    out = {}
    for kind, names in KINDS.items():
        known = [n for n in names if n in before and n in after]
        if known:
            out[kind] = sum(after[n] - before[n] if after[n] >= before[n] else after[n]
                            for n in known)
    return out


def _errors(tgt: str, before: dict | None, after: dict | None, lim: dict,
            record: Callable[..., dict]) -> dict:
    if not before:
        return record("gpu", tgt, "nvlink.errors", "skip",
                      detail="NVLink error counters not reported by this GPU or driver")
    if not after:
        return record("gpu", tgt, "nvlink.errors", "skip",
                      detail="no second reading of the NVLink error counters")
    added = growth(before, after)
    verdict = "pass"
    for kind, n in added.items():
        warn_at, fail_at = (float(lim.get(f"nvlink_{kind}_growth_{v}", d)) for v, d in
                            zip(("warn", "fail"), DEFAULT_GROWTH[kind]))  # noqa: B905
        if n >= fail_at:
            verdict = "fail"
        elif n >= warn_at and verdict == "pass":
            verdict = "warn"
    since = ", ".join(f"{k} {v}" for k, v in sorted(before.items()))
    text = ", ".join(f"{k} +{v}" for k, v in added.items())
    return record("gpu", tgt, "nvlink.errors", verdict, measured=sum(added.values()),
                  unit="errors", hint="reseat",
                  detail=f"added during the run: {text or 'none'}; counters before the run "
                  f"(all links): {since}")
