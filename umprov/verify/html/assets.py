"""The page's style and script, inlined into every report (no network, ever)."""

# Content-Security-Policy: nothing may load from anywhere; only the inline style and script run.
CSP = ("default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
       "img-src data:; base-uri 'none'; form-action 'none'")

CSS = """
:root { color-scheme: light dark;
  --bg: #ffffff; --fg: #1d232a; --muted: #5f6b77; --line: #d7dde3; --panel: #f5f7f9;
  --pass: #2e8b57; --warn: #c98a00; --fail: #d03a2f; --skip: #9aa5b1; --accent: #2f6fb3; }
@media (prefers-color-scheme: dark) {
  :root { --bg: #15191e; --fg: #e3e8ee; --muted: #9aa6b2; --line: #343c45; --panel: #1d232a;
    --pass: #4cc38a; --warn: #f0b429; --fail: #ff6b5e; --skip: #6b7682; --accent: #6ea8fe; } }
* { box-sizing: border-box; }
body { margin: 0 auto; max-width: 1180px; padding: 16px 24px 48px; background: var(--bg);
  color: var(--fg); font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; }
h1 { font-size: 22px; margin: 8px 0 4px; } h3 { font-size: 15px; margin: 16px 0 6px; }
h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid var(--line);
  padding-bottom: 4px; }
a { color: var(--accent); } .muted, .note { color: var(--muted); } .note { font-size: 12px; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; margin: 12px 0; }
.card { background: var(--panel); border: 1px solid var(--line); border-radius: 6px;
  padding: 8px 14px; min-width: 110px; } .card b { display: block; font-size: 22px; }
.chip { display: inline-block; padding: 0 7px; border-radius: 9px; font-size: 12px;
  font-weight: 600; color: #fff; background: var(--skip); }
.chip.v-pass { background: var(--pass); } .chip.v-fail { background: var(--fail); }
.chip.v-warn { background: var(--warn); color: #1d232a; }
.chip.v-unreachable { background: var(--fail); }
table { border-collapse: collapse; width: 100%; margin: 6px 0 12px; font-size: 13px; }
th, td { text-align: left; padding: 3px 8px; border-bottom: 1px solid var(--line);
  vertical-align: top; }
th { background: var(--panel); position: sticky; top: 0; }
table.sortable th { cursor: pointer; user-select: none; }
th[aria-sort=ascending]::after { content: " \\25B2"; }
th[aria-sort=descending]::after { content: " \\25BC"; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.v-fail td:first-child { border-left: 3px solid var(--fail); }
tr.v-warn td:first-child { border-left: 3px solid var(--warn); }
table.matrix td.v-fail { background: color-mix(in srgb, var(--fail) 30%, transparent); }
table.matrix td.v-warn { background: color-mix(in srgb, var(--warn) 30%, transparent); }
table.matrix td.v-skip { color: var(--muted); }
table.matrix { font-size: 12px; width: auto; } table.matrix td { padding: 2px 6px; }
.scroll { overflow-x: auto; }
td.detail { max-width: 460px; overflow-wrap: anywhere; }
details.host { border: 1px solid var(--line); border-radius: 6px; margin: 8px 0; padding: 0 12px; }
details.host > summary { cursor: pointer; padding: 8px 0; font-weight: 600; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 6px 0; }
dl.facts dt { color: var(--muted); } dl.facts dd { margin: 0; }
ul.action { padding-left: 18px; } ul.action li { margin: 2px 0; }
svg.chart { display: block; max-width: 100%; height: auto; margin: 6px 0 10px; color: var(--fg);
  font: 11px system-ui, sans-serif; }
svg .chart-title { font-weight: 600; fill: var(--fg); } svg text { fill: var(--fg); }
svg .tick { fill: var(--muted); } svg .small { font-size: 9px; }
svg .axis { stroke: var(--muted); stroke-width: 1; }
svg .grid { stroke: var(--line); stroke-width: 1; }
svg .dot.v-pass { fill: var(--pass); fill-opacity: .55; } svg .dot.v-warn { fill: var(--warn); }
svg .dot.v-fail { fill: var(--fail); } svg .dot.v-skip { fill: var(--skip); }
svg .hist { fill: var(--pass); fill-opacity: .5; }
svg .label.v-fail { fill: var(--fail); font-weight: 600; } svg .label.v-warn { fill: var(--warn); }
svg .pass-line { stroke: var(--pass); stroke-width: 2; }
svg .warn-line { stroke: var(--warn); stroke-width: 2; stroke-dasharray: 6 3; }
svg .expected-line { stroke: var(--muted); stroke-width: 1.5; stroke-dasharray: 2 3; }
svg .median-line { stroke: var(--muted); stroke-width: 1.5; stroke-dasharray: 4 3; }
svg .pair rect { stroke: var(--bg); stroke-width: 1; }
svg .pair.v-warn rect { stroke: var(--warn); stroke-width: 3; }
svg .pair.v-fail rect { stroke: var(--fail); stroke-width: 3; }
svg .cell { fill: #101418; font-size: 10px; }
svg .line { fill: none; stroke-width: 1.8; } svg .bar { stroke: var(--bg); stroke-width: .5; }
svg .regressed { stroke: var(--fail); } svg .pt.regressed { fill: var(--fail); }
svg .bar.check { fill: var(--accent); } svg .bar.check.alt { fill-opacity: .6; }
svg .bar.rest { fill: var(--skip); fill-opacity: .45; } svg .bar.phase { fill: var(--accent); }
.series-0 { stroke: #2f6fb3; fill: #2f6fb3; } .series-1 { stroke: #d9822b; fill: #d9822b; }
.series-2 { stroke: #2e8b57; fill: #2e8b57; } .series-3 { stroke: #b03a8c; fill: #b03a8c; }
.series-4 { stroke: #6f5bd0; fill: #6f5bd0; } .series-5 { stroke: #8a6d3b; fill: #8a6d3b; }
.series-6 { stroke: #1f9aa5; fill: #1f9aa5; } .series-7 { stroke: #c0392b; fill: #c0392b; }
svg text.legend { stroke: none; }
@media print {
  body { max-width: none; padding: 0; font-size: 11px; } th { position: static; }
  details.host { break-inside: avoid-page; } svg.chart { break-inside: avoid; }
  a { color: inherit; text-decoration: none; } }
"""

