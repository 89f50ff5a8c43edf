"""The fleet at a glance: hosts by verdict, what needs action first, software versions, and
every figure across every GPU of every host (one strip per check, outliers named)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from html import escape

from umprov.verify.agent.schema import REMEDIES
from umprov.verify.html import svg
from umprov.verify.html.parts import (
    ORDER,
    Col,
    devices,
    host_anchor,
    link,
    plotted,
    ref_lines,
    table,
    versions,
)
from umprov.verify.report import outcome


def verdicts(docs: Sequence[dict]) -> list[str]:
    """Each host's outcome as every command names it: pass, warn, fail or unreachable."""
    return [outcome(d).state for d in docs]


def cards(docs: Sequence[dict], seconds: float | None) -> str:
    counts = Counter(verdicts(docs))
    items = [("hosts", len(docs)), ("GPUs", sum(len(devices(d)) for d in docs))]
    items += [(v, counts[v]) for v in ("fail", "unreachable", "warn", "pass") if counts[v]]
    if seconds is not None:
        items.append(("run time, s", f"{seconds:.1f}"))
    return '<div class="cards">' + "".join(
        f'<div class="card v-{escape(name)}"><b>{escape(str(value))}</b>{escape(name)}</div>'
        for name, value in items) + "</div>"


def problems(docs: Sequence[dict]) -> list[tuple[int, dict, dict]]:
    """(host index, doc, record) of every failing then warning record."""
    found = [(i, d, r) for i, d in enumerate(docs) for r in d["records"]
             if r["verdict"] in ("fail", "warn")]
    return sorted(found, key=lambda x: (ORDER[x[2]["verdict"]], x[1]["host"], x[2]["target"]))


def needs_action(docs: Sequence[dict]) -> str:
    """One line per GPU, pair or host with a failing or warning check, the failing ones first,
    named, with the remedies the checks hint at. Slow pairs that share one GPU are that GPU's."""
    per_host: dict[int, list[dict]] = {}
    for i, _doc, rec in problems(docs):
        per_host.setdefault(i, []).append(rec)
    seen: dict[tuple[int, str], list[tuple[dict, str]]] = {}
    for i, recs in per_host.items():
        for target, rec, what in _attributed(recs):
            seen.setdefault((i, target), []).append((rec, what))
    if not seen:
        return '<p class="muted">Every check passed on every host.</p>'
    items = []
    for (i, target), found in sorted(seen.items(), key=lambda kv: (
            ORDER[min((r["verdict"] for r, _w in kv[1]), key=ORDER.get)], kv[0])):
        worst = escape(min((r["verdict"] for r, _w in found), key=ORDER.get))
        hints = list(dict.fromkeys(r["hint"] for r, _w in found if r["hint"]))
        checks = ", ".join(dict.fromkeys(what for _r, what in found))
        items.append(
            f'<li class="v-{worst}"><span class="chip v-{worst}">{worst.upper()}</span> '
            f'<a href="#{host_anchor(i)}"><b>{escape(docs[i]["host"])}</b></a> '
            f"<b>{escape(target)}</b>: {escape(checks)} <span class=muted>({remedy(hints)})"
            "</span></li>")
    return f'<ul class="action">{"".join(items)}</ul>'


def remedy(hints: list[str]) -> str:
    """'hint: config, a setting to fix: ...' for each hint, escaped; 'no hint' for none."""
    said = [f"hint: {h}, {REMEDIES[h]}" if h in REMEDIES else f"hint: {h}" for h in hints]
    return escape("; ".join(said) or "no hint")


def _attributed(recs: list[dict]) -> list[tuple[str, dict, str]]:
    """(target, record, what to call it): a check whose every problem pair shares one GPU is
    put on that GPU ("nccl.send_recv with gpu0, gpu1"), other records stay on their target."""
    out = []
    pairs: dict[str, list[dict]] = {}
    for r in recs:
        if r["scope"] == "pair" and r.get("gpu") is not None and r.get("peer") is not None:
            pairs.setdefault(r["check"], []).append(r)
        else:
            out.append((r["target"], r, r["check"]))
    for check, group in pairs.items():
        counts = Counter(g for r in group for g in (r["gpu"], r["peer"]))
        common = [g for g, n in counts.items() if n == len(group)]
        if len(group) > 1 and len(common) == 1:
            others = sorted(g for r in group for g in (r["gpu"], r["peer"]) if g != common[0])
            what = f"{check} with " + ", ".join(f"gpu{g}" for g in others)
            out += [(f"gpu{common[0]}", r, what) for r in group]
        else:
            out += [(r["target"], r, r["check"]) for r in group]
    return out


