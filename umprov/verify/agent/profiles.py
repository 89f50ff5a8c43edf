"""Per-model profiles: expected figures, the pass/warn ratios applied to them, and limits.

The built-in profiles are data: profiles.json beside this module, read as a package resource
(so it works from the zipapp). Thresholds are ratios of the expected value: measured >=
expected*pass -> pass, >= expected*warn -> warn, else fail. Expected values are healthy
measurements, not spec sheet peaks (reference: a 2x H200 SXM machine, bench/README.md).

An override document (``--profile-file``; umprov.verify.profiles reads the user's YAML on the
control side) follows one set of rules, ``check_document``; the built-ins follow the same::

    {"profile": "h200-sxm",                      optional: use it instead of detecting
     "profiles": {"h200-sxm": {"expect": {...}, "ratios": {...}, "limits": {...}},
                  "l40s": {"base": "generic", "match": ["L40S"], "expect": {...}}}}
"""

from __future__ import annotations

import copy
import json
import math
import re
from typing import Any

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
    "nvlink_crc_growth_warn": "NVLink CRC errors (flit + data) added during the run that warn",
    "nvlink_crc_growth_fail": "NVLink CRC errors added during the run that fail",
    "nvlink_replay_growth_warn": "NVLink replays added during the run that warn",
    "nvlink_replay_growth_fail": "NVLink replays added during the run that fail",
    "nvlink_recovery_growth_warn": "NVLink recoveries (link retrains) during the run that warn",
    "nvlink_recovery_growth_fail": "NVLink recoveries during the run that fail",
    "managed_oversub_floor_ratio_warn": "managed.oversubscription's step / its PCIe floor that "
                                        "warns",
    "managed_oversub_floor_ratio_fail": "managed.oversubscription's step / its PCIe floor that "
                                        "fails",
}
DEFAULT_RATIOS = (0.85, 0.70)
DOCUMENT_KEYS = ("profiles", "profile")
PROFILE_KEYS = ("description", "match", "expect", "ratios", "limits", "warn_only", "base",
                "nvlink_links")


def _resource_text(name: str) -> str:
    """A data file of this package, also when it runs from a zip archive."""
    # __name__, not __package__: Python 3.8 and 3.9 import from a zip through the legacy
    # load_module, which sets __package__ only after the module ran.
    package = __name__.rpartition(".")[0]
    try:
        from importlib.resources import files
    except ImportError:  # Python 3.8
        from importlib.resources import read_text

        return read_text(package, name, encoding="utf-8")
    return files(package).joinpath(name).read_text(encoding="utf-8")


def merge_profiles(base: dict[str, dict], overrides: dict[str, Any]) -> dict[str, dict]:
    """Apply an override document ({"profiles": {name: partial profile}}) to profiles.

    Known profiles are merged section by section (expect, ratios, limits: key by key; match,
    description, warn_only: replaced). New names start from a copy of ``generic`` (or of
    ``base``). Raises ValueError naming the first problem.
    """
    out = copy.deepcopy(base)
    raw = overrides.get("profiles") or {}
    if not isinstance(raw, dict):
        raise ValueError("'profiles' must be a mapping of profile name to settings")
    for name, spec in raw.items():
        out[name] = _merged(out, name, spec)
    forced = overrides.get("profile")
    if forced is not None and (not isinstance(forced, str) or forced not in out):
        raise ValueError(f"profile {_show(forced)} does not exist "
                         f"(known: {', '.join(sorted(out))})")
    return out


def _merged(profiles: dict[str, dict], name: Any, spec: Any) -> dict:
    """Profile ``name`` after ``spec``, checked key by key."""
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        raise ValueError(f"profile name {name!r} is not valid")
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        raise ValueError(f"profile {name}: must be a mapping")
    unknown = set(spec) - set(PROFILE_KEYS)
    if unknown:
        raise ValueError(f"profile {name}: unknown key {_show(sorted(unknown, key=str)[0])}")
    base_name = spec.get("base", name if name in profiles else "generic")
    if not isinstance(base_name, str) or base_name not in profiles:
        raise ValueError(f"profile {name}: base profile {_show(base_name)} does not exist")
    prof = copy.deepcopy(profiles[base_name])
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
    if "nvlink_links" in spec:  # active NVLinks per GPU; absent or null: not checked
        links = spec["nvlink_links"]
        if links is not None and (isinstance(links, bool) or not isinstance(links, int)
                                  or not 0 <= links <= 64):
            raise ValueError(f"profile {name}: nvlink_links must be a whole number 0-64, "
                             "or null")
        prof["nvlink_links"] = links
    if "warn_only" in spec:
        wo = spec["warn_only"]
        if not isinstance(wo, list) or any(not isinstance(k, str) or k not in METRICS
                                           for k in wo):
            raise ValueError(f"profile {name}: warn_only must list metric names")
        prof["warn_only"] = list(wo)
    return prof


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


def _load_builtin() -> dict[str, dict]:
    """profiles.json, checked by the override rules on an empty ``generic``; kept as written
    (whole profiles, numbers as they are) so a report shows the values of the file."""
    doc = json.loads(_resource_text("profiles.json"))
    empty = {"name": "generic", "description": "", "match": [], "expect": {}, "ratios": {},
             "warn_only": [], "limits": {}}
    merge_profiles({"generic": empty}, doc)
    return {name: {"name": name, **spec} for name, spec in doc["profiles"].items()}


BUILTIN_PROFILES: dict[str, dict] = _load_builtin()


def check_document(data: Any) -> dict[str, Any]:
    """The rules of an override document, for the agent and the control side alike: a mapping
    with 'profiles' and/or 'profile' only, whose profiles merge onto the built-ins. Returns it
    ({} for an empty document); ValueError names the first problem."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError("must be a mapping with 'profiles' and/or 'profile'")
    unknown = set(data) - set(DOCUMENT_KEYS)
    if unknown:
        raise ValueError(f"unknown key {_show(sorted(unknown, key=str)[0])} "
                         "(expected 'profiles' and/or 'profile')")
    merge_profiles(BUILTIN_PROFILES, data)
    return data


def load_profile_file(path: str) -> dict[str, Any]:
    """An override document from a file: JSON (YAML too, where PyYAML is importable)."""
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
    try:
        return check_document(data)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


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


def profiles_for(profile_file: str | None,
                 profile: str | None) -> tuple[dict[str, dict], str | None]:
    """(the profiles, the forced profile's name or None) from the agent's --profile-file and
    --profile; ValueError when the forced profile does not exist, OSError for the file."""
    overrides = load_profile_file(profile_file) if profile_file else {}
    profiles = merge_profiles(BUILTIN_PROFILES, overrides)
    forced = profile or overrides.get("profile")
    if forced and forced not in profiles:
        raise ValueError(f"profile {forced!r} does not exist")
    return profiles, forced