# Sortable tables in a few lines: click a header; numbers sort as numbers (data-v when given).
# Before printing, every collapsed host opens so paper shows it all.
JS = """
(function () {
  function key(td) { var v = td.getAttribute('data-v'); var t = v === null ? td.textContent : v;
    var n = parseFloat(t); return isNaN(n) || !/^\\s*-?[0-9.]/.test(t) ? t.toLowerCase() : n; }
  function sort(th) {
    var table = th.closest('table'), body = table.tBodies[0], i = th.cellIndex;
    var dir = th.getAttribute('aria-sort') === 'ascending' ? -1 : 1;
    Array.prototype.forEach.call(th.parentNode.cells,
      function (c) { c.removeAttribute('aria-sort'); });
    th.setAttribute('aria-sort', dir > 0 ? 'ascending' : 'descending');
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) { var x = key(a.cells[i]), y = key(b.cells[i]);
      if (typeof x !== typeof y) { x = String(x); y = String(y); }
      return (x < y ? -1 : x > y ? 1 : 0) * dir; });
    rows.forEach(function (r) { body.appendChild(r); });
  }
  document.addEventListener('click', function (ev) {
    var th = ev.target.closest && ev.target.closest('table.sortable th');
    if (th) { sort(th); } });
  window.addEventListener('beforeprint', function () {
    document.querySelectorAll('details').forEach(function (d) { d.open = true; }); });
})();
"""
