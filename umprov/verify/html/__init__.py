"""The verify report as one self-contained HTML page (``umprov verify --html``, ``umprov
report``): styles and script inline, charts as inline SVG drawn here, nothing fetched from
anywhere (a Content-Security-Policy says so to the browser too); light or dark as the browser
prefers; printable. Every text from a host document is escaped.

Sections: the fleet overview (hosts by verdict, what needs action first with its hint, the
problem records, software versions), every figure across the fleet (parts: fleet.py), one
section per host (host.py), and with a history, each host's trends (trends.py).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING

from umprov.verify.html import fleet, host
from umprov.verify.html.assets import CSP, CSS, JS

if TYPE_CHECKING:
    from umprov.verify.history import HostTrend


def render(docs: Sequence[dict], *, seconds: float | None = None,
           trends: Sequence[HostTrend] | None = None, title: str | None = None,
           now: float | None = None) -> str:
    """The page for a run's host documents, and, when given, the hosts' trends. Hosts appear
    by name, whatever order the run finished them in."""
    docs = sorted(docs, key=lambda d: str(d.get("host")))
    outcomes = fleet.verdicts(docs)
    worst = next((v for v in ("fail", "unreachable", "warn", "pass") if v in outcomes), "none")
    title = title or f"umprov verify: {len(docs)} host(s), {worst}"
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(now))
    body = [f"<h1>{escape(title)}</h1><p class=muted>Generated {when} by umprov.</p>"]
    if trends is not None:
        from umprov.verify.html import trends as trend_html

        body += ["<h2>Regressions against each host's own history</h2>",
                 trend_html.regressions(trends)]
    if docs:
        body += [
            fleet.cards(docs, seconds),
            "<h2>Needs action</h2>", fleet.needs_action(docs),
            "<h2>Hosts</h2>", fleet.host_table(docs),
            "<h2>Problems: failing checks first</h2>", fleet.problem_table(docs),
            "<h2>Software</h2>", fleet.software_table(docs),
            "<h2>Figures across the fleet</h2>",
            '<p class="note">One dot per GPU, pair or host; solid: pass line, dashed: warn '
            "line (below it a figure fails), dotted: the profile's expected value.</p>",
            fleet.strips(docs),
            "<h2>Each host</h2>", host.sections(docs, outcomes),
        ]
    if trends is not None:
        body += ["<h2>Trends: each host against its own history</h2>",
                 trend_html.section(trends)]
    return page(title, "".join(body))


def page(title: str, body: str) -> str:
    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta name="generator" content="umprov"><title>{escape(title)}</title>'
        f"<style>{CSS}</style></head>\n<body>{body}<script>{JS}</script></body></html>\n")


def write(path: Path, docs: Sequence[dict], *, seconds: float | None = None,
          trends: Sequence[HostTrend] | None = None, title: str | None = None) -> Path:
    """Render and write the page atomically (a reader never sees half of it)."""
    from umprov.paths import write_atomic

    write_atomic(Path(path), render(docs, seconds=seconds, trends=trends, title=title))
    return Path(path)