def problem_table(docs: Sequence[dict]) -> str:
    cols = [Col("verdict"), Col("host"), Col("target"), Col("check"), Col("measured", True),
            Col("unit"), Col("limit", True), Col("hint"), Col("detail")]
    rows = ((f"v-{r['verdict']}", [r["verdict"].upper(), link(host_anchor(i), d["host"]),
                                   r["target"], r["check"], r["measured"], r["unit"],
                                   r["limit"], r["hint"], r["detail"]])
            for i, d, r in problems(docs))
    found = list(rows)
    if not found:
        return '<p class="muted">None: no check failed or warned.</p>'
    return table(cols, found, cls="problems")


def host_table(docs: Sequence[dict], pages: dict[int, str] | None = None) -> str:
    """Every host, the worst first; a host whose section is a page of its own (``pages``: host
    index to its address) links there."""
    pages = pages or {}
    cols = [Col("host"), Col("verdict"), Col("fail", True), Col("warn", True), Col("pass", True),
            Col("skip", True), Col("GPUs", True), Col("profile"), Col("mode"),
            Col("wall s", True), Col("started")]
    rows = []
    for i, (doc, verdict) in enumerate(zip(docs, verdicts(docs), strict=True)):
        s = doc["summary"]
        gpus = len(devices(doc))
        rows.append((f"v-{verdict}", [link(host_anchor(i), doc["host"], pages.get(i)),
                                      verdict.upper(),
                                      s["fail"], s["warn"], s["pass"], s["skip"], gpus,
                                      doc["profile"], doc["mode"], doc["wall_s"],
                                      doc["started"]]))
    rows.sort(key=lambda r: ORDER.get(str(r[1][1]).lower(), 9))  # stable: by name within
    return table(cols, rows, cls="hosts")


def software_table(docs: Sequence[dict], *, names: int = 8) -> str:
    """Hosts grouped by their software versions: the odd driver shows as a small group."""
    keys = ["driver", "CUDA (driver)", "CUDA runtime", "torch", "NCCL"]
    groups: dict[tuple[str, ...], list[str]] = {}
    for doc in docs:
        facts = versions(doc)
        groups.setdefault(tuple(facts.get(k, "") for k in keys), []).append(doc["host"])
    cols = [Col(k) for k in keys] + [Col("hosts", True), Col("which")]
    rows = []
    for group, hosts in sorted(groups.items(), key=lambda g: len(g[1])):
        which = ", ".join(hosts[:names]) + (f" and {len(hosts) - names} more"
                                             if len(hosts) > names else "")
        rows.append(("", [*group, len(hosts), which]))
    return table(cols, rows, cls="software")


def strips(docs: Sequence[dict]) -> str:
    """Per check, a dot for each GPU (or pair, or host) of the fleet against its lines."""
    by_check: dict[str, list[tuple[dict, dict]]] = {}
    for doc in docs:
        for rec in doc["records"]:
            if plotted(rec) and "size_bytes" not in rec:  # sweep points: per host, by size
                by_check.setdefault(rec["check"], []).append((doc, rec))
    out = []
    for check in sorted(by_check, key=_check_order):
        pairs = by_check[check]
        dots = [svg.Dot(float(r["measured"]), r["verdict"], _who(d, r, len(docs)),
                        f"{d['host']} {r['target']}: {r['measured']} {r['unit']} "
                        f"({r['verdict']})") for d, r in pairs]
        lines = _common_lines(pairs)
        unit = pairs[0][1]["unit"] or ""
        out.append(svg.strip(check, unit, dots, lines))
    return "".join(out) or '<p class="muted">No figures were measured.</p>'


def _who(doc: dict, rec: dict, hosts: int) -> str:
    return rec["target"] if hosts == 1 else f"{doc['host']} {rec['target']}"


def _check_order(check: str) -> tuple[int, str]:
    family = check.split(".")[0]
    return ({"gpu": 0, "pcie": 1, "managed": 2, "nccl": 3}.get(family, 4), check)


def _common_lines(pairs: list[tuple[dict, dict]]) -> list[tuple[float, str, str]]:
    """Each distinct line once (profiles may differ between hosts)."""
    seen: dict[tuple[float, str], str] = {}
    for doc, rec in pairs:
        for value, cls, name in ref_lines(doc["profile"], rec):
            seen.setdefault((value, cls), f"{name} ({doc['profile']})")
    return [(v, c, n) for (v, c), n in seen.items()][:9]
