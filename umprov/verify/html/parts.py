"""Pieces every section uses: escaped cells, sortable tables, verdict chips, what a figure is."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from umprov.verify.agent.profiles import BUILTIN_PROFILES, METRICS

# Units of the figures drawn against their lines (counts, versions and flags are not).
PLOT_UNITS = frozenset({"GB/s", "TB/s", "TFLOP/s", "x", "C", "s"})
ORDER = {"fail": 0, "unreachable": 0, "warn": 1, "pass": 2, "skip": 3}


def fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def chip(verdict: str) -> str:
    v = escape(verdict)
    return f'<span class="chip v-{v}">{v.upper()}</span>'


@dataclass
class Col:
    """A column: header, and whether its cells are numbers (right-aligned, sorted as such)."""

    name: str
    number: bool = False


@dataclass
class Markup:
    """A cell that is already HTML (built here, from escaped parts)."""

    html: str


# A fleet's tables repeat their words (GPU, check and unit names) thousands of times.
_escaped = functools.lru_cache(maxsize=1 << 14)(escape)


def cell(value: Any, col: Col) -> str:
    number = numeric(value)
    if isinstance(value, Markup) and not col.number:
        return f"<td>{value.html}</td>"
    # A number's text (digits, sign, point, exponent) has nothing to escape.
    shown = fmt(value) if number else _escaped(fmt(value))
    if col.number:
        sort = f' data-v="{value!r}"' if number else ""
        return f'<td class="num"{sort}>{shown}</td>'
    cls = ' class="detail"' if col.name == "detail" else ""
    return f"<td{cls}>{shown}</td>"


def table(cols: Sequence[Col], rows: Iterable[tuple[str, Sequence[Any]]], *, cls: str = "",
          caption: str = "") -> str:
    """A sortable table; each row is (row class, cells)."""
    head = "".join(f"<th>{escape(c.name)}</th>" for c in cols)
    body = "".join(
        f'<tr class="{escape(row_cls)}">'
        + "".join(cell(v, c) for v, c in zip(values, cols, strict=True)) + "</tr>"
        for row_cls, values in rows)
    cap = f"<caption class=note>{escape(caption)}</caption>" if caption else ""
    return (f'<table class="sortable {escape(cls)}">{cap}<thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table>")


def link(anchor: str, label: str, href: str | None = None) -> Markup:
    """A link to a section of this page, or to ``href`` (another page) when given."""
    return Markup(f'<a href="{escape(href or "#" + anchor)}">{escape(label)}</a>')


def host_anchor(index: int) -> str:
    return f"host-{index}"


def plotted(rec: dict) -> bool:
    return (numeric(rec.get("measured")) and rec.get("unit") in PLOT_UNITS
            and rec.get("verdict") != "skip")


def warn_line(profile_name: str, rec: dict) -> float | None:
    """The line below which a figure fails, where the record's profile is a built-in one and
    one of its metrics matches the record (unit, expected value and pass limit): records carry
    the pass limit and the expected value, not the warn ratio."""
    expected, limit = rec.get("expected"), rec.get("limit")
    if expected is None or limit is None:
        return None
    return _warn_line(profile_name, rec.get("unit"), expected, limit)


@functools.lru_cache(maxsize=1024)
def _warn_line(profile_name: str, unit: str | None, expected: float, limit: float
               ) -> float | None:
    profile = BUILTIN_PROFILES.get(profile_name) or {}
    ratios = profile.get("ratios", {})
    for metric, value in profile.get("expect", {}).items():
        p, w = ratios.get(metric) or ratios.get("default") or (None, None)
        if (value == expected and METRICS.get(metric, ("",))[0] == unit
                and p is not None and abs(expected * p - limit) < 1e-3 and w):
            return round(expected * w, 3)
    return None


def ref_lines(profile_name: str, rec: dict) -> list[tuple[float, str, str]]:
    """(value, CSS class, name) of the pass, warn and expected lines a record carries."""
    out = []
    if numeric(rec.get("limit")):
        out.append((float(rec["limit"]), "pass-line", "pass line"))
    warn = warn_line(profile_name, rec)
    if warn is not None:
        out.append((warn, "warn-line", "warn line (fails below)"))
    if numeric(rec.get("expected")):
        out.append((float(rec["expected"]), "expected-line", "expected"))
    return out


def devices(doc: dict) -> list[dict]:
    """The GPUs the agent's discover child saw (none for a host the agent did not run on)."""
    found = (((doc.get("facts") or {}).get("discover") or {}).get("devices")) or []
    return [d for d in found if isinstance(d, dict)]


def versions(doc: dict) -> dict[str, str]:
    """The software facts of a host: driver, CUDA, torch, NCCL (what the agent reported)."""
    facts = doc.get("facts") or {}
    disc = facts.get("discover") or {}
    nvml = disc.get("nvml") or {}
    gpus = devices(doc)
    models = sorted({str(d.get("name")) for d in gpus})
    out = {
        "driver": nvml.get("driver"), "CUDA (driver)": nvml.get("cuda_driver"),
        # A multi-node run's host documents keep torch and NCCL at the top of their facts.
        "CUDA runtime": disc.get("cuda_runtime"), "torch": disc.get("torch") or facts.get("torch"),
        "torch CUDA build": disc.get("torch_cuda_build"),
        "NCCL": disc.get("nccl") or facts.get("nccl"),
        "python": disc.get("python"),
        "GPUs": f"{len(gpus)} x {', '.join(models)}" if gpus else None,
        "image": facts.get("image"), "backend": facts.get("backend"),
    }
    return {k: str(v) for k, v in out.items() if v not in (None, "")}
