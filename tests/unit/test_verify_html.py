"""The HTML report: escaped, self-contained, and showing what the host documents hold."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from tests import fleet_docs
from umprov.errors import ConfigError
from umprov.verify import html, report
from umprov.verify.agent.schema import host_report, record
from umprov.verify.history import FigureTrend, HostTrend


@pytest.fixture(scope="module")
def three() -> list[dict]:
    return [fleet_docs.healthy_pair(), fleet_docs.failing_gpu_host(), fleet_docs.no_gpu_host()]


@pytest.fixture(scope="module")
def page(three) -> str:
    return html.render(three, seconds=21.5)


class Tags(HTMLParser):
    """Every start tag with its attributes, and the text under each <li>."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.items: list[str] = []
        self._li: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "li":
            self._li = []

    def handle_endtag(self, tag):
        if tag == "li" and self._li is not None:
            self.items.append(" ".join("".join(self._li).split()))
            self._li = None

    def handle_data(self, data):
        if self._li is not None:
            self._li.append(data)


def parse(text: str) -> Tags:
    tags = Tags()
    tags.feed(text)
    return tags


def section(page: str, heading: str) -> str:
    start = page.index(f"<h2>{heading}")
    end = page.find("<h2>", start + 4)
    return page[start:end if end > 0 else None]


def test_every_text_from_hosts_and_inventories_is_escaped():
    evil = '<script>alert(1)</script>"><img src=x onerror=alert(2)>'
    doc = fleet_docs.gpu_host("gpu-x", gpus=2)
    doc["host"] = "h&<b>" + evil
    doc["facts"]["discover"]["torch"] = evil
    doc["records"][0].update(verdict="fail", hint="reset", detail=evil, measured=evil)
    doc["records"][0]["check"] = "gpu.<i>odd</i>"
    doc["samples"] = [{"t": 0, "gpu": evil, "temp_c": 40}, {"t": 1, "gpu": evil, "temp_c": 41}]
    out = html.render([doc], title=evil)
    assert "<script>alert" not in out and "<img" not in out and "<i>odd" not in out
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&quot;&gt;&lt;img src=x" in out
    assert "h&amp;&lt;b&gt;" in out
    tags = parse(out)
    assert [t for t, _a in tags.tags if t == "script"] == ["script"]  # only the page's own
    assert not [a for t, a in tags.tags if t == "img" or "onerror" in a]


def test_heat_map_has_one_cell_per_pair(three):
    doc = three[1]  # 8 GPUs: 28 pairs
    pairs = sorted(r["target"] for r in doc["records"] if r["scope"] == "pair")
    out = html.render([doc])
    cells = sorted(a["data-pair"] for t, a in parse(out).tags if "data-pair" in a)
    assert len(pairs) == 28 and cells == pairs
    slow = [a for t, a in parse(out).tags if a.get("data-pair", "").endswith("gpu5")]
    assert slow and all("v-fail" in a["class"] for a in slow)


def test_the_failing_gpu_is_named_in_the_overview(page):
    items = parse(section(page, "Needs action")).items
    assert items[0].startswith("FAIL")
    gpu = [i for i in items if "h200-b gpu5" in i]
    assert len(gpu) == 1 and "gpu.hbm_copy" in gpu[0] and "hint: reset, reset the GPU" in gpu[0]
    assert "nccl.send_recv with gpu0, gpu1, gpu2, gpu3, gpu4, gpu6, gpu7" in gpu[0]
    assert any("build-01 host" in i and "host.gpu_visible" in i for i in items)
    assert not any("h200-a" in i for i in items)  # the healthy host needs nothing


def test_failing_checks_come_first_with_their_hint(page):
    rows = re.findall(r'<tr class="v-(\w+)">', section(page, "Problems"))
    assert rows and rows == sorted(rows, key=lambda v: v != "fail")
    assert "gpu.hbm_copy" in section(page, "Problems") and ">reset<" in section(page, "Problems")


def test_the_page_fetches_nothing(page):
    refs = re.findall(r"""(?:src|href|action|xlink:href|poster|data)\s*=\s*["']?\s*([^"'\s>]+)""",
                      page, flags=re.I)
    assert refs and all(r.startswith("#") for r in refs), refs
    assert not re.search(r"https?://", page)
    assert not re.search(r"url\(|@import", page)
    assert "Content-Security-Policy" in page and "default-src 'none'" in page


def test_themes_printing_and_sorting_are_inline(page):
    assert "prefers-color-scheme: dark" in page and "@media print" in page
    assert "beforeprint" in page and "table.sortable th" in page
    assert page.count("<table class=\"sortable") >= 4


