"""The HTML report of a large fleet: render time and size, and opening it in headless chromium.

    .venv/bin/python bench/report_bench.py [--hosts 1000] [--gpus 8] [--repeat 3]

Host documents as the agent writes them (tests/fleet_docs.py: full-mode H200 hosts, 8 GPUs,
28 pairs, child timelines; three hosts with planted trouble). Baselines measured in the same
run: json.dumps of the same run document (what `umprov verify --json` prints) against
html.write (the report and the passing hosts' own pages) and against html.render of every host
on one page (the report before issue 30); chromium loading a trivial page against chromium
loading the report (both to --dump-dom and to a screenshot, through the same flags). Also
the history's cost on every verify run: saving the run's host documents (gzip, one file per
host, then pruning) and `umprov report` reading them back into trends, then its report.
Results: bench/results/report.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _common import save  # noqa: E402

from tests import fleet_docs  # noqa: E402
from tests.browser.conftest import CANDIDATES, Chromium  # noqa: E402
from umprov.verify import history, html  # noqa: E402
from umprov.verify.report import run_document  # noqa: E402


def timed(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times), 3), out


def browser(binary: str, work: Path, page: Path, repeat: int) -> dict:
    """Seconds to the dumped DOM (load, scripts, serialising it) and to a screenshot of the
    first 1280x1600 pixels (load, layout, paint: what a person waits for)."""
    chrome = Chromium(binary, work)
    secs, run = timed(lambda: chrome.run(page), repeat)
    shot = work / f"{page.stem}.png"
    shot_s, _ = timed(lambda: chrome.screenshot(page, shot, size="1280,1600"), repeat)
    return {"dump_dom_s": secs, "screenshot_s": shot_s, "dom_bytes": len(run.dom),
            "page_requests": run.page_requests}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    docs = fleet_docs.fleet(args.hosts, gpus=args.gpus)
    run = run_document(docs, 60.0)
    json_s, text = timed(lambda: json.dumps(run), args.repeat)
    inline_s, page_text = timed(lambda: html.render(docs, seconds=60.0), args.repeat)
    result = {
        "hosts": args.hosts, "gpus_per_host": args.gpus,
        "records": sum(len(d["records"]) for d in docs),
        "baseline_json_dumps_s": json_s, "json_mib": round(len(text) / 2**20, 1),
        "one_page_render_s": inline_s, "one_page_mib": round(len(page_text) / 2**20, 1),
    }
    binary = next((b for b in map(shutil.which, CANDIDATES) if b), None)
    with tempfile.TemporaryDirectory(prefix="umprov-report-bench-") as tmp:
        work = Path(tmp)
        page = work / "report.html"
        write_s, _ = timed(lambda: html.write(page, docs, seconds=60.0), args.repeat)
        pages = sorted((work / "report.hosts").glob("*.html"))
        result.update(
            write_s=write_s, page_mib=round(page.stat().st_size / 2**20, 2),
            host_pages=len(pages), host_pages_mib=round(sum(p.stat().st_size for p in pages)
                                                        / 2**20, 1),
            ratio_write_to_json_dumps=round(write_s / json_s, 2))
        if binary:
            trivial = work / "trivial.html"
            trivial.write_text("<!doctype html><title>t</title><p>hello</p>")
            base = browser(binary, work, trivial, args.repeat)
            big = browser(binary, work, page, args.repeat)
            one = browser(binary, work, pages[0], 1) if pages else {}
            result.update(baseline_chromium_trivial=base, chromium_report=big,
                          chromium_host_page=one,
                          ratio_dump_dom_to_trivial=round(big["dump_dom_s"] / base["dump_dom_s"],
                                                          1),
                          ratio_screenshot_to_trivial=round(big["screenshot_s"]
                                                            / base["screenshot_s"], 1),
                          written_and_opened_s=round(write_s + big["screenshot_s"], 2))
        else:
            result["chromium"] = "not installed: apt-get install chromium"
        root = work / "history"
        keep = history.Retention(3650, 1 << 34, 1000)
        save_s, _ = timed(lambda: history.save(docs, root=root, retention=keep), args.repeat)
        load_s, entries = timed(lambda: history.load(root=root), 1)
        trend_s, trends = timed(lambda: history.trends(entries), 1)
        with_trends = work / "trends.html"
        trends_write_s, _ = timed(lambda: html.write(with_trends, history.latest_docs(entries),
                                                     trends=trends), args.repeat)
        if binary:  # the trends report and one host's page with its trends, opened
            trend_pages = sorted((work / "trends.hosts").glob("*.html"))
            opened = browser(binary, work, with_trends, args.repeat)
            result.update(chromium_trends_report=opened,
                          chromium_trends_host_page=browser(binary, work, trend_pages[0], 1),
                          trends_written_and_opened_s=round(trends_write_s
                                                            + opened["screenshot_s"], 2))
        result.update(history_save_run_s=save_s, history_load_s=load_s,
                      history_trends_s=trend_s, history_runs_read=len(entries),
                      history_mib_per_run=round(sum(p.stat().st_size for p in root.rglob(
                          "*.json.gz")) / args.repeat / 2**20, 1),
                      report_with_trends_write_s=trends_write_s,
                      report_with_trends_page_mib=round(with_trends.stat().st_size / 2**20, 2))
    save("report", result)


if __name__ == "__main__":
    main()
