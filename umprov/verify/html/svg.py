"""Just enough SVG for the report's charts: scales, axes, and four kinds of chart.

Everything returned is markup with every text escaped; colours come from CSS classes (``v-pass``,
``series-3``...) so the page's light and dark themes apply inside the charts too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

WIDTH = 720


@dataclass(frozen=True)
class Scale:
    """Maps [lo, hi] onto [a, b] pixels, linearly or on log2."""

    lo: float
    hi: float
    a: float
    b: float
    log: bool = False

    def __call__(self, value: float) -> float:
        lo, hi, v = self.lo, self.hi, value
        if self.log:
            lo, hi, v = (math.log2(max(x, 1e-12)) for x in (lo, hi, v))
        if hi == lo:
            return (self.a + self.b) / 2
        return round(self.a + (v - lo) / (hi - lo) * (self.b - self.a), 1)


def padded(values: Sequence[float], pad: float = 0.06) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    span = (hi - lo) or abs(hi) or 1.0
    return lo - span * pad, hi + span * pad


def ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round numbers between lo and hi."""
    if hi <= lo:
        return [lo]
    step = 10 ** math.floor(math.log10((hi - lo) / count))
    for mult in (1, 2, 5, 10):
        if (hi - lo) / (step * mult) <= count:
            step *= mult
            break
    first = math.ceil(lo / step) * step
    return [round(first + i * step, 10) for i in range(int((hi - first) / step) + 1)]


def num(value: float) -> str:
    """A number for an axis or a label: short, but never in exponent form below 1e6."""
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}"


