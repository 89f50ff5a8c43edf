"""One host's section: its facts, each figure against its lines, the NCCL pair heat map, bus
bandwidth against message size, burn-in samples, the timeline of its child processes, and
every record. Each part shows what the host document carries, and nothing when it is absent."""

from __future__ import annotations

from collections.abc import Container, Sequence
from html import escape

from umprov.verify.html import svg
from umprov.verify.html.parts import (
    Col,
    chip,
    fmt,
    host_anchor,
    numeric,
    plotted,
    ref_lines,
    table,
    versions,
)

SWEEP = "nccl.allreduce_sweep"  # host records with size_bytes: one point of a busbw sweep


def section(index: int, doc: dict, verdict: str, *, open_: bool) -> str:
    facts = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in versions(doc).items())
    head = (f"{chip(verdict)} {escape(doc['host'])} <span class=muted>profile "
            f"{escape(doc['profile'])}, {escape(doc['mode'])}, {fmt(doc['wall_s'])} s, "
            f"{escape(doc['started'])}</span>")
    parts = [f'<dl class="facts">{facts}</dl>' if facts else "", figures(doc), heat_map(doc),
             sweep(doc), samples(doc), timeline(doc), records(doc)]
    return (f'<details class="host v-{escape(verdict)}" id="{host_anchor(index)}"'
            f'{" open" if open_ else ""}><summary>{head}</summary>{"".join(parts)}</details>')


def figures(doc: dict) -> str:
    """Every figure with an expected value, as a fraction of it, beside its pass/warn ticks."""
    rows: dict[str, svg.Row] = {}
    for rec in doc["records"]:
        if not plotted(rec) or not numeric(rec.get("expected")) or not rec["expected"]:
            continue
        expected = float(rec["expected"])
        row = rows.get(rec["check"])
        if row is None:  # the lines of a check's first record stand for the row
            row = rows[rec["check"]] = svg.Row(
                rec["check"], f"expected {fmt(expected)} {rec['unit']}", [],
                [(v / expected, cls, f"{name}: {fmt(v)} {rec['unit']}")
                 for v, cls, name in ref_lines(doc["profile"], rec) if cls != "expected-line"])
        row.dots.append(svg.Dot(float(rec["measured"]) / expected, rec["verdict"], rec["target"],
                                f"{rec['target']}: {fmt(rec['measured'])} {rec['unit']} "
                                f"({rec['verdict']})"))
    if not rows:
        return ""
    return svg.dot_rows("Each figure against its lines (1 = the profile's expected value)",
                        list(rows.values()), "measured / expected")


def heat_map(doc: dict) -> str:
    pairs = [r for r in doc["records"] if r["scope"] == "pair" and r.get("gpu") is not None
             and r.get("peer") is not None]
    if not pairs:
        return ""
    size = max(max(r["gpu"], r["peer"]) for r in pairs) + 1
    units = {r["unit"] for r in pairs if r["unit"] and numeric(r["measured"])}
    unit = "GB/s" if "GB/s" in units else (next(iter(units)) if units else "")
    cells = [svg.Cell(min(r["gpu"], r["peer"]), max(r["gpu"], r["peer"]),
                      float(r["measured"]) if numeric(r["measured"]) and r["unit"] == unit
                      else None, r["verdict"], r["target"],
                      f"{r['target']} {r['check']}: {fmt(r['measured'])} {r['unit'] or ''} "
                      f"({r['verdict']}) {r['detail']}") for r in pairs]
    return svg.heat_map("NCCL send/recv between GPU pairs", size, cells, unit)


def sweep(doc: dict) -> str:
    points = sorted((int(r["size_bytes"]), float(r["measured"])) for r in doc["records"]
                    if r["check"] == SWEEP and numeric(r.get("size_bytes"))
                    and numeric(r["measured"]))
    if not points:
        return ""
    return svg.lines("NCCL all_reduce bus bandwidth by message size",
                     [svg.Series("busbw", points)], x_unit="message size", y_unit="GB/s",
                     log_x=True, x_label=svg.size_label)


def samples(doc: dict) -> str:
    rows = [s for s in doc.get("samples") or [] if isinstance(s, dict) and numeric(s.get("t"))]
    fields = sorted({k for s in rows for k, v in s.items() if k not in ("t", "gpu")
                     and numeric(v)})
    out = []
    for name in fields:
        by_gpu: dict[str, list[tuple[float, float]]] = {}
        for s in rows:
            if numeric(s.get(name)):
                by_gpu.setdefault(f"gpu{s.get('gpu')}", []).append((float(s["t"]),
                                                                      float(s[name])))
        series = [svg.Series(gpu, sorted(pts)) for gpu, pts in sorted(by_gpu.items())]
        out.append(svg.lines(f"burn-in: {name}", series, x_unit="s", y_unit="", height=180))
    return "".join(out)


PHASES = (("container_s", "container"), ("startup_s", "start-up"),
          ("rendezvous_s", "rendezvous"), ("collectives_s", "collectives"))


