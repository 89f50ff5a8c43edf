"""Per-model verification profiles: expected figures and the pass/warn ratios applied to them.

The built-in profiles are data inside the agent (umprov/verify/agent/profiles.json): the agent
runs alone inside containers and must carry them. This module is the control-machine side: it
reads a user's override file (YAML, JSON being YAML too), checks it with the agent's own rules
(``check_document``: one set of rules on both sides) as one-line ConfigErrors, and writes the
JSON document the agent takes with ``--profile-file``. The override format::

    profile: h200-sxm            # optional: use this profile instead of detecting by GPU name
    profiles:
      h200-sxm:                  # a built-in profile: merged key by key
        expect: {hbm_copy_gbps: 4100, nccl_busbw_1g_gbps: 320}
        ratios: {default: [0.9, 0.75], managed_fault_gbps: [0.3, 0.0]}
        limits: {temperature_warn_c: 80}
      l40s:                      # a new profile, based on generic unless 'base' says otherwise
        match: ["L40S"]
        expect: {bf16_tflops: 300, hbm_copy_gbps: 780}

A figure passes at ``measured >= expected * pass``, warns down to ``expected * warn``, and
fails below (metrics in ``warn_only`` never fail). Expected values are what a healthy machine
measures, not spec-sheet peaks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from umprov.errors import ConfigError
from umprov.verify.agent.profiles import (
    BUILTIN_PROFILES,
    LIMITS,
    METRICS,
    check_document,
    judge,
    merge_profiles,
    select_profile,
)

__all__ = [
    "BUILTIN_PROFILES",
    "LIMITS",
    "METRICS",
    "check_host_profiles",
    "judge",
    "load_overrides",
    "resolve",
    "select_profile",
    "write_agent_profile",
]


def load_overrides(path: str | Path) -> dict[str, Any]:
    """Read and validate an override file; ConfigError (one line) when it is wrong."""
    import yaml

    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"profile file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"profile file {path}: not UTF-8 text") from None
    try:
        data = yaml.safe_load(text)  # JSON is YAML too
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"profile file {path}:{where} not valid YAML") from None
    except (ValueError, RecursionError) as exc:  # a number too long to build; nesting too deep
        raise ConfigError(f"profile file {path}: cannot load: {exc}") from None
    try:
        return check_document(data)  # the agent's own rules
    except ValueError as exc:
        raise ConfigError(f"profile file {path}: {exc}") from None


def resolve(overrides: dict[str, Any] | None = None) -> dict[str, dict]:
    """Every profile after overrides (built-ins when none)."""
    try:
        return merge_profiles(BUILTIN_PROFILES, overrides or {})
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def check_host_profiles(hosts: Sequence[Any], overrides: Mapping[str, Any] | None) -> None:
    """Each host's umprov_gpu_profile names a profile (built-in, or one the --profile-file adds):
    a ConfigError naming the host and its variable otherwise, before any host is touched (the
    agent would fail on that host alone). --profile wins over every host's."""
    if (overrides or {}).get("profile"):
        return
    known = resolve(dict(overrides or {}))
    for host in hosts:
        forced = (getattr(host, "vars", {}) or {}).get("umprov_gpu_profile")
        if forced not in (None, "") and str(forced) not in known:
            raise ConfigError(f"{host.name}: umprov_gpu_profile: profile {str(forced)[:60]!r} "
                              f"does not exist (known: {', '.join(sorted(known))})")


def write_agent_profile(path: Path, overrides: dict[str, Any], *,
                        force: str | None = None) -> Path:
    """The JSON document for the agent's ``--profile-file`` (overrides plus a forced profile)."""
    doc: dict[str, Any] = {"profiles": overrides.get("profiles") or {}}
    chosen = force or overrides.get("profile")
    if chosen:
        if chosen not in resolve(overrides):
            raise ConfigError(f"profile {chosen!r} does not exist "
                              f"(known: {', '.join(sorted(resolve(overrides)))})")
        doc["profile"] = chosen
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path