def size_label(nbytes: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


def svg(width: float, height: float, body: Sequence[str], label: str) -> str:
    return (f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" '
            f'height="{height}" role="img" aria-label="{escape(label)}">'
            f"<title>{escape(label)}</title>{''.join(body)}</svg>")


def text(x: float, y: float, content: str, cls: str = "", anchor: str = "start") -> str:
    attr = f' class="{escape(cls)}"' if cls else ""
    return (f'<text x="{x}" y="{y}" text-anchor="{anchor}"{attr}>{escape(content)}</text>')


def vline(x: float, y0: float, y1: float, cls: str, tip: str) -> str:
    return (f'<line class="{cls}" x1="{x}" x2="{x}" y1="{y0}" y2="{y1}">'
            f"<title>{escape(tip)}</title></line>")


def x_axis(scale: Scale, y: float, labels: Sequence[tuple[float, str]]) -> list[str]:
    out = [f'<line class="axis" x1="{scale.a}" x2="{scale.b}" y1="{y}" y2="{y}"/>']
    for value, label in labels:
        x = scale(value)
        out.append(f'<line class="axis" x1="{x}" x2="{x}" y1="{y}" y2="{y + 4}"/>')
        out.append(text(x, y + 15, label, "tick", "middle"))
    return out


def y_axis(scale: Scale, x: float, labels: Sequence[tuple[float, str]]) -> list[str]:
    out = [f'<line class="axis" x1="{x}" x2="{x}" y1="{scale.a}" y2="{scale.b}"/>']
    for value, label in labels:
        y = scale(value)
        out.append(f'<line class="grid" x1="{x}" x2="{WIDTH - 10}" y1="{y}" y2="{y}"/>')
        out.append(text(x - 6, y + 4, label, "tick", "end"))
    return out


@dataclass
class Dot:
    value: float
    verdict: str
    label: str  # who it is (host gpu3): the tooltip, and the text beside a warn or fail
    tip: str


def strip(title: str, unit: str, dots: Sequence[Dot], lines: Sequence[tuple[float, str, str]],
          *, max_labels: int = 12) -> str:
    """One dot per GPU (or pair) along the value axis; ``lines`` are (value, class, name): the
    pass, warn and expected lines. Warn and fail dots are drawn last and named."""
    height = 110
    values = [d.value for d in dots] + [v for v, _c, _n in lines]
    scale = Scale(*padded(values), 60, WIDTH - 20)
    body = x_axis(scale, 80, [(t, num(t)) for t in ticks(scale.lo, scale.hi)])
    body.append(text(54, 84, unit, "tick", "end"))
    body += [vline(scale(v), 14, 80, cls, f"{name}: {num(v)} {unit}") for v, cls, name in lines]
    quiet = [d for d in dots if d.verdict not in ("warn", "fail")]
    loud = [d for d in dots if d.verdict in ("warn", "fail")]
    if len(quiet) > DENSE:  # a fleet: the passing values as a histogram, the others as dots
        body += _histogram(quiet, scale, unit)
        quiet = []
    for i, dot in enumerate([*quiet, *loud]):
        x, y = scale(dot.value), 22 + hash_jitter(dot.label) * 50
        body.append(_dot(dot, x, y, 5 if i >= len(quiet) else 3.5))
        if i >= len(quiet) and i - len(quiet) < max_labels:  # the first warn and fail dots
            anchor = "end" if x > WIDTH / 2 else "start"
            body.append(text(x + (-8 if anchor == "end" else 8), y + 4, dot.label,
                             f"label v-{dot.verdict}", anchor))
    body.append(text(60, 10, title, "chart-title"))
    return svg(WIDTH, height, body, f"{title}: {len(dots)} values")


def _dot(dot: Dot, x: float, y: float, r: float) -> str:
    return (f'<circle class="dot v-{escape(dot.verdict)}" cx="{x}" cy="{y:.1f}" r="{r}">'
            f"<title>{escape(dot.tip)}</title></circle>")


DENSE = 400  # passing dots in one strip beyond which they are drawn as a histogram


def _histogram(dots: Sequence[Dot], scale: Scale, unit: str, width: float = 4) -> list[str]:
    bins: dict[int, list[Dot]] = {}
    for d in dots:
        bins.setdefault(int(scale(d.value) // width), []).append(d)
    most = max(len(b) for b in bins.values())
    out = []
    for key, members in sorted(bins.items()):
        h = max(2.0, 56 * math.sqrt(len(members) / most))
        lo, hi = min(d.value for d in members), max(d.value for d in members)
        names = ", ".join(d.label for d in members[:4]) + (", ..." if len(members) > 4 else "")
        out.append(f'<rect class="hist v-{escape(members[0].verdict)}" x="{key * width}" '
                   f'y="{78 - h:.1f}" width="{width - 0.5}" height="{h:.1f}"><title>'
                   f"{len(members)} at {num(lo)}-{num(hi)} {escape(unit)}: {escape(names)}"
                   "</title></rect>")
    return out


def hash_jitter(label: str) -> float:
    """A stable position in [0, 1) for a label: the same GPU sits at the same height."""
    h = 2166136261
    for ch in label.encode():
        h = ((h ^ ch) * 16777619) & 0xFFFFFFFF
    return (h % 1000) / 1000


@dataclass
class Series:
    name: str
    points: list[tuple[float, float]]
    cls: str = ""  # CSS class; default: series-N by position


def lines(title: str, series: Sequence[Series], *, x_unit: str, y_unit: str,
          log_x: bool = False, x_label: Callable[[float], str] = num,
          refs: Sequence[tuple[float, str, str]] = (), height: int = 220,
          x_ticks: Sequence[float] | None = None) -> str:
    """A line chart; ``refs`` are horizontal lines (value, class, name)."""
    xs = [x for s in series for x, _y in s.points]
    ys = [y for s in series for _x, y in s.points] + [v for v, _c, _n in refs]
    if not xs:
        return ""
    legend = list(series) if 1 < len(series) <= 8 else []  # more: their tooltips name them
    top = 24 + 12 * math.ceil(len(legend) / 4)
    x_lo, x_hi = (min(xs), max(xs)) if log_x else padded(xs, 0.02)
    sx = Scale(x_lo, x_hi, 60, WIDTH - 20, log=log_x)
    sy = Scale(*padded(ys), height - 40, top)
    if x_ticks is None:
        x_ticks = sorted(set(xs)) if log_x and len(set(xs)) <= 12 else ticks(x_lo, x_hi)
    body = y_axis(sy, 60, [(t, num(t)) for t in ticks(sy.lo, sy.hi)])
    body += x_axis(sx, height - 40, [(t, x_label(t)) for t in x_ticks])
    body.append(text(WIDTH - 20, height - 8, x_unit, "tick", "end"))
    body.append(text(8, 14, f"{title} ({y_unit})" if y_unit else title, "chart-title"))
    for i, s in enumerate(legend):
        body.append(text(330 + (i % 4) * 98, 14 + (i // 4) * 12, s.name[:15],
                         f"legend {s.cls or f'series-{i % 8}'}"))
    for value, cls, name in refs:
        y = sy(value)
        body.append(f'<line class="{cls}" x1="60" x2="{WIDTH - 20}" y1="{y}" y2="{y}">'
                    f"<title>{escape(name)}: {num(value)} {escape(y_unit)}</title></line>")
    # A fleet's trend charts share their few dates: each one's position and label once.
    at = {x: (sx(x), escape(str(x_label(x)))) for x in set(xs)}
    unit = escape(y_unit)
    for i, s in enumerate(series):
        cls = s.cls or f"series-{i % 8}"
        name = escape(s.name)
        pts = [(at[x], sy(y), y) for x, y in s.points]
        body.append(f'<polyline class="line {cls}" points="'
                    + " ".join(f"{px},{py}" for (px, _l), py, _y in pts)
                    + f'"><title>{name}</title></polyline>')
        for (px, label), py, y in pts if len(pts) <= 60 else ():
            body.append(f'<circle class="pt {cls}" cx="{px}" cy="{py}" r="2.5">'
                        f"<title>{name}: {num(y)} {unit} at {label}</title></circle>")
    return svg(WIDTH, height, body, title)


@dataclass
class Cell:
    row: int
    col: int
    value: float | None
    verdict: str
    key: str  # "gpu0-gpu5"
    tip: str


def heat_map(title: str, size: int, cells: Sequence[Cell], unit: str) -> str:
    """An upper-triangle matrix of GPU pairs, one cell per pair record, coloured by the value
    against the best pair (red slow, green fast); warn and fail cells get a heavy border."""
    step = max(26, min(48, 420 // max(size - 1, 1)))
    left, top = 50, 34
    span = max(size - 1, 1)  # rows gpu0..gpuN-2, columns gpu1..gpuN-1: no empty diagonal
    width = max(left + step * span + 20, 340)
    values = [c.value for c in cells if c.value is not None]
    best = max(values) if values else 1.0
    body = [text(8, 14, f"{title} ({unit})", "chart-title")]
    for i in range(span):
        body.append(text(left + i * step + step / 2, top - 6, f"gpu{i + 1}", "tick", "middle"))
        body.append(text(left - 6, top + i * step + step / 2 + 4, f"gpu{i}", "tick", "end"))
    for c in cells:
        x, y = left + (c.col - 1) * step, top + c.row * step
        if c.value is None or best <= 0:
            fill = "var(--skip)"
        else:
            fill = f"hsl({max(0.0, min(1.0, c.value / best)) ** 3 * 130:.0f} 70% 55%)"
        body.append(
            f'<g class="pair v-{escape(c.verdict)}" data-pair="{escape(c.key)}">'
            f'<rect x="{x}" y="{y}" width="{step - 2}" height="{step - 2}" fill="{fill}"/>'
            + (text(x + step / 2 - 1, y + step / 2 + 3, num(c.value), "cell", "middle")
               if c.value is not None else "")
            + f"<title>{escape(c.tip)}</title></g>")
    return svg(width, top + step * span + 10, body, f"{title}: {len(cells)} pairs")


@dataclass
class Bar:
    row: str
    start: float
    length: float
    cls: str
    tip: str


def bars(title: str, rows: Sequence[str], items: Sequence[Bar], unit: str = "s") -> str:
    """Horizontal bars on a shared time axis, one row per child process (a Gantt chart)."""
    row_h = 18
    height = 44 + row_h * len(rows)
    end = max([b.start + b.length for b in items] + [0.001])
    sx = Scale(0, end, 110, WIDTH - 20)
    body = [text(8, 14, title, "chart-title")]
    body += x_axis(sx, 24 + row_h * len(rows), [(t, num(t)) for t in ticks(0, end)])
    body.append(text(WIDTH - 20, height - 2, unit, "tick", "end"))
    index = {name: i for i, name in enumerate(rows)}
    for name, i in index.items():
        body.append(text(104, 24 + i * row_h + 12, name, "tick", "end"))
    for b in items:
        y = 24 + index[b.row] * row_h + 2
        w = max(sx(b.start + b.length) - sx(b.start), 0.5)
        body.append(f'<rect class="bar {b.cls}" x="{sx(b.start)}" y="{y}" width="{w:.1f}" '
                    f'height="{row_h - 4}"><title>{escape(b.tip)}</title></rect>')
    return svg(WIDTH, height, body, title)


@dataclass
class Row:
    name: str
    note: str
    dots: list[Dot]
    lines: list[tuple[float, str, str]]  # on the same scale as the dots


def dot_rows(title: str, rows: Sequence[Row], x_unit: str) -> str:
    """Rows of dots on one shared axis (a figure's value over its expected value), each row
    with its own pass and warn ticks: every figure of a host against its lines at once."""
    row_h = 30
    height = 50 + row_h * len(rows)
    values = [d.value for r in rows for d in r.dots] + [v for r in rows for v, _c, _n in r.lines]
    scale = Scale(*padded([*values, 1.0]), 190, WIDTH - 20)
    body = [text(8, 14, title, "chart-title")]
    body += x_axis(scale, 24 + row_h * len(rows), [(t, num(t)) for t in ticks(scale.lo, scale.hi)])
    body.append(text(WIDTH - 20, height - 4, x_unit, "tick", "end"))
    for i, row in enumerate(rows):
        top = 24 + i * row_h
        body.append(text(184, top + 12, row.name, "tick", "end"))
        body.append(text(184, top + 24, row.note, "tick small", "end"))
        body += [vline(scale(v), top + 1, top + row_h - 1, cls, name) for v, cls, name in row.lines]
        loud = [d for d in row.dots if d.verdict in ("warn", "fail")]
        for dot in [d for d in row.dots if d not in loud] + loud:
            x, y = scale(dot.value), top + 4 + hash_jitter(dot.label) * (row_h - 8)
            body.append(_dot(dot, x, y, 4.5 if dot in loud else 3))
        if loud:  # name them once, beside the lowest
            names = ", ".join(d.label for d in loud[:3]) + (f" +{len(loud) - 3}"
                                                             if len(loud) > 3 else "")
            low = min(loud, key=lambda d: d.value)
            body.append(text(scale(low.value) + 8, top + 16, names, f"label v-{low.verdict}"))
    return svg(WIDTH, height, body, title)