def timeline(doc: dict) -> str:
    """The agent's children (their checks in order, as recorded), or a multi-node run's phases."""
    timings = doc.get("timings")
    if isinstance(timings, list) and timings:
        return _phases(timings)
    walls = doc.get("children_wall_s") or {}
    if isinstance(walls, dict) and walls:
        return _children(walls, doc.get("timeline") or {})
    timings = (doc.get("facts") or {}).get("timings") or {}
    phases = [(label, timings[k]) for k, label in PHASES if numeric(timings.get(k))]
    if not phases:
        return ""
    items, start = [], 0.0
    for label, secs in phases:
        items.append(svg.Bar(label, start, float(secs), "phase", f"{label}: {fmt(secs)} s"))
        start += float(secs)
    return svg.bars("Where the time went (phases in order)", [p for p, _s in phases], items)


def _phases(timings: list) -> str:
    """The agent's ``timings``: each phase of each process where it ran, waits included."""
    rows = [t for t in timings if isinstance(t, dict) and numeric(t.get("start_s"))
            and numeric(t.get("seconds"))]
    names = sorted({str(t.get("child") or "agent") for t in rows}, key=_child_order)
    items = [svg.Bar(str(t.get("child") or "agent"), float(t["start_s"]), float(t["seconds"]),
                     "check" + (" alt" if i % 2 else ""),
                     f"{t.get('name', '?')}: {fmt(t['seconds'])} s from {fmt(t['start_s'])} s")
             for i, t in enumerate(rows)]
    return svg.bars("Processes: each phase where it ran (wall time)", names, items)


def _children(walls: dict, lines: dict) -> str:
    names = sorted(walls, key=_child_order)
    items = []
    for name in names:
        start = 0.0
        for i, step in enumerate(lines.get(name) or []):
            if not (isinstance(step, list) and len(step) == 2 and numeric(step[1])):
                continue
            check = str(step[0]).split(":", 1)[-1]  # "gpu3:gpu.hbm_copy": the row names gpu3
            items.append(svg.Bar(name, start, float(step[1]), "check" + (" alt" if i % 2 else ""),
                                 f"{check}: {fmt(step[1])} s"))
            start += float(step[1])
        rest = float(walls[name]) - start if numeric(walls[name]) else 0.0
        if rest > 0:
            items.append(svg.Bar(name, start, rest, "rest", f"{name}: {fmt(rest)} s in start-up "
                                 f"and checks under 0.05 s (of {fmt(walls[name])} s)"))
    return svg.bars("Child processes: their checks in order (wall time)", names, items)


def _child_order(name: str) -> tuple[int, int, str]:
    kind = name.rstrip("0123456789")
    digits = name[len(kind):]
    order = {"agent": 0, "monitor": 1, "discover": 2, "gpu": 3, "nccl": 4}
    return (order.get(kind, 5), int(digits or 0), name)


def records(doc: dict) -> str:
    """Every check by target: a matrix of values (a cell's colour is its verdict), then the
    records that did not pass, in full."""
    targets = sorted({r["target"] for r in doc["records"] if r["scope"] != "pair"},
                     key=lambda t: (t != "host", len(t), t))
    by_check: dict[str, dict[str, dict]] = {}
    for r in doc["records"]:
        if r["scope"] != "pair":
            by_check.setdefault(r["check"], {})[r["target"]] = r
    head = "".join(f"<th>{escape(t)}</th>" for t in targets)
    rows = []
    for check, recs in by_check.items():
        first = next(iter(recs.values()))
        cells = "".join(_matrix_cell(recs.get(t)) for t in targets)
        rows.append(f"<tr><td>{escape(check)}</td><td>{escape(first['unit'] or '')}</td>"
                    f'<td class="num">{escape(fmt(first["limit"]))}</td>{cells}</tr>')
    matrix = (f'<table class="sortable matrix"><thead><tr><th>check</th><th>unit</th>'
              f"<th>limit</th>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")
    cols = [Col("target"), Col("check"), Col("measured", True), Col("unit"), Col("limit", True),
            Col("expected", True), Col("verdict"), Col("hint"), Col("detail")]
    rest = [(f"v-{r['verdict']}", [r["target"], r["check"], r["measured"], r["unit"],
                                   r["limit"], r["expected"], r["verdict"].upper(), r["hint"],
                                   r["detail"]])
            for r in doc["records"] if r["verdict"] != "pass"]
    listed = ("<h3>Records not passed</h3>" + table(cols, rest, cls="records")) if rest else ""
    return f'<h3>Every check</h3><div class="scroll">{matrix}</div>{listed}'


def _matrix_cell(r: dict | None) -> str:
    if r is None:
        return "<td></td>"
    shown = fmt(r["measured"]) if r["measured"] is not None else r["verdict"]
    return f'<td class="num v-{escape(r["verdict"])}">{escape(shown)}</td>'


def sections(docs: Sequence[dict], outcomes: Sequence[str],
             skip: Container[int] = ()) -> str:
    """Every host's section but those in ``skip`` (on pages of their own); a small run opens
    the sections of hosts with trouble."""
    small = len(docs) <= 50
    return "".join(section(i, d, v, open_=small and v != "pass")
                   for i, (d, v) in enumerate(zip(docs, outcomes, strict=True)) if i not in skip)