def test_sweep_and_samples_appear_only_where_recorded(three):
    with_them, without = html.render(three[:1]), html.render(three[1:2])
    assert "bus bandwidth by message size" in with_them and "MiB" in with_them
    for field in ("temp_c", "power_w", "sm_clock_mhz"):
        assert f"burn-in: {field}" in with_them
    assert "by message size" not in without and "burn-in" not in without


def test_timeline_of_the_agent_children_and_of_a_multinode_run(three):
    out = html.render(three[:1])
    assert "Child processes" in out
    for child in ("discover", "gpu0", "gpu1", "nccl0"):
        assert f">{child}</text>" in out
    assert "<title>gpu.hbm_copy: " in out  # a check of the recorded timeline, as a tooltip
    rec = record("host", "host", "multinode.busbw", "pass", measured=40.0, unit="GB/s")
    multi = host_report("n1", [rec], mode="multi-node", profile="internode", facts={
        "timings": {"container_s": 1.5, "startup_s": 4.0, "rendezvous_s": 0.8,
                    "collectives_s": 2.0, "torchrun_s": 7.1}})
    out = html.render([multi])
    assert "phases in order" in out and "rendezvous: 0.8 s" in out


def test_no_gpu_host_shows_why_and_no_charts(three):
    out = html.render(three[2:])
    assert "no NVIDIA GPU visible" in out and "data-pair" not in out
    assert "Child processes" in out  # its discover child ran
    assert "2.99.0+cpu" in out  # its facts


def test_software_versions_group_hosts(three):
    odd = fleet_docs.gpu_host("gpu-old", gpus=2, versions={**fleet_docs.VERSIONS,
                                                           "driver": "570.86.15"})
    out = section(html.render([*three[:2], odd]), "Software")
    assert "580.159.04" in out and "570.86.15" in out and "gpu-old" in out


def test_warn_and_pass_lines_follow_the_profile(three):
    out = html.render(three[1:2])
    strip = out[out.index("<title>gpu.hbm_copy: "):]
    strip = strip[:strip.index("</svg>")]
    assert "pass line (h200-sxm): 3630 GB/s" in strip  # 0.85 x 4270
    assert "warn line (fails below) (h200-sxm): 2989 GB/s" in strip  # 0.7 x 4270
    assert ">h200-b gpu5</text>" not in strip and ">gpu5</text>" in strip  # one host: no name


def test_a_fleet_outlier_stands_out_however_large_the_fleet():
    docs = fleet_docs.fleet(60, gpus=8)  # 480 GPUs a strip: the passing ones as a histogram
    out = html.render(docs)
    strip = out[out.index("<title>gpu.hbm_copy: "):]
    strip = strip[:strip.index("</svg>")]
    assert 'class="hist v-pass"' in strip
    assert strip.count("<circle") == 1 and ">gpu-017 gpu2</text>" in strip


def test_write_replaces_the_file_whole(tmp_path, three):
    path = tmp_path / "out" / "report.html"
    html.write(path, three)
    html.write(path, three[:1])
    assert path.read_text().startswith("<!doctype html>")
    assert [p.name for p in path.parent.iterdir()] == ["report.html"]


def test_an_empty_run_and_every_schema_shape_render():
    assert "0 host(s)" in html.render([])
    failed = report.failed_host_report("gone", "agent.connect", "unreachable: no route")
    out = html.render([failed])
    assert "UNREACHABLE" in out and "gone" in out


def test_a_recorded_h200_run_renders_every_figure_and_its_timeline():
    """A real full run of the agent on a 1-GPU H200 (bench/verify_h200.py, 2026-12-02): every
    figure it measured is plotted, its children's phases are on the timeline, nothing fails."""
    import json

    doc = json.loads((fleet_docs.DATA / "h200-1gpu-full.json").read_text())
    page = html.render([doc])
    tags = parse(page)
    assert doc["verdict"] == "pass" and "Every check passed on every host." in page
    measured = {r["check"] for r in doc["records"]
                if isinstance(r["measured"], (int, float)) and r["limit"] is not None}
    assert measured and all(check in page for check in measured)
    children = {t["child"] for t in doc["timings"] if t.get("child")}
    assert children and all(child in page for child in children)
    assert any(name == "svg" for name, _attrs in tags.tags)
    assert not re.search(r"(src|href)=\"https?:", page)


