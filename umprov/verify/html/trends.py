"""Each host's figures over time (umprov report with --html): a chart per check, one line per
GPU or pair, the regressed ones in red against their median; and the table of every figure."""

from __future__ import annotations

import time
from collections.abc import Sequence
from html import escape

from umprov.verify.history import REGRESSION, FigureTrend, HostTrend
from umprov.verify.html import svg
from umprov.verify.html.parts import PLOT_UNITS, Col, fmt, table


def day(epoch: float) -> str:
    return time.strftime("%m-%d %H:%M", time.gmtime(epoch))


def change(fig: FigureTrend) -> str:
    return "" if fig.change is None else f"{fig.change * 100:+.1f} %"


def section(trends: Sequence[HostTrend]) -> str:
    if not trends:
        return '<p class="muted">No history in this window.</p>'
    rule = (f"A figure is flagged when its latest value is {REGRESSION.drop:.0%} worse than "
            f"the median of up to {REGRESSION.window} earlier runs of the same host (at least "
            f"{REGRESSION.min_runs}); lower is worse for bandwidth and rates, higher for "
            "latency; figures that scatter need more ("
            + ", ".join(f"{c} {d:.0%}" for c, d in REGRESSION.noisy.items())
            + "). Flags are the host's own history, whatever the profile says. Red lines: "
            "regressed; dashed: their median.")
    return f'<p class="note">{escape(rule)}</p>' + "".join(_host(t) for t in trends)


def regressions(trends: Sequence[HostTrend]) -> str:
    """The flagged figures, one line each, for the top of the page."""
    items = [f'<li><span class="chip v-fail">REGRESSED</span> <b>{escape(t.host)}</b> '
             f"<b>{escape(f.target)}</b> {escape(f.check)}: {escape(fmt(f.latest))} "
             f"{escape(f.unit or '')} against a median of {escape(fmt(f.median))} "
             f"({escape(change(f))})</li>" for t in trends for f in t.regressions]
    return (f'<ul class="action">{"".join(items)}</ul>' if items else
            '<p class="muted">No figure regressed against its host\'s own history.</p>')


def _host(t: HostTrend) -> str:
    flagged = t.regressions
    head = (f'<span class="chip v-{"fail" if flagged else "pass"}">'
            f'{len(flagged)} REGRESSED</span> ' if flagged else "")
    former = [n for n in t.names if n != t.host]
    note = (f"{len(t.saved)} runs, {day(t.saved[0])} to {day(t.saved[-1])} UTC; key "
            f"{t.key}" + (f"; formerly {', '.join(former)}" if former else ""))
    charts = "".join(_chart(check, figs) for check, figs in _by_check(t.figures).items())
    cols = [Col("target"), Col("check"), Col("unit"), Col("runs", True), Col("median", True),
            Col("latest", True), Col("change"), Col("regression")]
    rows = ((f"v-{'fail' if f.regressed else 'pass'}",
             [f.target, f.check, f.unit, len(f.points), f.median, f.latest, change(f),
              "REGRESSION" if f.regressed else ""]) for f in t.figures)
    return (f'<details class="host" {"open" if flagged else ""}><summary>{head}'
            f"{escape(t.host)} <span class=muted>{escape(note)}</span></summary>{charts}"
            f"{table(cols, rows, cls='trends')}</details>")


def _by_check(figures: Sequence[FigureTrend]) -> dict[str, list[FigureTrend]]:
    out: dict[str, list[FigureTrend]] = {}
    for f in figures:
        if f.unit in PLOT_UNITS and len(f.points) > 1:
            out.setdefault(f.check, []).append(f)
    return dict(sorted(out.items()))


def _chart(check: str, figs: list[FigureTrend]) -> str:
    figs = sorted(figs, key=lambda f: f.target)
    series = [svg.Series(f.target, f.points, "regressed" if f.regressed else "")
              for f in figs]  # red: regressed
    refs = [(f.median, "median-line", f"{f.target} median of earlier runs")
            for f in figs if f.median is not None and (f.regressed or len(figs) == 1)]
    runs = sorted({t for f in figs for t, _v in f.points})
    shown = runs[:: max(1, -(-len(runs) // 5))]  # at most five dates under the axis
    return svg.lines(check, series, x_unit="UTC", y_unit=figs[0].unit or "", x_label=day,
                     refs=refs, height=180, x_ticks=shown)
