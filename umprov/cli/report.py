"""`umprov report`: a verify run as an HTML page, or each host's figures against its history."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from umprov.cli.options import inventory_options, json_option

if TYPE_CHECKING:
    from umprov.inventory import InventoryRequest
from umprov.output import emit_json, say

SPARK = "▁▂▃▄▅▆▇█"


class Age(click.ParamType):
    name = "AGE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None
                ) -> float:
        from umprov.verify.history import parse_age

        try:
            return value if isinstance(value, float) else parse_age(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


@click.command()
@click.argument("sources", nargs=-1, metavar="[INVENTORY_OR_RUN_JSON...]")
@click.option("--since", type=Age(), metavar="AGE",
              help="History from this far back: 30d, 12h, 2w (default: all that is kept).")
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path),
              metavar="FILE", help="Write the report as one self-contained HTML page.")
@inventory_options(positional=False)
@json_option
def report(sources: tuple[str, ...], since: float | None, html_path: Path | None,
           as_json: bool, inventory: InventoryRequest) -> int:
    """Show verify results: a run's files as a page, or each host's trends and regressions.

    With run files (`umprov verify --json` output, *.json): their hosts as a table, the run
    as JSON (--json) or as an HTML page (--html). With an INVENTORY, or nothing: the history
    every `umprov verify` keeps, per host (all hosts on record when no inventory is given):
    the trend of each figure, and a flag where a figure is 8 % worse than the median of the
    host's last runs, even where it still passes its profile. Exit code 12 when a figure
    regressed, 0 otherwise.

    \b
    umprov report run.json --html run.html      a run as a page
    umprov report hosts --since 30d             trends and regressions of the last 30 days
    umprov report --json                        every host on record, as data
    """
    from umprov.cli.outputs import check_writable
    from umprov.errors import ConfigError, ExitCode, UmprovError

    check_writable("--html", html_path)
    run_files = [s for s in sources if s.endswith(".json")]
    inventory = replace(inventory, sources=tuple(s for s in sources if not s.endswith(".json"))
                        + inventory.sources)
    if run_files and inventory.sources:
        raise UmprovError("give run files (*.json) or an INVENTORY, not both",
                          exit_code=ExitCode.USAGE)
    if run_files:
        if since is not None:
            raise ConfigError("--since reads the history; run files are shown whole")
        return show_runs([Path(p) for p in run_files], html_path, as_json)
    return show_history(inventory if inventory.sources else None, since, html_path, as_json)


def show_runs(paths: list[Path], html_path: Path | None, as_json: bool) -> int:
    from umprov.verify import report as verify_report

    docs = [doc for path in paths for doc in verify_report.read_run(path)]
    if as_json:
        emit_json(verify_report.run_document(docs, 0.0))
    if html_path:
        write_page(html_path, docs)
    else:
        verify_report.print_report(docs, all_rows=False)
    return 0


def write_page(html_path: Path, docs: list[dict], **page: Any) -> None:
    """--html, written after what goes to stdout and the terminal; a failure is a ConfigError."""
    from umprov.cli.outputs import ReportFile, write_files
    from umprov.verify import html

    write_files([ReportFile("--html", html_path, "HTML", lambda p: html.write(p, docs, **page))])


def show_history(inventory: InventoryRequest | None, since: float | None, html_path: Path | None,
                 as_json: bool) -> int:
    from umprov.errors import ExitCode
    from umprov.verify import history

    hosts = None
    if inventory is not None:
        from umprov.inventory import load_inventory

        hosts = [h.name for h in load_inventory(inventory).select(None)]
    filed = history.file_inbox()
    if filed:
        say(f"filed {filed} report(s) of playbooks/verify.yml from {history.inbox_dir()}")
    entries = history.load(since=since, hosts=hosts)
    trends = history.trends(entries)
    if as_json:
        emit_json(history.to_json(trends, since=since))
    print_trends(trends, hosts)
    if html_path:
        write_page(html_path, history.latest_docs(entries), trends=trends,
                   title=f"umprov report: {len(trends)} host(s)")
    return ExitCode.VERIFY_WARN if any(t.regressions for t in trends) else ExitCode.OK


def spark(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return "".join(SPARK[0 if hi == lo else round((v - lo) / (hi - lo) * 7)] for v in values)


def on_record(trend: Any) -> str:
    """'3 runs on record, the last 2026-12-04T10:31:00Z' for a host's history."""
    from umprov.verify.history import iso

    runs = len(trend.saved)
    return f"{runs} run{'s' if runs != 1 else ''} on record, the last {iso(max(trend.saved))}"


def print_trends(trends: list[Any], hosts: list[str] | None) -> None:
    from umprov.output import print_table
    from umprov.verify.history import root_dir
    from umprov.verify.html.parts import fmt

    missing = sorted(set(hosts or []) - {n for t in trends for n in t.names})
    if not trends:
        say(f"umprov: no verify history in {root_dir()} for this selection "
            "(every umprov verify run adds to it)")
    rows = [[t.host, f.target, f.check, f.unit or "", len(f.points),
             spark([v for _t, v in f.points][-16:]), fmt(f.median), fmt(f.latest),
             "" if f.change is None else f"{f.change * 100:+.1f} %",
             "REGRESSION" if f.regressed else ""]
            for t in trends for f in t.figures if f.direction]
    if rows:
        print_table(f"trends: {len(trends)} host(s)", ["host", "target", "check", "unit", "runs",
                    "trend", "median", "latest", "change", "flag"], rows)
    for t in trends:
        if not any(f.direction for f in t.figures):
            say(f"{t.host}: {on_record(t)}, no figure to trend (none of GB/s, TFLOP/s, seconds: "
                "a host without a GPU reports none)")
    for t in trends:
        for f in t.regressions:
            side = "below" if f.direction == "higher" else "above"
            say(f"REGRESSION {t.host} {f.target} {f.check}: {fmt(f.latest)} {f.unit or ''}, "
                f"{abs(f.change or 0) * 100:.1f} % {side} its median {fmt(f.median)} of the "
                f"runs before")
    if missing:
        say(f"umprov: no history for {', '.join(missing)}")