def test_every_hint_says_its_remedy_and_no_problem_is_said_as_none():
    """A page of healthy hosts says 'None' under Problems rather than a bare header, and each
    hint in Needs action comes with what to do ('hint: config, a setting to fix ...')."""
    from umprov.verify.agent.schema import HINTS, REMEDIES

    assert set(HINTS) == set(REMEDIES) and all(REMEDIES.values())
    healthy = html.render([fleet_docs.healthy_pair()])
    assert "None: no check failed or warned." in section(healthy, "Problems")
    no_gpu = html.render([fleet_docs.no_gpu_host()])
    assert f"hint: config, {REMEDIES['config']}" in section(no_gpu, "Needs action")


def test_hosts_are_in_the_order_of_their_names_whatever_order_they_finished():
    docs = [fleet_docs.gpu_host(name, gpus=1, seed=i) for i, name in enumerate("cab")]
    page = html.render(docs)
    table_order = re.findall(r'<a href="#host-\d+">([abc])</a>', section(page, "Hosts"))
    assert table_order == ["a", "b", "c"]
    assert page.index(">a<") < page.index(">b<") < page.index(">c<")


def test_a_multinode_hosts_software_comes_from_its_facts():
    """Multi-node host documents keep torch and NCCL at the top of their facts."""
    doc = host_report("n1", [record("host", "host", "multinode.allreduce", "pass")],
                      mode="multinode", profile="internode",
                      facts={"torch": "2.13.0", "nccl": "2.27.5", "backend": "nccl"})
    software = section(html.render([doc]), "Software")
    assert "2.13.0" in software and "2.27.5" in software


def test_the_shipped_sample_page_is_the_recorded_h200_run_rendered():
    """docs/examples/verify-h200.html: what the page shows with a GPU, for users without one;
    rendered from tests/data/verify/h200-1gpu-full.json (a real run), kept in step here."""
    import json
    from pathlib import Path

    def undated(page: str) -> str:
        return re.sub(r"Generated [^<]* by umprov", "Generated by umprov", page)

    doc = json.loads((fleet_docs.DATA / "h200-1gpu-full.json").read_text())
    sample = Path(__file__).resolve().parents[2] / "docs" / "examples" / "verify-h200.html"
    assert undated(sample.read_text()) == undated(html.render([doc])), (
        "re-render it: umprov report tests/data/verify/h200-1gpu-full.json --html "
        "docs/examples/verify-h200.html")


def _trend(name: str, regressed: bool) -> HostTrend:
    fig = FigureTrend("gpu0", "gpu.hbm_copy", "GB/s", [(1.0e9, 4200.0), (1.1e9, 3000.0)],
                      median=4200.0, change=-0.29, regressed=regressed)
    return HostTrend(f"key-{name}", [name], [1.0e9, 1.1e9], [fig])


def test_a_large_run_gives_each_passing_host_a_page_of_its_own(tmp_path):
    docs = fleet_docs.fleet(html.INLINE_HOSTS + 10)  # gpu-017, -023, -031 in trouble
    trends = [_trend(d["host"], d["host"] == "gpu-005") for d in docs]
    path = html.write(tmp_path / "verify.html", docs, trends=trends)
    main = path.read_text()
    folder = tmp_path / "verify.hosts"
    pages = sorted(p.name for p in folder.glob("*.html"))
    passing = [d["host"] for d in docs if report.outcome(d).state == "pass"]
    assert len(pages) == len(passing) == len(docs) - 3
    # the failing and warning hosts stay on the page, the passing ones are linked
    assert 'id="host-' in main and main.count('<details class="host v-pass"') == 0
    for name in pages:
        assert f'href="verify.hosts/{name}"' in main
    page = (folder / pages[0]).read_text()
    assert '<details class="host v-pass"' in page and " open>" in page
    assert 'href="../verify.html"' in page and "<h2>Trends</h2>" in page
    # a regressed host's trend stays on the page too; the others' are on their own pages
    trend_part = main[main.index("Trends: each host against its own history"):]
    assert "gpu-005" in trend_part and "gpu-006" not in trend_part


def test_a_small_run_keeps_every_host_on_one_page_and_removes_old_host_pages(tmp_path):
    big = fleet_docs.fleet(html.INLINE_HOSTS + 1, gpus=1)
    path = html.write(tmp_path / "verify.html", big)
    assert (tmp_path / "verify.hosts").is_dir()
    html.write(path, big[:3])
    assert not (tmp_path / "verify.hosts").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["verify.html"]


def test_a_folder_umprov_did_not_write_is_never_replaced(tmp_path):
    mine = tmp_path / "verify.hosts"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="verify.hosts exists and umprov did not write it"):
        html.write(tmp_path / "verify.html", fleet_docs.fleet(html.INLINE_HOSTS + 1, gpus=1))
    assert (mine / "notes.txt").read_text() == "keep me"
    assert not (tmp_path / "verify.html").exists()  # nothing half-written
