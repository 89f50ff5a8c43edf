"""The verify report as one self-contained HTML page (``umprov verify --html``, ``umprov
report``): styles and script inline, charts as inline SVG drawn here, nothing fetched from
anywhere (a Content-Security-Policy says so to the browser too); light or dark as the browser
prefers; printable. Every text from a host document is escaped.

Sections: the fleet overview (hosts by verdict, what needs action first with its hint, the
problem records, software versions), every figure across the fleet (parts: fleet.py), one
section per host (host.py), and with a history, each host's trends (trends.py).
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable, Sequence
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING

from umprov.verify.html import fleet, host
from umprov.verify.html import trends as trend_html
from umprov.verify.html.assets import CSP, CSS, JS
from umprov.verify.html.workers import write_pages

if TYPE_CHECKING:
    from umprov.verify.history import HostTrend


# A run of more hosts than this keeps each passing host's section (and trends) on a page of
# its own beside the report, linked from the host table: 1,000 hosts of 8 GPUs made a 52 MiB
# page that a browser took seconds to open; the failing and warning hosts stay on it.
INLINE_HOSTS = 50
PAGES_MARKER = ".umprov-report"


def render(docs: Sequence[dict], *, seconds: float | None = None,
           trends: Sequence[HostTrend] | None = None, title: str | None = None,
           now: float | None = None) -> str:
    """The page for a run's host documents, every host's section on it, and, when given, the
    hosts' trends. Hosts appear by name, whatever order the run finished them in."""
    return render_pages(docs, seconds=seconds, trends=trends, title=title, now=now)[0]


def render_pages(docs: Sequence[dict], *, seconds: float | None = None,
                 trends: Sequence[HostTrend] | None = None, title: str | None = None,
                 now: float | None = None, folder: str | None = None,
                 main_name: str = "") -> tuple[str, dict[str, Callable[[], str]]]:
    """(the report page, {file name: what renders its page} for the hosts given pages of
    their own in ``folder``): with a folder and more than INLINE_HOSTS hosts, each passing
    host's section and trends go to a page of its own, linked from the host table."""
    docs = sorted(docs, key=lambda d: str(d.get("host")))
    outcomes = fleet.verdicts(docs)
    worst = next((v for v in ("fail", "unreachable", "warn", "pass") if v in outcomes), "none")
    title = title or f"umprov verify: {len(docs)} host(s), {worst}"
    files: dict[int, str] = {}
    if folder and len(docs) > INLINE_HOSTS:
        files = {i: _file_name(i, str(d.get("host"))) for i, (d, v) in
                 enumerate(zip(docs, outcomes, strict=True)) if v == "pass"}
    by_host = {t.host: t for t in trends or ()}
    paged_names = {str(docs[i].get("host")) for i in files}
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(now))
    body = [f"<h1>{escape(title)}</h1><p class=muted>Generated {when} by umprov.</p>"]
    if trends is not None:
        body += ["<h2>Regressions against each host's own history</h2>",
                 trend_html.regressions(trends)]
    if docs:
        body += [
            fleet.cards(docs, seconds),
            "<h2>Needs action</h2>", fleet.needs_action(docs),
            "<h2>Hosts</h2>", fleet.host_table(docs, {i: f"{folder}/{f}" for i, f in
                                                      files.items()}),
            "<h2>Problems: failing checks first</h2>", fleet.problem_table(docs),
            "<h2>Software</h2>", fleet.software_table(docs),
            "<h2>Figures across the fleet</h2>",
            '<p class="note">One dot per GPU, pair or host; solid: pass line, dashed: warn '
            "line (below it a figure fails), dotted: the profile's expected value.</p>",
            fleet.strips(docs),
            "<h2>Each host</h2>", _paged_note(len(files), folder),
            host.sections(docs, outcomes, skip=files),
        ]
    if trends is not None:
        shown = [t for t in trends if t.regressions or t.host not in paged_names]
        body += ["<h2>Trends: each host against its own history</h2>",
                 trend_html.section(shown)]
    pages = {name: functools.partial(_host_page, i, docs[i], outcomes[i],
                                     by_host.get(str(docs[i].get("host"))), title, main_name)
             for i, name in files.items()}
    return page(title, "".join(body)), pages


def _host_page(index: int, doc: dict, verdict: str, trend: HostTrend | None, title: str,
               main_name: str) -> str:
    """One host's page of its own: a link back to the report, its section, its trends."""
    back = f'<p><a href="../{escape(main_name)}">{escape(title)}</a></p>' if main_name else ""
    extra = "" if trend is None else "<h2>Trends</h2>" + trend_html.section([trend])
    return page(f"{doc.get('host')}: {title}",
                back + host.section(index, doc, verdict, open_=True) + extra)


def _file_name(index: int, host_name: str) -> str:
    return f"{index:05d}-{re.sub(r'[^A-Za-z0-9._-]', '_', host_name)[:80]}.html"


def _paged_note(count: int, folder: str | None) -> str:
    if not count:
        return ""
    return (f'<p class="note">{count} passing hosts each have a page of their own in '
            f"{escape(str(folder))}/, linked from the host table; the others follow.</p>")


def page(title: str, body: str) -> str:
    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta name="generator" content="umprov"><title>{escape(title)}</title>'
        f"<style>{CSS}</style></head>\n<body>{body}<script>{JS}</script></body></html>\n")


def write(path: Path, docs: Sequence[dict], *, seconds: float | None = None,
          trends: Sequence[HostTrend] | None = None, title: str | None = None) -> Path:
    """Render and write the page atomically (a reader never sees half of it); for a large run,
    the hosts' own pages first, into PATH's stem + ".hosts" beside it, swapped in whole."""
    from umprov.paths import write_atomic

    path = Path(path)
    folder = f"{path.stem}.hosts"
    main, pages = render_pages(docs, seconds=seconds, trends=trends, title=title,
                               folder=folder, main_name=path.name)
    _replace_pages(path.parent / folder, pages)
    write_atomic(path, main)
    return path


def _replace_pages(folder: Path, pages: dict[str, Callable[[], str]]) -> None:
    """The folder of host pages, replaced whole (written beside it, then renamed); one that
    umprov did not write is never touched; with no pages, an old one of umprov's is removed."""
    import os
    import shutil

    from umprov.errors import ConfigError

    if folder.exists() and not (folder / PAGES_MARKER).is_file():
        if not pages:
            return
        raise ConfigError(f"{folder} exists and umprov did not write it: the report's host "
                          "pages go there; move it or name another --html file")
    new = folder.with_name(f".{folder.name}.{os.getpid()}.new")
    old = folder.with_name(f".{folder.name}.{os.getpid()}.old")
    if pages:
        shutil.rmtree(new, ignore_errors=True)
        new.mkdir(parents=True)
        (new / PAGES_MARKER).write_text("host pages of an umprov report\n")
        try:
            write_pages(new, pages)
        except BaseException:
            shutil.rmtree(new, ignore_errors=True)  # the old pages stay, nothing half-new
            raise
    if folder.exists():
        folder.rename(old)
    if pages:
        new.rename(folder)
    shutil.rmtree(old, ignore_errors=True)
